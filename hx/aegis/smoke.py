"""The smoke test of a candidate: config check, new code exercised, and its effect on the model input.

``check`` runs ``hx.aegis.smoke_worker`` in the subprocess sandbox of
``hx.processors.sandbox`` (wall-clock and CPU limits, an address-space limit, no network,
a minimal environment, a private temporary directory): the child imports the candidate's
code, applies the operations to the base harness, drives each new processor through the
processor contract kit, and runs a before_model round trip. The main process never
imports candidate code for this (see ``hx.runtime.code`` for the invariant): it only reads
the child's reports. A timeout, a crash, a memory blow-up or a report that never came
is ``smoke_ok=False`` with the reason, never an exception here.

Because the child also builds the candidate harness, ``SandboxReport.digest`` is the
candidate's digest: the loop uses it for a candidate with new code, whose harness it may
build in its own process only after the smoke test passed and ``CodeStore.materialize``.
"""

from __future__ import annotations

import json
import math
import secrets
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from hx.aegis.smoke_worker import MARK
from hx.harness.config import HarnessConfig
from hx.processors.sandbox import SandboxLimits, SandboxRun, run_python
from hx.runtime.code import CodeStore
from schemas.edits import AnyEditOp, CodeAsset
from schemas.ledger import CandidateProposed

SMOKE_LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=1024, max_output_chars=20_000)
"""Generous for importing hx and driving a processor through a few dozen events."""
REQUEST = "smoke-request.json"
_BOOT = f"from hx.aegis.smoke_worker import main\nmain({REQUEST!r})\n"
_TAIL = 400


class SandboxReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the sandboxed smoke test found."""

    config_ok: bool
    """The operations build a valid harness from the base."""
    config_error: str = ""
    digest: str = ""
    """The candidate harness's digest (when ``config_ok``)."""
    smoke_ok: bool
    """Every new processor imported, instantiated and ran on its hooks' events, and the round trip ran."""
    smoke_error: str = ""
    effect: str = ""
    """What the candidate changes in the model input at before_model, or ``no change``."""


def _reports(run: SandboxRun, nonce: str) -> dict[str, dict[str, Any]]:
    """The child's reports by stage (the last of each), from the lines carrying the nonce."""
    prefix = f"{MARK}{nonce} "
    out: dict[str, dict[str, Any]] = {}
    for line in run.stdout.split("\n"):
        if line.startswith(prefix):
            try:
                item = json.loads(line[len(prefix):])
            except ValueError:
                continue
            if isinstance(item, dict):
                out[str(item.get("stage"))] = item
    return out


def _crash(run: SandboxRun, limits: SandboxLimits, doing: str) -> str:
    """Why the child ended without its final report."""
    where = f" while {doing}" if doing else ""
    if run.timed_out and run.exit_code == -signal.SIGXCPU:  # RLIMIT_CPU struck before the wall clock
        return f"timed out: used the CPU time limit of {math.ceil(limits.timeout_s)} s{where}"
    if run.timed_out:
        return f"timed out after {limits.timeout_s:g} s{where}"
    if run.memory_exceeded:
        return f"exceeded the memory limit of {limits.memory_mb} MiB{where}"
    tail = run.stderr.strip()[-_TAIL:]
    return f"the sandbox exited with code {run.exit_code}{where}" + (f": {tail}" if tail else "")


def report_of(run: SandboxRun, nonce: str, limits: SandboxLimits) -> SandboxReport:
    """The report a finished sandbox run amounts to."""
    stages = _reports(run, nonce)
    config, smoke = stages.get("config"), stages.get("smoke")
    doing = str(stages.get("running", {}).get("what", ""))
    if smoke is None:
        why = _crash(run, limits, doing)
        if config is None:
            return SandboxReport(config_ok=False, config_error=f"not checked: {why}", smoke_ok=False, smoke_error=why)
        return SandboxReport(config_ok=bool(config.get("ok")), config_error=str(config.get("error", "")),
                             digest=str(config.get("digest", "")), smoke_ok=False, smoke_error=why)
    config = config or {"ok": False, "error": "not reported"}
    return SandboxReport(config_ok=bool(config.get("ok")), config_error=str(config.get("error", "")),
                         digest=str(config.get("digest", "")), smoke_ok=bool(smoke.get("ok")),
                         smoke_error=str(smoke.get("error", "")), effect=str(smoke.get("effect", "")))


async def check(base: dict[str, Any], operations: list[dict[str, Any]], code: list[tuple[str, str]], *,
                limits: SandboxLimits | None = None) -> SandboxReport:
    """Smoke-test a candidate in the sandbox: ``base`` harness dict, operations as dicts, (file, source) pairs."""
    limits = limits or SMOKE_LIMITS
    nonce = secrets.token_hex(12)
    request = {"nonce": nonce, "base": base, "operations": operations, "code": [list(c) for c in code]}
    with tempfile.TemporaryDirectory(prefix="hx-smoke-") as tmp:
        workspace = Path(tmp)
        (workspace / REQUEST).write_text(json.dumps(request))
        try:
            run = await run_python(_BOOT, workspace, limits)
        except (OSError, RuntimeError) as exc:
            why = f"the sandbox could not start: {exc}"
            return SandboxReport(config_ok=False, config_error=f"not checked: {why}", smoke_ok=False,
                                 smoke_error=why)
    return report_of(run, nonce, limits)


async def check_candidate(store: CodeStore, base: HarnessConfig, operations: Sequence[AnyEditOp],
                          code: Sequence[CodeAsset], *, limits: SandboxLimits | None = None) -> SandboxReport:
    """``check`` for a proposed candidate: its sources read back from the store (digests verified)."""
    sources = [(asset.name, await store.get(asset)) for asset in code]
    ops: list[dict[str, Any]] = msgspec.to_builtins(list(operations))
    return await check(base.to_dict(), ops, sources, limits=limits)


class SandboxCodeCheck:
    """The gate's code check: store -> sandbox check -> materialize; the main process may then build the harness.

    Call it with the base harness and a candidate bringing new code: it returns (digest,
    config error, smoke error), and only when both errors are empty has it materialized the
    code (``CodeStore.materialize``), so that building the candidate imports proven code.
    Results are kept per base harness and candidate content: the loop asks once when the
    candidate is proposed and again at the gate.
    """

    def __init__(self, store: CodeStore, limits: SandboxLimits | None = None) -> None:
        self.store = store
        self.limits = limits
        self._seen: dict[bytes, SandboxReport] = {}
        self.reports: dict[str, SandboxReport] = {}
        """The last report per candidate id (its ``effect`` says what the candidate changes in the model input)."""

    async def __call__(self, base: HarnessConfig, candidate: CandidateProposed) -> tuple[str, str, str]:
        """(the candidate's digest, why its config does not build or "", why its smoke test failed or "")."""
        key = msgspec.json.encode([base.digest, candidate.operations, candidate.code])
        report = self._seen.get(key)
        if report is None:
            report = await check_candidate(self.store, base, candidate.operations, candidate.code, limits=self.limits)
            self._seen[key] = report
        self.reports[candidate.candidate] = report
        if report.config_ok and report.smoke_ok:
            for asset in candidate.code:
                await self.store.materialize(asset)
        return report.digest, "" if report.config_ok else report.config_error, \
            "" if report.smoke_ok else report.smoke_error

    async def sources(self, candidate: CandidateProposed) -> list[str]:
        """The candidate's code as text (for the leakage scan), read back and verified."""
        return [await self.store.get(asset) for asset in candidate.code]
