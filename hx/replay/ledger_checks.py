"""The checks of a run's edit ledger, each naming the first thing wrong precisely: chain, folds, inputs.

- the chain: every ledger event's ``prev`` is ``ledger_digest`` (schemas.ledger) of the event
  before it and the first chains to nothing. A break is classified: an event whose body no
  longer hashes to the digest the next event chains to (or to its recorded digest) was
  *edited*; a gap in the positions is a *dropped* event; an event chaining to one that comes
  after it is *reordered*.
- the folds: replaying every ship and fork's edit operations (``hx.aegis.operations.apply``)
  on the harness its variant had at that point of the ledger gives the recorded digest, and
  the recorded harness hashes to it too (the HarnessState projection's versions are these).
- the inputs: each verdict (critic, gate) and ship names only candidates proposed (and, for a
  ship, gated) earlier on the ledger; on a run's log, the trace rounds a digest, gate or
  held-out score cites exist on ``HX_TRACE``, and every evidence anchor resolves to an event
  of the run (one message fetched per anchor, nothing else of the trace read).

Each check takes the ledger's entries as read back (``hx.replay.ledger_view``) and returns the
problems it found (``Problem``); ``hx.replay.audit`` runs them on a run's log or on a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hx.aegis.operations import apply
from hx.bench.splits import round_roles
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from hx.replay.anchors import AnchorResolver
from hx.replay.ledger_view import LedgerEntry, events_span
from schemas.edits import AnyEditOp
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LedgerOpened,
    RoundDigested,
    VariantForked,
    ledger_digest,
)
from streams.log import EventLog
from streams.topology import TRACE


@dataclass(frozen=True)
class Problem:
    """One thing wrong, named: its kind (edited, dropped, reordered, chain, fold, input, copy) and where."""

    kind: str
    text: str

    def __str__(self) -> str:
        return self.text



# --- the chain ----------------------------------------------------------------------------------


def check_chain(entries: Sequence[LedgerEntry], recorded: Sequence[str | None] = (),
                positioned: bool = True) -> list[Problem]:
    """The chain's first break, classified (edited, dropped, reordered), and events whose recorded digest is off.

    ``recorded`` holds each entry's digest as the copy recorded it (``audit.jsonl``), or None;
    ``positioned`` says whether the entries' positions came from the copy (else they are line
    numbers, and a gap cannot be seen).
    """
    digests = [ledger_digest(e.event) for e in entries]
    claimed = list(recorded) or [None] * len(entries)
    line_of = {d: i for i, d in enumerate(digests)}
    problems: list[Problem] = []
    breaks = [i for i, e in enumerate(entries) if e.event.prev != (digests[i - 1] if i else "")]
    named = -1  # the entry a break already named as edited
    if breaks:
        first = _classify(entries, digests, claimed, line_of, breaks[0], positioned)
        problems.append(first)
        named = breaks[0] - 1 if first.kind == "edited" and claimed[breaks[0] - 1] is not None else -1
        if len(breaks) > 1:
            problems.append(Problem("chain", f"{len(breaks) - 1} more break(s) after it, from "
                                             f"{entries[breaks[1]].label} on"))
    if positioned and not breaks:  # a chain re-hashed after a drop still shows the gap in the positions
        gaps = [i for i in range(len(entries)) if entries[i].position != (entries[i - 1].position + 1 if i else 1)]
        if gaps:
            at = entries[gaps[0]]
            problems.append(Problem("dropped", f"{at.label}: the chain holds but the positions jump to "
                                               f"{at.position} after {entries[gaps[0] - 1].position if gaps[0] else 0}:"
                                               " events dropped and the chain re-hashed"))
    for i, (entry, digest) in enumerate(zip(entries, digests, strict=True)):
        if claimed[i] is not None and claimed[i] != digest and i != named:
            problems.append(Problem("edited", f"{entry.label}: its body hashes to {digest[:19]}..., not to its "
                                              f"recorded digest {str(claimed[i])[:19]}...: edited"))
    return problems


def _classify(entries: Sequence[LedgerEntry], digests: list[str], claimed: list[str | None],
              line_of: dict[str, int], i: int, positioned: bool) -> Problem:
    entry = entries[i]
    prev = entry.event.prev
    if i == 0:
        j = line_of.get(prev)
        if j is not None:
            return Problem("reordered", f"{entry.label} comes first but chains to {entries[j].label}, which comes "
                                        "after it: reordered")
        if positioned and entry.position > 1:
            missing = events_span(1, entry.position - 1)
            return Problem("dropped", f"{missing} missing: the ledger starts at {entry.label}, which chains to "
                                      f"{prev[:19]}...: dropped")
        return Problem("dropped", f"{entry.label} is first but chains to {prev[:19]}..., not to nothing: the "
                                  "events before it were dropped or it was edited")
    before = entries[i - 1]
    if not prev:
        return Problem("edited", f"{entry.label}: chains to nothing, as only a ledger's first event may: edited or "
                                 "moved")
    j = line_of.get(prev)
    if j is not None and j > i - 1:
        return Problem("reordered", f"{entry.label} comes before {entries[j].label}, which it chains to: reordered")
    if j is not None:
        return Problem("reordered", f"{entry.label} chains to {entries[j].label}, not to the event before it, "
                                    f"{before.label}: reordered or duplicated")
    if claimed[i - 1] == prev:
        return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label}: {before.label} "
                                 "was edited (its body no longer hashes to the digest recorded for it and chained "
                                 "to by the next event)")
    if positioned and entry.position > before.position + 1:
        missing = events_span(before.position + 1, entry.position - 1)
        return Problem("dropped", f"{missing} missing: chain breaks between event {before.position} "
                                  f"({before.type}) and {entry.label}: dropped")
    if positioned:
        return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label}: edited")
    return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label} nor of any event "
                             "here: the event before it was edited, or events between them were dropped")


# --- the folds ----------------------------------------------------------------------------------


def _built(harness: dict[str, object] | None, base: HarnessConfig | None,
           operations: Sequence[AnyEditOp]) -> tuple[HarnessConfig | None, HarnessConfig | None, str]:
    """(the fold of ``operations`` on ``base``, the recorded harness rebuilt, why either failed)."""
    folded = recorded = None
    why = ""
    try:
        folded = apply(base, operations) if base is not None else None
    except (CompositionError, ImportError) as exc:
        why = f"its edits do not build on the harness before it: {exc}"
    try:
        recorded = HarnessConfig.from_dict(harness or {}, where="its recorded harness")
    except (CompositionError, ImportError) as exc:
        why = why or str(exc)
    return folded, recorded, why


def check_folds(entries: Sequence[LedgerEntry], *, code_missing: bool = False) -> tuple[int, list[Problem], list[str]]:
    """(ships and forks equal to their fold, problems, unchecked): every recorded digest against the fold of edits.

    ``code_missing``: the run's candidates bring new processor code that is not importable
    here (a file without the run's object store), so a ship that does not build is unchecked,
    not wrong.
    """
    variants: dict[str, HarnessConfig] = {}
    good, problems, unchecked = 0, [], []
    for entry in entries:
        ev = entry.event
        if isinstance(ev, LedgerOpened):
            _, recorded, why = _built(ev.harness, None, ())
            if recorded is None or recorded.digest != ev.digest:
                found = f"does not build ({why})" if recorded is None else f"hashes to {recorded.digest[:19]}..."
                problems.append(Problem("fold", f"{entry.label}: the initial harness {found}, not to its recorded "
                                                f"digest {ev.digest[:19]}..."))
            if recorded is not None:
                variants[ev.variant] = recorded
            continue
        if not isinstance(ev, HarnessShipped | VariantForked):
            continue
        on = ev.variant if isinstance(ev, HarnessShipped) else ev.parent
        digest = ev.digest_after if isinstance(ev, HarnessShipped) else ev.digest
        base = variants.get(on)
        if base is None:
            problems.append(Problem("fold", f"{entry.label}: edits variant {on!r}, which no earlier event of the "
                                            "ledger opened or forked"))
            continue
        wrong: list[str] = []
        if isinstance(ev, HarnessShipped) and ev.digest_before != base.digest:
            wrong.append(f"it records digest_before {ev.digest_before[:19]}..., but the ledger before it folds "
                         f"{on} to {base.digest[:19]}...")
        folded, recorded, why = _built(ev.harness, base, ev.operations)
        if why and code_missing:
            unchecked.append(f"{entry.label}: its edits name processor code only the run's object store holds")
            continue
        if why:
            wrong.append(why)
        if folded is not None and folded.digest != digest:
            wrong.append(f"its edits applied to {on}'s harness give {folded.digest[:19]}..., it records "
                         f"{digest[:19]}...")
        if recorded is not None and recorded.digest != digest:
            wrong.append(f"its recorded harness hashes to {recorded.digest[:19]}..., not {digest[:19]}...")
        problems += [Problem("fold", f"{entry.label}: {w}") for w in wrong]
        good += not wrong
        variants[ev.variant] = folded or recorded or base
    return good, problems, unchecked


# --- the verdicts' inputs -----------------------------------------------------------------------


@dataclass
class _Inputs:
    """What the ledger has shown so far, as a verdict's inputs are checked against it."""

    proposed: dict[str, LedgerEntry] = field(default_factory=dict)
    operations: dict[str, tuple[AnyEditOp, ...]] = field(default_factory=dict)
    """Candidate -> its operations as last proposed or revised."""
    passed: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)


