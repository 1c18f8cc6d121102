"""The memory smoke: the log and its read models checked directly, no agent (a suite task's ``smoke: memory``).

Three checks, each passed or failed with a one-line detail, none of which writes anything:

- ``topology``: every stream hx relies on exists with its declared settings and still reaches the
  head last recorded for it (``streams.topology.check_topology``, as an auditor's connection checks);
- ``ledgers``: every run's edit ledger on ``HX_LEDGER`` folds without a fault (each event chains to
  the digest of the one before, positions run 1, 2, 3...) and, in a signed ledger, every event
  verifies with the run's key (``projections.ledger``, ``streams.signing``, what ``hx audit`` reads);
- ``projection``: ``task_history`` folded from scratch into a throwaway state equals the stored
  checkpoint caught up to the same position (with no checkpoint: its snapshot encoding round-trips).

The eval runner turns the result into an attempt-like output (``SmokeResult.output``), so the
task's criteria judge it like any attempt.
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec

from projections.attempt_outputs import AttemptOutput
from projections.base import Projection
from projections.ledger import RunLedger
from projections.ledger_reader import EditLedger
from projections.registry import projection
from projections.runner import START, ProjectionRunner
from schemas.errors import HxError
from schemas.ledger import ledger_digest
from streams.connection import Connection
from streams.integrity import Heads
from streams.signing import verify
from streams.topology import check_topology

REBUILT = "task_history"
"""The projection the smoke rebuilds."""


class SmokeCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One check of the smoke: its name, whether it passed, and what it saw."""

    name: str
    passed: bool
    detail: str


class SmokeResult(msgspec.Struct, frozen=True, kw_only=True):
    """The smoke's checks; it passes when every check does."""

    checks: tuple[SmokeCheck, ...]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def detail(self) -> str:
        """One line per check: ``name: ok|FAILED: detail``."""
        return "\n".join(f"{c.name}: {'ok' if c.passed else 'FAILED'}: {c.detail}" for c in self.checks)

    def output(self, run: str, round: int, task: str, attempt: int) -> AttemptOutput:
        """The result as an attempt's output: finished, passed when every check passed, the details as its answer."""
        failed = [c.name for c in self.checks if not c.passed]
        return AttemptOutput(run=run, round=round, task=task, attempt=attempt, finished=True, status="completed",
                             passed=self.passed, score=sum(c.passed for c in self.checks) / max(len(self.checks), 1),
                             steps=len(self.checks), answer=self.detail,
                             reason=f"failed: {', '.join(failed)}" if failed else "")


async def memory_smoke(conn: Connection) -> SmokeResult:
    """Check the streams, every edit ledger's chain and signatures, and a projection's rebuild; writes nothing."""
    return SmokeResult(checks=(await topology_check(conn), await ledgers_check(conn), await projection_check(conn)))


async def topology_check(conn: Connection) -> SmokeCheck:
    """The streams exist with their declared settings and reach their recorded heads (read only)."""
    mirror = conn.heads.mirror if conn.heads is not None else None
    try:
        await check_topology(conn.js, Heads(conn.js, mirror, read_only=True))
    except HxError as exc:  # TopologyMismatch, TopologyMissing, StreamLoss: what is wrong is the check's detail
        return SmokeCheck(name="topology", passed=False, detail=str(exc))
    return SmokeCheck(name="topology", passed=True, detail="every stream as declared, at or past its recorded head")


def ledger_problem(ledger: RunLedger) -> str:
    """The first thing wrong with one run's ledger (a fault of its fold, a bad signature), or ""."""
    fault = ledger.first_fault
    if fault is not None:
        return f"run {ledger.run_id!r}: {fault}"
    key = ledger.opened.public_key if ledger.opened is not None else ""
    if key:
        for entry in ledger.arrived:
            why = verify(key, ledger_digest(entry.event), entry.event.signature)
            if why:
                return f"run {ledger.run_id!r}: {entry.label}: {why}"
    return ""


async def ledgers_check(conn: Connection) -> SmokeCheck:
    """Every run's edit ledger folds without a fault and verifies with its key."""
    undecodable = conn.log.quarantine.count
    ledgers: dict[str, RunLedger] = await _fold(conn, EditLedger())
    undecodable = conn.log.quarantine.count - undecodable
    if undecodable:
        return SmokeCheck(name="ledgers", passed=False,
                          detail=f"{undecodable} message(s) on the edit ledger cannot be decoded by this hx")
    for run_id in sorted(ledgers):
        problem = ledger_problem(ledgers[run_id])
        if problem:
            return SmokeCheck(name="ledgers", passed=False, detail=problem)
    events = sum(len(ledger.arrived) for ledger in ledgers.values())
    signed = sum(1 for ledger in ledgers.values() if ledger.opened is not None and ledger.opened.public_key)
    return SmokeCheck(name="ledgers", passed=True,
                      detail=f"{len(ledgers)} ledger(s), {events} event(s) chained, {signed} signed ledger(s) verified")


async def projection_check(conn: Connection, name: str = REBUILT) -> SmokeCheck:
    """The projection rebuilt from scratch equals its stored checkpoint caught up to the same position."""
    check = f"projection {name}"
    proj: Projection[Any] = projection(name)
    stored = _throwaway(conn, proj)
    resumed = await stored.load()
    stop = max(await conn.log.last_seq(proj.stream), resumed[0])
    await stored.catch_up(stop, checkpoint=False)
    fresh = _throwaway(conn, proj)
    await fresh.catch_up(stop, checkpoint=False)
    if stored.digest != fresh.digest:
        return SmokeCheck(name=check, passed=False,
                          detail=f"rebuilt from scratch to {stop}: digest {fresh.digest[:16]}, but the stored "
                                 f"checkpoint (at {resumed[0]}) caught up to it gives {stored.digest[:16]}")
    if resumed == START:  # nothing stored to compare with: the snapshot a checkpoint would store must hold
        data, digest = fresh.encoded()
        again = proj.digest(proj.decode(data))
        if again != digest:
            return SmokeCheck(name=check, passed=False, detail=f"rebuilt to {stop}: its snapshot decodes to another "
                                                               f"state ({again[:16]}, not {digest[:16]})")
        return SmokeCheck(name=check, passed=True, detail=f"no stored checkpoint; rebuilt to {stop} "
                                                          f"({fresh.applied} event(s)), snapshot round-trips")
    return SmokeCheck(name=check, passed=True, detail=f"rebuilt to {stop} ({fresh.applied} event(s)) equals the "
                                                      f"stored checkpoint at {resumed[0]} caught up")


def _throwaway(conn: Connection, proj: Projection[Any]) -> ProjectionRunner[Any]:
    """A runner that never checkpoints: the smoke reads, it writes nothing."""
    return ProjectionRunner(conn.log, proj, checkpoint_every=sys.maxsize)


async def _fold(conn: Connection, proj: Projection[Any]) -> Any:
    """The projection folded from scratch to the log's end now, in a throwaway runner."""
    return await _throwaway(conn, proj).catch_up(checkpoint=False)
