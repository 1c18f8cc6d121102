"""The fold behind ``hx export``: a run's ledger records grouped by round, and the text helpers its files share.

``RunFold.of`` reads a run's ledger events once, in order, and keeps what the exported
files need: every round's records (digests, landscape, candidates as first proposed and
as revised, the critic, the verdicts in gate order, approvals, ships, forks, retirements,
held-out scores, the decision), the harness each candidate was built on (its variant's
harness at the ledger position of its proposal), and the ships recorded between two
rounds' rollouts. The ``RunState`` the loop folds is folded along, so the exported
figures are the loop's own.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from hx.aegis.state import RunState
from hx.harness.config import HarnessConfig
from schemas.errors import HxError
from schemas.landscape import TaskDigest
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    LedgerOpened,
    RoundDecided,
    RoundDigested,
    VariantForked,
    VariantRetired,
)

ShipEvent = HarnessShipped | VariantForked
_KEEP = re.compile(r"[A-Za-z0-9.\-]")
_NAME_MAX = 160


class ExportError(HxError):
    """A run cannot be exported: no ledger, a ledger that does not fold, a directory that cannot be written."""


@dataclass
class RoundRecords:
    """Everything the ledger recorded for one evolution round, in ledger order."""

    round: int
    digested: RoundDigested | None = None
    landscape: LandscapePlanned | None = None
    proposed: list[CandidateProposed] = field(default_factory=list)
    """Candidates as first proposed."""
    revised: dict[str, CandidateRevised] = field(default_factory=dict)
    critic: CriticJudged | None = None
    gates: dict[str, GateJudged] = field(default_factory=dict)
    """Candidate -> its verdict, in the order the gate judged them."""
    approvals: list[ApprovalRequested] = field(default_factory=list)
    ships: list[ShipEvent] = field(default_factory=list)
    """Harness ships and forks of this round."""
    retired: list[VariantRetired] = field(default_factory=list)
    heldout: list[HeldoutScored] = field(default_factory=list)
    decided: RoundDecided | None = None
    between: list[ShipEvent] = field(default_factory=list)
    """Ships and forks recorded after the previous round's digest and before this round's."""


@dataclass
class RunFold:
    """A run's ledger, folded for export."""

    records: list[LedgerEvent]
    opened: LedgerOpened
    state: RunState
    rounds: dict[int, RoundRecords] = field(default_factory=dict)
    bases: dict[str, HarnessConfig | None] = field(default_factory=dict)
    """Candidate -> the harness of its variant when it was proposed (None: the variant did not exist)."""
    answers: dict[str, ApprovalGiven] = field(default_factory=dict)
    heldout: list[HeldoutScored] = field(default_factory=list)
    ships: list[ShipEvent] = field(default_factory=list)
    finished: EvolutionFinished | None = None
    _history: dict[str, list[tuple[int, TaskDigest]]] | None = None

    @classmethod
    def of(cls, records: Sequence[LedgerEvent]) -> RunFold:
        """Fold a run's ledger records (the first is its ``LedgerOpened``); ``ExportError`` if they do not fold."""
        if not records or not isinstance(records[0], LedgerOpened):
            raise ExportError("a run's ledger must start with ledger.opened")
        try:
            state = RunState.of(records[:1])
        except HxError as exc:
            raise ExportError(f"the initial harness of run {records[0].run_id!r} does not build: {exc}") from None
        fold = cls(list(records), records[0], state)
        pending: list[ShipEvent] = []
        for position, record in enumerate(records[1:], 2):
            fold._note(record, pending)
            try:
                state.fold(record)
            except (HxError, KeyError) as exc:
                raise ExportError(f"ledger event {position} ({type(record).TYPE}) of run {fold.opened.run_id!r} "
                                  f"does not fold: {type(exc).__name__}: {exc}") from None
        return fold

    def round(self, n: int) -> RoundRecords:
        """The records of round ``n`` (created empty on first use)."""
        if n not in self.rounds:
            self.rounds[n] = RoundRecords(n)
        return self.rounds[n]

    def _note(self, record: LedgerEvent, pending: list[ShipEvent]) -> None:
        if isinstance(record, RoundDigested):
            rnd = self.round(record.round)
            rnd.digested, rnd.between = record, list(pending)
            pending.clear()
        elif isinstance(record, LandscapePlanned):
            self.round(record.round).landscape = record
        elif isinstance(record, CandidateProposed):
            variant = self.state.variants.get(record.variant)
            self.bases[record.candidate] = variant.harness if variant is not None else None
            self.round(record.round).proposed.append(record)
        elif isinstance(record, CandidateRevised):
            self.round(record.round).revised[record.candidate] = record
        elif isinstance(record, CriticJudged):
            self.round(record.round).critic = record
        elif isinstance(record, GateJudged):
            self.round(record.round).gates[record.candidate] = record
        elif isinstance(record, ApprovalRequested):
            self.round(record.round).approvals.append(record)
        elif isinstance(record, ApprovalGiven):
            self.answers[record.candidate] = record
        elif isinstance(record, HarnessShipped | VariantForked):
            self.round(record.round).ships.append(record)
            self.ships.append(record)
            pending.append(record)
        elif isinstance(record, VariantRetired):
            self.round(record.round).retired.append(record)
        elif isinstance(record, HeldoutScored):
            self.heldout.append(record)
            if record.round >= 0:
                self.round(record.round).heldout.append(record)
        elif isinstance(record, RoundDecided):
            self.round(record.round).decided = record
        elif isinstance(record, EvolutionFinished):
            self.finished = record

    def ordered(self) -> list[RoundRecords]:
        """The rounds in order."""
        return [self.rounds[n] for n in sorted(self.rounds)]

    def final(self, candidate: str) -> CandidateProposed:
        """A candidate as the gate saw it (its revision applied)."""
        return self.state.candidates[candidate].proposal

    def shipped(self) -> set[str]:
        """The candidates that shipped or forked."""
        return {s.candidate for s in self.state.ships}

    def history(self, task: str) -> list[tuple[int, TaskDigest]]:
        """A task's digests, round by round."""
        if self._history is None:
            self._history = {}
            for rnd in sorted(self.state.digests):
                for d in self.state.digests[rnd]:
                    self._history.setdefault(d.task, []).append((rnd, d))
        return self._history.get(task, [])