def check_inputs(entries: Sequence[LedgerEntry]) -> tuple[list[LedgerEntry], list[Problem]]:
    """(verdicts whose candidates are on the ledger before them, problems): ledger-internal inputs only."""
    seen = _Inputs()
    verdicts: list[LedgerEntry] = []
    problems: list[Problem] = []

    def need(entry: LedgerEntry, cids: Sequence[str], what: str = "no earlier candidate_proposed proposed") -> bool:
        missing = [c for c in dict.fromkeys(cids) if c not in seen.proposed]
        for c in missing:
            problems.append(Problem("input", f"{entry.label}: names candidate {c}, which {what}"))
        return not missing

    for entry in entries:
        ev = entry.event
        if isinstance(ev, CandidateProposed):
            seen.proposed.setdefault(ev.candidate, entry)
            seen.operations[ev.candidate] = ev.operations
        elif isinstance(ev, CandidateRevised):
            if need(entry, [ev.candidate]):
                seen.operations[ev.candidate] = ev.operations
        elif isinstance(ev, CriticJudged):
            named = [*ev.ranking, *ev.revisions, *(c.candidate for c in ev.concerns)]
            if need(entry, named):
                verdicts.append(entry)
        elif isinstance(ev, GateJudged):
            if need(entry, [ev.candidate]):
                verdicts.append(entry)
            if ev.passed:
                seen.passed.add(ev.candidate)
        elif isinstance(ev, ApprovalRequested):
            need(entry, [ev.candidate])
            seen.asked.add(ev.candidate)
        elif isinstance(ev, ApprovalGiven) and ev.candidate not in seen.asked:
            problems.append(Problem("input", f"{entry.label}: answers for candidate {ev.candidate}, for which no "
                                             "earlier approval_requested asked"))
        elif isinstance(ev, HarnessShipped | VariantForked):
            cids = ev.candidates if isinstance(ev, HarnessShipped) else (ev.candidate,)
            if need(entry, cids):
                for c in cids:
                    if c not in seen.passed:
                        problems.append(Problem("input", f"{entry.label}: ships candidate {c}, which no earlier "
                                                         "gate_judged passed"))
                if ev.operations != tuple(op for c in cids for op in seen.operations[c]):
                    problems.append(Problem("input", f"{entry.label}: its edits are not those of "
                                                     f"{', '.join(cids)} as proposed (or revised) on the ledger"))
    return verdicts, problems


