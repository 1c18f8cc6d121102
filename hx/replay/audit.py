"""The audit of a run's edit ledger: its chain and signatures, its decisions, its folds, and what it cites.

The checks themselves, each naming the first thing wrong, are ``hx.replay.ledger_checks`` (on
the ledger alone) and ``hx.replay.trace_checks`` (against ``HX_TRACE``); an audit runs them all
on the ledger's one fold and says what it checked and found (``Verification``).

``verify_run`` audits a run on the log; ``verify_file`` a JSON-lines copy (``audit.jsonl`` as
``hx export`` writes it, or ``hx log dump --stream HX_LEDGER`` lines), which cannot show the
trace: those checks are listed as not made. ``verified_ledger`` is what every command that
acts on a run's ledger calls first: the same checks, and a ``LedgerRefused`` naming the first
problem instead of a ledger to act on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hx.replay.errors import AuditError, LedgerRefused
from hx.replay.ledger_checks import (
    Problem,
    check_chain,
    check_decisions,
    check_fold,
    check_folds,
    check_signatures,
)
from hx.replay.ledger_view import compare_copy, read_copy, read_ledger
from hx.replay.trace_checks import check_trace
from hx.runtime.code import CodeStore, restore_plugins
from projections.ledger import RunLedger
from projections.ledger_records import LedgerEntry
from schemas.ledger import ledger_digest
from streams.log import EventLog
from streams.signing import fingerprint
from streams.topology import TRACE

NOT_ON_FILE = ("the trace rounds that digests, gate verdicts and held-out scores cite, the harness each of them "
               "played, and the seesaw of every gate verdict recomputed from them (HX_TRACE)",
               "the evidence anchors of candidates and digests (HX_TRACE)")
"""What a verification of a file cannot check: it holds the ledger, not the trace."""


@dataclass
class Verification:
    """What an audit checked and found."""

    events: int = 0
    ships: int = 0
    """Ships and forks whose recorded digests equal the fold of their edits."""
    verdicts: int = 0
    """Critic and gate verdicts whose inputs are all on the log (or, for a file, on the file)."""
    anchors: int = 0
    """Evidence anchors resolved to trace events of the run."""
    trace_rounds: int = 0
    recomputed: int = 0
    """Gate verdicts whose seesaw the gate's rule gave again from the trace rounds they cite."""
    played: int = 0
    """Rounds whose recorded harness is the one they stand for (a held-out score's every round, routing included)."""
    signed: int = 0
    """Events that verify with the key the run's ledger was opened with."""
    key: str = ""
    """That key (empty: an unsigned ledger, written before hx signed its ledgers)."""
    problems: list[Problem] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    """What could not be checked, and why."""
    notes: list[str] = field(default_factory=list)
    """What holds but deserves a look (a copy that ends before the run's end)."""
    source: str = "log"
    head: str = ""
    """The digest of the last event: what a copy of the ledger kept elsewhere must end with too."""
    ledger: RunLedger | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def headline(self) -> str:
        """``verified: ...`` or ``not verified: ...``, one line."""
        where = "on the log" if self.source == "log" else "on the file"
        if self.ok:
            extra = (f" ({self.anchors} evidence anchors and {self.trace_rounds} trace rounds found on "
                     f"{TRACE.name}, {self.played} rounds seen to play the harness they stand for, "
                     f"{self.recomputed} seesaws recomputed from them)" if self.source == "log" else "")
            return (f"verified: {self.events} events, chain intact, {self.ships} ships equal their folds, "
                    f"{self.verdicts} verdicts with inputs {where}{extra}")
        kinds = sorted({p.kind for p in self.problems})
        return f"not verified: {len(self.problems)} problem(s) ({', '.join(kinds)}) in {self.events} events"

    def signature_line(self) -> str:
        """Who signed the ledger: its key's fingerprint and how many events verify with it."""
        if not self.key:
            return ("unsigned: this ledger records no key (written by an hx that signed none: before hx signed its "
                    "ledgers, or an evolution hx experiment run made before it signed them): its chain proves order, "
                    "not who wrote it")
        return (f"signed: {self.signed} of {self.events} events by key {fingerprint(self.key)} ({self.key}); compare "
                "the fingerprint with the writer's (hx audit head)")

    @property
    def first(self) -> Problem | None:
        """The problem at the earliest ledger position."""
        return min(self.problems, key=lambda p: p.position) if self.problems else None