# --- names and text --------------------------------------------------------------------------


def safe_name(value: str) -> str:
    """A file name for an id: letters, digits, ``.`` and ``-`` kept, ``:`` as ``_``, anything else ``%XX``.

    The mapping is one to one (``_`` only ever stands for ``:``), so two ids never share a file.

    >>> safe_name("bench:game:dev:17")
    'bench_game_dev_17'
    """
    out = "".join(c if _KEEP.fullmatch(c) else "_" if c == ":" else "".join(f"%{b:02X}" for b in c.encode())
                  for c in value)
    if not out or out.startswith("."):
        out = "%2E" + out[1:] if out else "%00"
    if len(out) > _NAME_MAX:  # keep room for suffixes within a file system's 255 bytes
        out = out[:_NAME_MAX - 17] + "~" + hashlib.sha256(value.encode()).hexdigest()[:16]
    return out


def link(text: str, target: str) -> str:
    """A Markdown link to a relative path (percent-encoded)."""
    return f"[{text}]({quote(target)})"


def cell(value: Any) -> str:
    """A value as one Markdown table cell (pipes escaped, on one line)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return " ".join(text.split()).replace("|", "\\|") or " "


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (``(none)`` when there are no rows)."""
    body = [f"| {' | '.join(cell(v) for v in row)} |" for row in rows]
    if not body:
        return "(none)\n"
    head = f"| {' | '.join(headers)} |\n| {' | '.join('---' for _ in headers)} |\n"
    return head + "\n".join(body) + "\n"


def rate(value: float | None) -> str:
    """A rate with three decimals, or ``-`` when unknown."""
    return "-" if value is None else f"{value:.3f}"


def ratio(part: int, whole: int) -> float | None:
    """``part / whole`` rounded to four decimals (None when ``whole`` is 0)."""
    return round(part / whole, 4) if whole else None


def listed(values: Iterable[str], empty: str = "none") -> str:
    """Comma-separated values in backquotes, or ``empty``."""
    items = [f"`{v}`" for v in values]
    return ", ".join(items) if items else empty


def json_text(value: Any) -> str:
    """Indented JSON with a final newline (keys in the order given: the ledger's order)."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
