"""What ``hx export`` reads of a run: its ledger's one fold with harnesses built, and the text helpers of its files.

``RunFold.of`` folds a run's ledger events once (``projections.ledger.RunLedger``: every round's
records, candidates as first proposed and as revised, verdicts in gate order, approvals, ships,
forks, retirements, held-out scores, decisions, the ships recorded between two rounds'
rollouts) into the loop's own ``RunState``, so the exported figures are the loop's own; the
harness each candidate was built on is its variant's version in force at its proposal.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import msgspec

from hx.aegis.state import RunState
from hx.harness.config import HarnessConfig
from hx.replay.errors import LedgerRefused
from hx.report.errors import ReportError
from projections.ledger import RunLedger
from projections.ledger_records import RoundRecords, ShipRecord, lever_of
from projections.ledger_rules import RuleRecord, shipped_rules
from schemas.edits import AddRule, AnyEditOp, DropRule
from schemas.errors import HxError
from schemas.landscape import TaskDigest
from schemas.ledger import ApprovalGiven, CandidateProposed, EvolutionFinished, HeldoutScored, LedgerEvent, LedgerOpened
from schemas.rules import sentence

_KEEP = re.compile(r"[A-Za-z0-9.\-]")
_NAME_MAX = 160


@dataclass
class RunFold:
    """A run's ledger, folded for export: the fold, and the loop's state with its harnesses built."""

    state: RunState

    @classmethod
    def of(cls, records: Sequence[LedgerEvent]) -> RunFold:
        """Fold a run's ledger records (the first is its ``LedgerOpened``); ``ReportError`` if they do not fold."""
        try:
            return cls(RunState.of(records))
        except LedgerRefused as exc:
            raise ReportError(str(exc)) from None
        except HxError as exc:
            run = records[0].run_id if records else "?"
            raise ReportError(f"a harness recorded on the ledger of run {run!r} does not build: {exc}") from None

    @property
    def ledger(self) -> RunLedger:
        """The ledger's fold."""
        return self.state.ledger

    @property
    def records(self) -> list[LedgerEvent]:
        """Every ledger event, in order."""
        return [e.event for e in self.ledger.entries]

    @property
    def opened(self) -> LedgerOpened:
        """The run's first ledger event."""
        return self.state.opened

    @property
    def rounds(self) -> dict[int, RoundRecords]:
        """Round -> its records."""
        return self.ledger.rounds

    @property
    def answers(self) -> dict[str, ApprovalGiven]:
        """Candidate -> a human's answer."""
        return self.ledger.answers

    @property
    def heldout(self) -> list[HeldoutScored]:
        """Every held-out score, in order."""
        return self.ledger.heldout

    @property
    def ships(self) -> list[ShipRecord]:
        """Every ship and fork, in order."""
        return self.ledger.shipments

    @property
    def finished(self) -> EvolutionFinished | None:
        """The run's end, if it ended."""
        return self.ledger.finished

    def base(self, candidate: str) -> HarnessConfig | None:
        """The harness of a candidate's variant when it was proposed (None: the variant did not exist then)."""
        cand = self.ledger.candidates[candidate]
        variant = self.ledger.variants.get(cand.proposal.variant)
        version = variant.before(cand.position) if variant is not None else None
        return self.state.harness(version.digest, version.harness) if version is not None else None

    def round(self, n: int) -> RoundRecords:
        """The records of round ``n`` (empty when the ledger has none)."""
        return self.ledger.rounds.get(n) or RoundRecords(n)

    def ordered(self) -> list[RoundRecords]:
        """The rounds in order."""
        return self.ledger.ordered()

    def final(self, candidate: str) -> CandidateProposed:
        """A candidate as the gate saw it (its revision applied)."""
        return self.ledger.candidates[candidate].proposal

    def shipped(self) -> set[str]:
        """The candidates that shipped or forked."""
        return self.ledger.shipped()

    def history(self, task: str) -> list[tuple[int, TaskDigest]]:
        """A task's digests, round by round."""
        return [(rnd, d) for rnd, digests in self.ledger.digests.items() for d in digests if d.task == task]

    def rules(self) -> list[RuleRecord]:
        """The rules evolution put into each variant's harness, and their fate (``projections.ledger_rules``)."""
        return shipped_rules(self.ledger)


def rule_ops(operations: Iterable[AnyEditOp]) -> list[dict[str, Any]]:
    """The rule edits among some operations, structured: op, lever, sentence (with support), support, the rule."""
    out: list[dict[str, Any]] = []
    for op in operations:
        if isinstance(op, AddRule | DropRule):
            support = op.support if isinstance(op, AddRule) else None
            out.append({"op": type(op).__struct_config__.tag, "lever": lever_of(op),
                        "sentence": sentence(op.rule, support),
                        "support": msgspec.to_builtins(support) if support is not None else None,
                        "rule": msgspec.to_builtins(op.rule)})
    return out


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