def _ledger_checks(out: Verification, ledger: RunLedger, recorded: Sequence[str | None] = (),
                   positioned: bool = True, code_missing: bool = False) -> None:
    """The checks on the ledger alone, into ``out``."""
    arrived = ledger.arrived
    out.events, out.ledger = len(arrived), ledger
    out.head = ledger_digest(arrived[-1].event) if arrived else ""
    out.key = ledger.opened.public_key if ledger.opened is not None else ""
    out.problems += check_fold(ledger) + check_chain(arrived, recorded, positioned)
    out.signed, signature_problems = check_signatures(ledger)
    out.ships, fold_problems, out.unchecked = check_folds(ledger, code_missing=code_missing)
    consistent, decision_problems = check_decisions(ledger)
    out.problems += signature_problems + fold_problems + decision_problems
    out.verdicts = consistent + sum(1 for r in ledger.rounds.values() if r.critic is not None)


async def verify_run(log: EventLog, run_id: str, plugin_dir: Path | None = None, *,
                     trace: bool = True) -> Verification:
    """Audit a run on the log: the ledger's own checks and (with ``trace``) every citation of the trace."""
    return await verify_ledger(log, await read_ledger(log, run_id), plugin_dir, trace=trace)


async def verify_ledger(log: EventLog, ledger: RunLedger, plugin_dir: Path | None = None, *,
                        trace: bool = True) -> Verification:
    """Audit a run's ledger already read off the log (``verify_run``)."""
    if plugin_dir is not None:
        # Harnesses naming new processor code build only with its modules, kept in the run's object store.
        await restore_plugins(CodeStore(log, plugin_dir), ledger)
    out = Verification()
    _ledger_checks(out, ledger)
    if trace:
        found = await check_trace(log, ledger)
        out.problems += found.problems
        out.anchors, out.trace_rounds, out.recomputed = found.anchors, found.rounds, found.recomputed
        out.played = found.played
        out.unchecked += found.unchecked
        out.verdicts -= sum(1 for c in ledger.candidates.values()
                            if c.gate is not None and c.id in found.bad_candidates)
        out.verdicts -= sum(1 for n in found.bad_rounds if n in ledger.rounds and ledger.rounds[n].critic is not None)
    else:
        out.unchecked += [f"{what}: --no-trace" for what in NOT_ON_FILE]
    out.problems.sort(key=lambda p: p.position)
    return out


def verify_file(path: Path, run_id: str | None = None, on_log: Sequence[LedgerEntry] = ()) -> Verification:
    """Audit a ledger copy (``run_id``'s events in it): chain, keys, folds, decisions; no trace checks.

    With ``on_log`` (the run's ledger read from the log), a copy whose head differs is a problem, named.
    """
    entries, digests, positioned = read_copy(path, run_id)
    ledger = RunLedger(run_id=entries[0].event.run_id)
    for e in entries:
        ledger.fold(e.event, e.position, e.seq)
    out = Verification(source="file")
    difference, note = compare_copy(entries, on_log)
    out.problems += [Problem("copy", difference)] if difference else []
    out.notes += [note] if note else []
    code_missing = any(c.proposal.code for c in ledger.candidates.values())
    _ledger_checks(out, ledger, digests, positioned, code_missing)
    out.events = len(entries)
    out.unchecked += [f"{what}: not in a file" for what in NOT_ON_FILE]
    if not positioned:
        out.unchecked.append("dropped events by position: the file records no positions, so a break is named "
                             "from the chain alone")
    out.problems.sort(key=lambda p: p.position)
    return out


async def verified_ledger(log: EventLog, run_id: str, plugin_dir: Path | None = None, *,
                          trace: bool = True) -> RunLedger:
    """The run's ledger, once it verifies (``trace``: against the trace too); ``LedgerRefused`` naming the first
    problem otherwise, ``AuditError`` when the run has no ledger or one this hx cannot read."""
    return refused(await verify_run(log, run_id, plugin_dir, trace=trace), run_id)


def refused(out: Verification, run_id: str) -> RunLedger:
    """The verified ledger; ``LedgerRefused`` naming the first problem when it did not verify."""
    first = out.first
    if first is not None:
        more = f" (and {len(out.problems) - 1} more: hx audit verify {run_id})" if len(out.problems) > 1 else ""
        raise LedgerRefused(f"the ledger of run {run_id!r} does not verify: {first}{more}")
    assert out.ledger is not None
    return out.ledger


__all__ = ["AuditError", "LedgerRefused", "Verification", "refused", "verified_ledger", "verify_file",
           "verify_ledger", "verify_run"]