async def check_trace(log: EventLog, run_id: str, entries: Sequence[LedgerEntry],
                      verdicts: list[LedgerEntry]) -> tuple[list[LedgerEntry], int, int, list[Problem]]:
    """(verdicts whose trace inputs exist, anchors resolved, trace rounds found, problems): reads only what is cited."""
    roles = await round_roles(log, run_id)
    resolver = AnchorResolver(log, run_id)
    problems: list[Problem] = []
    bad_candidates: set[str] = set()
    bad_rounds: set[int] = set()  # evolution rounds whose digest cites a missing trace round
    cited: set[int] = set()
    anchors = 0
    for entry in entries:
        ev = entry.event
        rounds: tuple[int, ...] = ()
        if isinstance(ev, RoundDigested | GateJudged):
            rounds = ev.trace_rounds
        elif isinstance(ev, HeldoutScored):
            rounds = (ev.trace_round,)
        for r in rounds:
            cited.add(r)
            if r not in roles:
                problems.append(Problem("input", f"{entry.label}: cites trace round {r}, which is not on "
                                                 f"{TRACE.name} for run {run_id!r}"))
                if isinstance(ev, RoundDigested):
                    bad_rounds.add(ev.round)
                elif isinstance(ev, GateJudged):
                    bad_candidates.add(ev.candidate)
        evidence = (ev.manifest.evidence if isinstance(ev, CandidateProposed | CandidateRevised) else
                    tuple(a for d in ev.digests for a in d.evidence) if isinstance(ev, RoundDigested) else ())
        for resolved in await resolver.resolve_all(evidence):
            if resolved.resolved:
                anchors += 1
                continue
            a = resolved.anchor
            problems.append(Problem("input", f"{entry.label}: evidence anchor {a.seq}:{a.index} ({a.note or 'no note'})"
                                             f" is unresolved: {resolved.problem}"))
            if isinstance(ev, CandidateProposed | CandidateRevised):
                bad_candidates.add(ev.candidate)
    good = []
    for entry in verdicts:
        ev = entry.event
        cids = {ev.candidate} if isinstance(ev, GateJudged) else set(ev.ranking) if isinstance(
            ev, CriticJudged) else set()
        rnd = getattr(ev, "round", None)
        if not cids & bad_candidates and rnd not in bad_rounds:
            good.append(entry)
    return good, anchors, len(cited & set(roles)), problems
