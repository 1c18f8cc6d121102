"""The audit of a run's edit ledger: its hash chain, its ships against the fold of their edits, its verdicts' inputs.

The checks themselves, each naming the first thing wrong, are ``hx.replay.ledger_checks``;
an audit runs them all and says what it checked and found (``Verification``).

``verify_run`` audits a run on the log; ``verify_file`` a JSON-lines copy (``audit.jsonl`` as
``hx export`` writes it, or ``hx log dump --stream HX_LEDGER`` lines), which cannot show the
trace: those checks are listed as not made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hx.aegis.code import CodeStore
from hx.aegis.session import restore_plugins
from hx.replay.ledger_checks import Problem, check_chain, check_folds, check_inputs, check_trace
from hx.replay.ledger_view import LedgerEntry, compare_copy, read_copy, read_ledger
from schemas.ledger import CandidateProposed, ledger_digest
from streams.log import EventLog
from streams.topology import TRACE

NOT_ON_FILE = ("the trace rounds that digests, gate verdicts and held-out scores cite (HX_TRACE)",
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
    problems: list[Problem] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    """What could not be checked, and why."""
    notes: list[str] = field(default_factory=list)
    """What holds but deserves a look (a copy that ends before the run's end)."""
    source: str = "log"
    head: str = ""
    """The digest of the last event: what a copy of the ledger kept elsewhere must end with too."""

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def headline(self) -> str:
        """``verified: ...`` or ``not verified: ...``, one line."""
        where = "on the log" if self.source == "log" else "on the file"
        if self.ok:
            extra = (f" ({self.anchors} evidence anchors and {self.trace_rounds} trace rounds found on "
                     f"{TRACE.name})" if self.source == "log" else "")
            return (f"verified: {self.events} events, chain intact, {self.ships} ships equal their folds, "
                    f"{self.verdicts} verdicts with inputs {where}{extra}")
        kinds = sorted({p.kind for p in self.problems})
        return f"not verified: {len(self.problems)} problem(s) ({', '.join(kinds)}) in {self.events} events"


# --- the two entry points -----------------------------------------------------------------------


def _same_run(entries: Sequence[LedgerEntry], run_id: str) -> list[Problem]:
    return [Problem("input", f"{e.label}: belongs to run {e.event.run_id!r}, not {run_id!r}")
            for e in entries if e.event.run_id != run_id]


async def verify_run(log: EventLog, run_id: str, plugin_dir: Path | None = None) -> Verification:
    """Audit a run on the log: chain, folds, and every verdict's inputs on the ledger and the trace."""
    entries = await read_ledger(log, run_id)
    if plugin_dir is not None and any(isinstance(e.event, CandidateProposed) and e.event.code for e in entries):
        # Harnesses naming new processor code build only with its modules, kept in the run's object store.
        await restore_plugins(CodeStore(log, plugin_dir), [e.event for e in entries])
    out = Verification(events=len(entries), head=ledger_digest(entries[-1].event))
    out.problems += check_chain(entries) + _same_run(entries, run_id)
    out.ships, fold_problems, out.unchecked = check_folds(entries)
    verdicts, input_problems = check_inputs(entries)
    good, out.anchors, out.trace_rounds, trace_problems = await check_trace(log, run_id, entries, verdicts)
    out.verdicts = len(good)
    out.problems += fold_problems + input_problems + trace_problems
    return out


def verify_file(path: Path, run_id: str | None = None, on_log: Sequence[LedgerEntry] = ()) -> Verification:
    """Audit a ledger copy (``run_id``'s events in it): chain, folds, ledger-internal inputs; no trace checks.

    With ``on_log`` (the run's ledger read from the log), a copy whose head differs is a problem, named.
    """
    entries, digests, positioned = read_copy(path, run_id)
    out = Verification(events=len(entries), source="file", head=ledger_digest(entries[-1].event))
    difference, note = compare_copy(entries, on_log)
    out.problems += [Problem("copy", difference)] if difference else []
    out.notes += [note] if note else []
    out.problems += check_chain(entries, digests, positioned) + _same_run(entries, entries[0].event.run_id)
    code_missing = any(isinstance(e.event, CandidateProposed) and e.event.code for e in entries)
    out.ships, fold_problems, out.unchecked = check_folds(entries, code_missing=code_missing)
    verdicts, input_problems = check_inputs(entries)
    out.verdicts = len(verdicts)
    out.problems += fold_problems + input_problems
    out.unchecked += [f"{what}: not in a file" for what in NOT_ON_FILE]
    if not positioned:
        out.unchecked.append("dropped events by position: the file records no positions, so a break is named "
                             "from the chain alone")
    return out
