#!/usr/bin/env python
"""Evolution runs for the ledger benches: ``hx evolve`` made into a data dir, with its ledger crypto counted.

Used by ``audit_cost.py`` and ``ledger_signing.py``. ``make_run`` runs ``python -m hx evolve``
in a subprocess (the command as a user runs it) through this file's ``--count`` entry point,
which wraps ``ledger_digest``, ``LedgerKey.sign`` and ``verify`` with counters before hx is
imported, so a whole run's digest, signing and verification time is measured inside the
run, not estimated. Run directly, it is that entry point::

    python bench/evolve_runs.py --count OUT.json -- --data-dir D evolve --run-id R
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

JOBS: dict[str, list[str]] = {
    "default": [],
    # About 3,000 attempts: 800 held-out (2 games x 100 tasks x 2 attempts, before and after), the rest the
    # rounds' main rollouts (2 games x 40 tasks x 2 attempts per variant) and the gates' fresh attempts.
    "3000": ["--tasks", "40", "--heldout-tasks", "100"],
    # --tasks 100 --heldout-tasks 100 --rounds 6 made 7,551 attempts (10.2M trace events) here.
    "7500": ["--tasks", "100", "--heldout-tasks", "100", "--rounds", "6"],
}
"""The ``hx evolve`` options of each job ``--make`` can run (``default``: the command's defaults)."""
COUNTED = ("ledger_digest", "sign", "verify")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Counted:
    """Calls of one function inside a process, and their wall time (waits for the GIL and the CPU included)."""

    calls: int = 0
    seconds: float = 0.0
    first: float = 0.0
    """The first call (it pays any lazy initialisation)."""
    slowest: float = 0.0


@dataclass
class MadeRun:
    """An evolution run made by ``make_run``: where, which, how long, and its ledger crypto as counted in it."""

    data_dir: Path
    run_id: str
    job: str
    wall_s: float
    """The ``hx evolve`` process, start to exit (Python start-up and the embedded server's start included)."""
    counted: dict[str, Counted] = field(default_factory=dict)
    """Per counted function: what its calls took inside the run's process."""
    main_s: float = 0.0
    """The command's own time inside the process (after imports)."""
    stderr: str = ""


def make_run(job: str, data_dir: Path, run_id: str) -> MadeRun:
    """Run ``hx evolve`` (job ``job`` of ``JOBS``) into ``data_dir`` as run ``run_id``; raise if it fails."""
    data_dir.mkdir(parents=True, exist_ok=True)
    counts = data_dir.parent / f"{data_dir.name}.counted.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--count", str(counts), "--",
            "--data-dir", str(data_dir), "evolve", "--run-id", run_id, "--out", str(data_dir.parent / f"{run_id}.json"),
            *JOBS[job]]
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"hx evolve ({job}) exited {done.returncode}:\n{done.stderr[-2000:]}")
    data = json.loads(counts.read_text())
    counted = {k: Counted(int(v[0]), *map(float, v[1:])) for k, v in data["counted"].items()}
    return MadeRun(data_dir, run_id, job, wall, counted, float(data["main_s"]), done.stderr)


def _counting(name: str, fn: F, into: dict[str, list[float]]) -> F:
    """``fn`` wrapped to add its calls and seconds to ``into[name]``."""
    slot = into.setdefault(name, [0, 0.0, 0.0, 0.0])  # calls, seconds, first, slowest
    clock = time.perf_counter

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        began = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            took = clock() - began
            if not slot[0]:
                slot[2] = took
            slot[0] += 1
            slot[1] += took
            slot[3] = max(slot[3], took)
    return wrapped  # type: ignore[return-value]


def counted_main(out: Path, argv: list[str]) -> int:
    """Run the ``hx`` command ``argv`` with the ledger's digest, sign and verify counted; write them to ``out``."""
    # Patched before hx is imported: its modules bind these names at import (``from ... import ledger_digest``).
    import schemas.ledger
    import streams.signing

    into: dict[str, list[float]] = {}
    schemas.ledger.ledger_digest = _counting("ledger_digest", schemas.ledger.ledger_digest, into)
    streams.signing.LedgerKey.sign = _counting("sign", streams.signing.LedgerKey.sign,  # type: ignore[method-assign]
                                               into)
    streams.signing.verify = _counting("verify", streams.signing.verify, into)
    from hx.cli.main import main

    began = time.perf_counter()
    code = 0
    try:
        main(argv)
    except SystemExit as exc:  # click ends every command with one
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        out.write_text(json.dumps({"counted": into, "main_s": time.perf_counter() - began}))
    return code


def load() -> str:
    """The load average (1, 5, 15 minutes)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def header(title: str) -> None:
    """Print what a bench is and the machine it ran on: cores, CPU, Python, load."""
    print(f"{title}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"  cores {os.cpu_count()} ({cpu_model()}), {platform.python_implementation()} "
          f"{platform.python_version()}, load average {load()}")


def cpu_model() -> str:
    """The CPU's model name (Linux), or ``?``."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        return "?"


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "--count" or sys.argv[3] != "--":
        raise SystemExit(__doc__)
    sys.exit(counted_main(Path(sys.argv[2]), sys.argv[4:]))
