"""A run's edit ledger read back for people: its events with their places, and evidence anchors resolved.

``read_ledger`` reads one run's ledger off ``HX_LEDGER`` with the subject filter of the run's
aggregate (``streams.edit_ledger.ledger_filter``), so it costs the run's ledger and nothing
else, and folds it (``projections.ledger.RunLedger``) without refusing what does not fold: the
auditor (``hx.replay.audit``) wants a broken ledger read back so it can name the break. A
message on the run's subject that this hx cannot decode is an ``AuditError``: it could not be
checked. ``read_copy`` reads the same entries from a JSON-lines copy (``audit.jsonl`` from
``hx export``, or ``hx log dump --stream HX_LEDGER`` lines of one run).

A listing resolves each candidate's evidence anchors with ``hx.replay.anchors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from hx.harness.edits import describe
from hx.replay.anchors import AnchorResolver, ResolvedAnchor, anchors_of
from hx.replay.errors import AuditError
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from projections.ledger_records import LedgerEntry
from schemas.edits import AddRule, AnyEditOp, DropRule
from schemas.errors import HxError
from schemas.event import event_type
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HarnessShipped,
    LedgerEvent,
    ModelChanged,
    RoundDecided,
    VariantForked,
    VariantRetired,
    ledger_digest,
)
from streams.eventsourcing.layout import LEDGER_ROOT, StreamLayout
from streams.log import EventLog
from streams.topology import LEDGER

AUDITED = (ModelChanged, CandidateProposed, CandidateRevised, CriticJudged, ApprovalRequested, ApprovalGiven,
           GateJudged, HarnessShipped, VariantForked, VariantRetired)
"""The ledger events ``hx ledger`` lists: the model verdicts are made under, candidates, verdicts, approvals,
ships and what changed the pool."""
UNREADABLE = "cannot be decoded by this hx"
"""What a fault says of a message this hx cannot decode (another schema version): a reason not to check at all."""


async def read_ledger(log: EventLog, run_id: str) -> RunLedger:
    """The run's ledger, folded as it is (faults kept, chain unchecked); ``AuditError`` when the run has none.

    A message this hx cannot decode (another schema version) must not pass for a dropped event:
    that too is an ``AuditError``.
    """
    ledger = await read_run_ledger(log, run_id)
    if ledger is None:
        raise AuditError(f"run {run_id!r} has no ledger (no evolution run of that id is on {LEDGER.name})")
    unread = next((f for f in ledger.faults if UNREADABLE in f.text), None)
    if unread is not None:
        raise AuditError(f"the ledger of run {run_id!r} holds an event this hx cannot read (message {unread.seq}, "
                         f"{unread.type}): {unread.text}")
    return ledger


class _Line(msgspec.Struct):
    """One line of a ledger copy: ``audit.jsonl`` (position, digest) or ``hx log dump`` (seq, subject)."""

    type: str
    event: msgspec.Raw
    position: int | None = None
    digest: str | None = None
    version: int | None = None
    seq: int = 0
    subject: str = ""


def read_copy(path: Path, run_id: str | None = None) -> tuple[list[LedgerEntry], list[str | None], bool]:
    """(entries, recorded digests, whether positions were recorded) of a JSON-lines ledger copy (of ``run_id``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuditError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise AuditError(f"{path} is not a ledger copy: byte {exc.start} is not UTF-8 text (a JSON-lines "
                         "audit.jsonl or hx log dump output is)") from None
    entries: list[LedgerEntry] = []
    digests: list[str | None] = []
    positioned = True
    decoder = msgspec.json.Decoder(_Line)
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = decoder.decode(raw)
            cls = event_type(line.type)
            if not issubclass(cls, LedgerEvent):
                continue  # a dump of the whole stream also holds integrity records
            if line.version is not None and line.version != cls.VERSION and line.version not in cls.READS:
                raise AuditError(f"schema version {line.version}; this hx reads {cls.VERSION}")
            event = msgspec.json.decode(line.event, type=cls)
        except (msgspec.DecodeError, HxError) as exc:
            raise AuditError(f"{path} line {n} is not a ledger event: {exc}") from None
        position = line.position
        if position is None and line.subject.startswith(LEDGER_ROOT + "."):
            position = StreamLayout.parse_event_subject(line.subject)[1]
        positioned = positioned and position is not None
        entries.append(LedgerEntry(position or len(entries) + 1, line.seq, event))
        digests.append(line.digest)
    if run_id is not None:
        kept = [i for i, e in enumerate(entries) if e.event.run_id == run_id]
        entries, digests = [entries[i] for i in kept], [digests[i] for i in kept]
    if not entries:
        raise AuditError(f"{path} holds no ledger event" + (f" of run {run_id!r}" if run_id is not None else ""))
    runs = list(dict.fromkeys(e.event.run_id for e in entries))
    if len(runs) > 1 and not any(digests):
        # A dump of the whole stream; an audit.jsonl is one run's by construction (a foreign run_id is a finding).
        raise AuditError(f"{path} holds the ledgers of {len(runs)} runs ({', '.join(runs[:4])}); name the one to "
                         f"verify: hx audit verify RUN --file {path}")
    if not positioned:
        entries = [LedgerEntry(i, e.seq, e.event) for i, e in enumerate(entries, 1)]
    return entries, digests, positioned


def round_of(event: LedgerEvent) -> int | None:
    """The evolution round a ledger event belongs to (None for run-level events)."""
    value = getattr(event, "round", None)
    return value if isinstance(value, int) else None


def headline(event: LedgerEvent) -> str:
    """One line saying what a ledger event recorded (the node text of ``hx ledger``)."""
    if isinstance(event, CandidateProposed):
        ops = "; ".join(describe(op) for op in event.operations)
        built = f" (does not build: {event.build_error})" if event.build_error else ""
        return (f"candidate {event.candidate} on {event.variant} by {event.evolver}: {ops}{built}; "
                f"risk {event.risk:.1f}")
    if isinstance(event, CandidateRevised):
        ops = "; ".join(describe(op) for op in event.operations)
        return f"candidate {event.candidate} revised ({event.reason}): {ops}"
    if isinstance(event, CriticJudged):
        said = "no-op" if event.no_op else f"ranking {', '.join(event.ranking) or '(empty)'}"
        if event.unaddressed:
            said += f" (regression(s) {', '.join(event.unaddressed)} neither addressed nor accepted with a reason)"
        extra = f"; revise {', '.join(event.revisions)}" if event.revisions else ""
        concern = f"; concern: {event.strategy_concern}" if event.strategy_concern else ""
        overlap = "".join(f"; {o.candidate} {o.concerns[0]}" for o in event.overlaps[:3] if o.concerns)
        return f"critic ({event.critic}): {said}{extra}{concern}{overlap}"
    if isinstance(event, GateJudged):
        verdict = f"passed ({event.outcome})" if event.passed else _rejection(event)
        flips = sum(f.after and not f.before for f in event.flips), sum(f.before and not f.after for f in event.flips)
        rounds = ", ".join(map(str, event.trace_rounds)) or "none"
        return (f"gate on {event.candidate} ({event.variant}): {verdict}; {flips[0]} fixed, {flips[1]} broken; "
                f"trace rounds {rounds}")
    if isinstance(event, HarnessShipped):
        return (f"shipped {', '.join(event.candidates)} to {event.variant}: "
                f"{event.digest_before[:19]} -> {event.digest_after[:19]}{_rules(event.operations)}")
    if isinstance(event, VariantForked):
        return (f"forked {event.variant} from {event.parent} with {event.candidate}: {event.digest[:19]}"
                + (f" for {', '.join(event.clusters)}" if event.clusters else "") + _rules(event.operations))
    if isinstance(event, VariantRetired):
        return f"retired {event.variant}: {event.reason}"
    if isinstance(event, ModelChanged):
        return f"model {event.model} from round {event.round} on" + (f" (was {event.previous})" if event.previous
                                                                      else "")
    if isinstance(event, ApprovalRequested):
        return f"approval asked for {event.candidate} (risk {event.risk:.1f}): {event.reason}"
    if isinstance(event, ApprovalGiven):
        return f"{'approved' if event.approved else 'refused'} {event.candidate}" + (f" by {event.by}" if event.by
                                                                                       else "")
    return type(event).TYPE


def _rules(operations: Sequence[AnyEditOp]) -> str:
    """The rules a ship or fork added or dropped, as sentences (what a reader of the ledger wants of a ship)."""
    return "".join(f"; {describe(op)}" for op in operations if isinstance(op, AddRule | DropRule))


def _rejection(event: GateJudged) -> str:
    """Where a gate rejected: the first failing check, with what it found (its flips alone can read as a pass)."""
    failed = next((c for c in event.checks if not c.passed), None)
    if failed is None:
        return f"rejected at {event.first_failure or '?'}"
    return f"rejected at {failed.name}" + (f" ({failed.detail})" if failed.detail else "")


def compare_copy(copy: Sequence[LedgerEntry], on_log: Sequence[LedgerEntry] = ()) -> tuple[str, str]:
    """``(difference, note)`` of a ledger copy: against the run's ledger on the log when given, else its end."""
    if not on_log:
        return "", unfinished_note(copy)
    difference = copy_difference(copy, on_log)
    return difference, "" if difference else f"the copy's head is the head of the run on the log ({len(on_log)} events)"


def unfinished_note(entries: Sequence[LedgerEntry]) -> str:
    """A note when a ledger does not end with ``ledger.evolution_finished`` (a cut end verifies otherwise)."""
    last = entries[-1]
    if isinstance(last.event, EvolutionFinished):
        return ""
    return (f"the ledger ends at event {last.position} ({last.type}): the run is unfinished, or events were cut "
            f"from its end: compare the head with the run's (--against-log, or `hx audit verify RUN`)")


def copy_difference(copy: Sequence[LedgerEntry], on_log: Sequence[LedgerEntry]) -> str:
    """How a copy of a run's ledger differs from the run's ledger on the log, by event digest; "" when equal."""
    ours, theirs = [ledger_digest(e.event) for e in copy], [ledger_digest(e.event) for e in on_log]
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    head = f"the copy's head {ours[-1][:19]} is not the log's {theirs[-1][:19]}"
    if same < min(len(ours), len(theirs)):
        return (f"{head}: the copy differs from the log from event {copy[same].position} "
                f"(copy: {copy[same].type}, log: {on_log[same].type})")
    if len(ours) < len(theirs):
        missing = on_log[len(ours):]
        return (f"{head}: the copy is shorter, it ends at event {copy[-1].position} of the run's "
                f"{on_log[-1].position}; missing from its end: {_span_of(missing)}")
    if len(ours) > len(theirs):
        return (f"{head}: the copy is longer, with {len(ours) - len(theirs)} event(s) past the run's last "
                f"(event {on_log[-1].position}): {_span_of(copy[len(theirs):])}")
    return ""


def events_span(first: int, last: int) -> str:
    """``event 4`` or ``events 4-9``: a run of ledger positions in a message."""
    return f"event {first}" if first == last else f"events {first}-{last}"


def _span_of(entries: Sequence[LedgerEntry]) -> str:
    first, last = entries[0], entries[-1]
    return first.label if first is last else f"{first.label} .. {last.label}"


def rounds_of(entries: Sequence[LedgerEntry]) -> list[int]:
    """The evolution rounds a ledger has events of, in order."""
    return sorted({r for e in entries if (r := round_of(e.event)) is not None and r >= 0})


@dataclass(frozen=True)
class LedgerRow:
    """One listed ledger event: its round, its place, what it recorded, its evidence resolved."""

    round: int
    entry: LedgerEntry
    anchors: tuple[ResolvedAnchor, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """The JSON line ``hx ledger --json`` writes."""
        return {"round": self.round, "position": self.entry.position, "seq": self.entry.seq, "type": self.entry.type,
                "summary": headline(self.entry.event), "event": msgspec.to_builtins(self.entry.event),
                "anchors": [a.as_dict() for a in self.anchors]}


@dataclass(frozen=True)
class LedgerListing:
    """What ``hx ledger`` shows: the rows by round, each round's decision, and what resolving cost."""

    run_id: str
    events: int
    rows: tuple[LedgerRow, ...]
    decisions: dict[int, RoundDecided]
    fetched: int
    """Trace messages fetched to resolve the anchors."""
    ledger: RunLedger
    """The fold it was listed from (its faults are what does not make sense on the ledger)."""


async def listing(log: EventLog, run_id: str, round: int | None = None) -> LedgerListing:
    """Every candidate, verdict, approval and ship of a run (or of one round), anchors resolved."""
    ledger = await read_ledger(log, run_id)
    known = rounds_of(ledger.entries)
    if round is not None and round not in known:
        have = f"rounds {known[0]}..{known[-1]}" if known else "no round yet"
        raise AuditError(f"run {run_id!r} has no round {round} on its ledger ({have})")
    resolver = AnchorResolver(log, run_id)
    await resolver.prefetch(a.seq for e in ledger.entries if round is None or round_of(e.event) in (None, round)
                            for a in anchors_of(e.event))
    rows: list[LedgerRow] = []
    for entry in ledger.entries:
        ev = entry.event
        cand = ledger.candidates.get(ev.candidate) if isinstance(ev, ApprovalGiven) else None
        rnd = cand.proposal.round if cand is not None else round_of(ev)
        if rnd is None or (round is not None and rnd != round) or not isinstance(ev, AUDITED):
            continue
        rows.append(LedgerRow(rnd, entry, tuple(await resolver.resolve_all(anchors_of(ev)))))
    decisions = {n: d for n, d in ledger.decisions.items() if round is None or n == round}
    return LedgerListing(run_id, len(ledger.entries), tuple(rows), decisions, resolver.fetched, ledger)
