"""A real evolution run on its own nats-server, made once and read by many tests (audit, and anyone who reads runs).

``evolved_run`` starts a nats-server, runs ``hx evolve`` on the toyworld benchmark (two
rounds, sixteen tasks: ~1 s; round 0 forks a variant, round 1 ships an edit) and exports
it; tests read it and must not write to it. ``rechained`` rewrites a JSON-lines ledger
copy so that its chain holds again after an edit, as a forger who knows the digest would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import toyworld  # noqa: F401 - registers the toyworld benchmark the run evolves on
from hx_cli import hx, ok

from schemas.event import event_type
from schemas.ledger import LedgerEvent, ledger_digest
from streams.server import NatsProcess
from streams.signing import LedgerKey

RUN = "audit-run"


@dataclass(frozen=True)
class EvolvedRun:
    """Where the run is: its server, data dir, id, the export of its ledger, and its ledger events as dumped."""

    url: str
    data_dir: Path
    run_id: str
    export: Path
    ledger: list[dict[str, Any]]
    """``hx log dump --stream HX_LEDGER`` lines of the run."""

    def hx(self, *args: str) -> Any:
        """The ``hx`` command on this run's server."""
        return hx("--nats-url", self.url, "--data-dir", str(self.data_dir), *args)


@contextmanager
def evolved_run(root: Path, run_id: str = RUN) -> Iterator[EvolvedRun]:
    """A two-round ``hx evolve`` on toyworld, exported to ``root/export``, its server stopped afterwards."""
    server = NatsProcess(root / "nats")
    server.start(detach=False)
    try:
        base = ("--nats-url", server.url, "--data-dir", str(root / "data"))
        ok(hx(*base, "evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8",
              "--heldout-tasks", "2", "--rounds", "2", "--max-steps", "20", "--seed", "3", "--run-id", run_id))
        ok(hx(*base, "export", run_id, str(root / "export")))
        dump = ok(hx(*base, "log", "dump", "--stream", "HX_LEDGER"))
        ledger = [line for line in map(json.loads, dump.stdout.splitlines()) if line["event"].get("run_id") == run_id]
        yield EvolvedRun(server.url, root / "data", run_id, root / "export", ledger)
    finally:
        server.stop()


def rechained(lines: list[dict[str, Any]], start: int = 0, key: LedgerKey | None = None) -> list[dict[str, Any]]:
    """``audit.jsonl`` lines from ``start`` on with ``prev`` and ``digest`` recomputed (a forger's re-hash), and the
    signatures made anew when the forger holds the ``key`` (else left as they were, no longer verifying)."""
    out = [dict(line) for line in lines]
    for i in range(start, len(out)):
        cls = event_type(out[i]["type"])
        body = dict(out[i]["event"], prev=out[i - 1]["digest"] if i else "")
        event = msgspec.convert(body, cls)
        assert isinstance(event, LedgerEvent)
        if key is not None:
            event = msgspec.structs.replace(event, signature=key.sign(ledger_digest(event)))
        out[i] = dict(out[i], event=msgspec.to_builtins(event), prev=event.prev, digest=ledger_digest(event))
    return out
