"""The checks of a run's edit ledger on the ledger alone, each naming the first thing wrong: chain, keys, decisions.

Each check reads the ledger's one fold (``projections.ledger.RunLedger``) and returns the
problems it found (``Problem``); ``hx.replay.audit`` runs them (and ``hx.replay.trace_checks``,
which reads what the ledger cites on ``HX_TRACE``) on a run's log or on a copy.

- the fold: what the fold could not take (a non-ledger event on the run's subject, a position
  written twice, an event after ``ledger.evolution_finished``, a name the ledger never made);
- the chain: every event's ``prev`` is ``ledger_digest`` of the event before it, the first chains
  to nothing, positions run 1, 2, 3... A break is classified: an event whose body no longer
  hashes to the digest the next event chains to (or to its recorded digest) was *edited*; a gap
  in the positions is a *dropped* event; an event chaining to one after it is *reordered*;
- the signatures: in a ledger whose ``ledger.opened`` records a key, every event is signed by it;
- the folds: every harness version is what its operations make of the harness before it, and
  hashes to its recorded digest;
- the decisions: every gate verdict follows from its own checks by the gate's rule
  (``hx.gate.rule``, with the interval check the run's recorded job asks for); every ship or
  fork carries candidates the gate passed for exactly that (and a human approved where one
  was asked or the risk called for it), their operations and
  nothing else, on the harness they were judged on, once; a round's decision names only what it
  shipped; a held-out score is of the run's frozen split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hx.gate.interval import INTERVAL_MODES, IntervalMode
from hx.gate.rule import disagreement
from hx.gate.sequential import SequentialRule
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from projections.ledger import RunLedger
from projections.ledger_records import HarnessVersion, LedgerEntry, ShipRecord
from schemas.edits import AnyEditOp
from schemas.harness import HarnessSpec
from schemas.job import nested_job
from schemas.ledger import HarnessShipped, VariantForked, ledger_digest
from streams.signing import verify

DEFAULT_RISK_THRESHOLD = 0.7
"""``EvolveSettings.risk_threshold``'s default, for a ledger whose settings do not record it."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong, named: its kind (edited, dropped, reordered, chain, structure, signature, fold, decision,
    input, copy) and the event it is about."""

    kind: str
    text: str
    position: int = 0
    """The ledger position it is about (0: none in particular); problems are reported in this order."""

    def __str__(self) -> str:
        return self.text


def gate_rule(ledger: RunLedger) -> SequentialRule | None:
    """The seesaw rule the run's gate ran with, as its recorded job says (None: ``retry``, also for a job recorded
    before the rule could be chosen)."""
    if ledger.opened is None:
        return None
    gate = nested_job(ledger.opened.settings)["loop"].get("gate") or {}
    if not isinstance(gate, dict) or gate.get("seesaw", "retry") == "retry":
        return None
    # A rule this hx does not know is decided as the sequential rule with the recorded numbers.
    defaults = SequentialRule()
    return SequentialRule(float(gate.get("drop", defaults.drop)), float(gate.get("alpha", defaults.alpha)),
                          int(gate.get("waves", defaults.waves)))


def routing_rule(ledger: RunLedger) -> str | None:
    """The routing rule the run's job records (None: a job recorded before it named one)."""
    if ledger.opened is None:
        return None
    rule = nested_job(ledger.opened.settings)["loop"].get("routing")
    return rule if isinstance(rule, str) else None


def gate_interval(ledger: RunLedger) -> IntervalMode:
    """The interval mode the run's gate ran with, as its recorded job says (``off`` for a job recorded before it)."""
    if ledger.opened is None:
        return "off"
    gate = nested_job(ledger.opened.settings)["loop"].get("gate") or {}
    mode = gate.get("interval", "off") if isinstance(gate, dict) else "off"
    # A recorded mode this hx does not know is decided as the strictest: only a KEEP passes it.
    return next((m for m in INTERVAL_MODES if m == mode), "keep")


def gate_suite(ledger: RunLedger) -> str:
    """The digest of the suite the run's gate played for its ``suite`` check ("" when the check was off)."""
    if ledger.opened is None:
        return ""
    gate = nested_job(ledger.opened.settings)["loop"].get("gate") or {}
    if not isinstance(gate, dict) or not gate.get("suite"):
        return ""
    return str(gate.get("suite_digest") or "unknown")


def label(entry: LedgerEntry) -> str:
    """How a problem names an event: ``event 17 (ledger.gate_judged)``."""
    return entry.label


def events_span(first: int, last: int) -> str:
    """``event 4`` or ``events 4-9``: a run of ledger positions in a message."""
    return f"event {first}" if first == last else f"events {first}-{last}"


# --- the fold ------------------------------------------------------------------------------------


def check_fold(ledger: RunLedger) -> list[Problem]:
    """What the fold could not take, but the chain's own breaks (``check_chain`` names those more precisely)."""
    return [Problem(f.kind, str(f), f.position) for f in ledger.faults if f.kind not in _CHAIN_KINDS]


_CHAIN_KINDS = ("chain", "dropped", "reordered")
"""Faults of the chain's order, which ``check_chain`` classifies on the events as they arrived."""


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
                                             f"{entries[breaks[1]].label} on", entries[breaks[1]].position))
    if positioned and not breaks:  # a chain re-hashed after a drop still shows the gap in the positions
        gaps = [i for i in range(len(entries)) if entries[i].position != (entries[i - 1].position + 1 if i else 1)]
        if gaps:
            at = entries[gaps[0]]
            problems.append(Problem("dropped", f"{at.label}: the chain holds but the positions jump to "
                                               f"{at.position} after {entries[gaps[0] - 1].position if gaps[0] else 0}:"
                                               " events dropped and the chain re-hashed", at.position))
    for i, (entry, digest) in enumerate(zip(entries, digests, strict=True)):
        if claimed[i] is not None and claimed[i] != digest and i != named:
            problems.append(Problem("edited", f"{entry.label}: its body hashes to {digest[:19]}..., not to its "
                                              f"recorded digest {str(claimed[i])[:19]}...: edited", entry.position))
    return problems


def _classify(entries: Sequence[LedgerEntry], digests: list[str], claimed: list[str | None],
              line_of: dict[str, int], i: int, positioned: bool) -> Problem:
    entry = entries[i]
    prev = entry.event.prev
    at = entry.position
    if i == 0:
        j = line_of.get(prev)
        if j is not None:
            return Problem("reordered", f"{entry.label} comes first but chains to {entries[j].label}, which comes "
                                        "after it: reordered", at)
        if positioned and entry.position > 1:
            missing = events_span(1, entry.position - 1)
            return Problem("dropped", f"{missing} missing: the ledger starts at {entry.label}, which chains to "
                                      f"{prev[:19]}...: dropped", at)
        return Problem("dropped", f"{entry.label} is first but chains to {prev[:19]}..., not to nothing: the "
                                  "events before it were dropped or it was edited", at)
    before = entries[i - 1]
    if not prev:
        return Problem("edited", f"{entry.label}: chains to nothing, as only a ledger's first event may: edited or "
                                 "moved", at)
    j = line_of.get(prev)
    if j is not None and j > i - 1:
        return Problem("reordered", f"{entry.label} comes before {entries[j].label}, which it chains to: reordered", at)
    if j is not None:
        return Problem("reordered", f"{entry.label} chains to {entries[j].label}, not to the event before it, "
                                    f"{before.label}: reordered or duplicated", at)
    if claimed[i - 1] == prev:
        return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label}: {before.label} "
                                 "was edited (its body no longer hashes to the digest recorded for it and chained "
                                 "to by the next event)", before.position)
    if positioned and entry.position > before.position + 1:
        missing = events_span(before.position + 1, entry.position - 1)
        return Problem("dropped", f"{missing} missing: chain breaks between event {before.position} "
                                  f"({before.type}) and {entry.label}: dropped", before.position + 1)
    if positioned:
        return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label}: edited", at)
    return Problem("edited", f"{entry.label}: prev does not match the digest of {before.label} nor of any event "
                             "here: the event before it was edited, or events between them were dropped", at)


# --- the signatures -------------------------------------------------------------------------------


def check_signatures(ledger: RunLedger) -> tuple[int, list[Problem]]:
    """(events signed by the run's key, problems): in a signed ledger every event on its subject verifies with its
    key, those the fold refused included."""
    key = ledger.opened.public_key if ledger.opened is not None else ""
    if not key:
        return 0, []
    good, problems = 0, []
    for entry in ledger.arrived:  # every ledger event on the run's subject, taken by the fold or not
        why = verify(key, ledger_digest(entry.event), entry.event.signature)
        if why:
            problems.append(Problem("signature", f"{entry.label}: {why}: it was not written by the key the run was "
                                                 "opened with", entry.position))
        else:
            good += 1
    return good, problems


# --- the folds ----------------------------------------------------------------------------------


def _built(recorded: HarnessSpec, what: str) -> tuple[HarnessConfig | None, str]:
    try:
        return HarnessConfig.from_spec(recorded, where=what), ""
    except (CompositionError, ImportError) as exc:
        return None, str(exc)


def _base(ledger: RunLedger, ship: ShipRecord) -> HarnessVersion | None:
    """The version the ship's operations were applied to: its variant's (its parent's, for a fork) just before it."""
    variant = ledger.variants.get(ship.on)
    return variant.before(ship.position) if variant is not None else None


def check_folds(ledger: RunLedger, *, code_missing: bool = False) -> tuple[int, list[Problem], list[str]]:
    """(ships and forks equal to their fold, problems, unchecked): every recorded digest against the fold of edits.

    ``code_missing``: the run's candidates bring new processor code that is not importable
    here (a file without the run's object store), so a ship that does not build is unchecked,
    not wrong.
    """
    good, problems, unchecked = 0, [], []
    built: dict[str, HarnessConfig] = {}
    opened = ledger.opened
    if opened is not None:
        entry = ledger.entries[0]
        initial, why = _built(opened.harness, "the initial harness")
        if initial is None or initial.digest != opened.digest:
            found = f"does not build ({why})" if initial is None else f"hashes to {initial.digest[:19]}..."
            problems.append(Problem("fold", f"{entry.label}: the initial harness {found}, not to its recorded "
                                            f"digest {opened.digest[:19]}...", entry.position))
        if initial is not None:
            built[opened.digest] = initial
    for ship in ledger.shipments:
        ev, where = ship.event, f"event {ship.position} ({type(ship.event).TYPE})"
        base = _base(ledger, ship)
        harness = built.get(base.digest) if base is not None else None
        if base is None or harness is None:
            continue  # the base did not build: named where it was recorded
        wrong: list[str] = []
        if isinstance(ev, HarnessShipped) and ev.digest_before != base.digest:
            wrong.append(f"it records digest_before {ev.digest_before[:19]}..., but the ledger before it folds "
                         f"{ship.on} to {base.digest[:19]}...")
        folded = recorded = None
        why = ""
        try:
            folded = apply(harness, ev.operations)
        except (CompositionError, ImportError) as exc:
            why = f"its edits do not build on the harness before it: {exc}"
        recorded, not_built = _built(ev.harness, "its recorded harness")
        why = why or not_built
        if why and code_missing:
            unchecked.append(f"{where}: its edits name processor code only the run's object store holds")
            continue
        if why:
            wrong.append(why)
        if folded is not None and folded.digest != ship.digest:
            wrong.append(f"its edits applied to {ship.on}'s harness give {folded.digest[:19]}..., it records "
                         f"{ship.digest[:19]}...")
        if recorded is not None and recorded.digest != ship.digest:
            wrong.append(f"its recorded harness hashes to {recorded.digest[:19]}..., not {ship.digest[:19]}...")
        problems += [Problem("fold", f"{where}: {w}", ship.position) for w in wrong]
        good += not wrong
        kept = folded or recorded
        if kept is not None:
            built[ship.digest] = kept
    return good, problems, unchecked


# --- the decisions ------------------------------------------------------------------------------


def check_decisions(ledger: RunLedger) -> tuple[int, list[Problem]]:
    """(gate verdicts that follow from their checks, problems): verdicts, ships, forks, decisions, held-out scores."""
    if ledger.opened is None:
        return 0, []
    threshold = float(nested_job(ledger.opened.settings)["loop"].get("risk_threshold", DEFAULT_RISK_THRESHOLD))
    allow_fork = ledger.opened.strategy == "ensemble"
    interval, suite = gate_interval(ledger), bool(gate_suite(ledger))
    problems: list[Problem] = []
    consistent = 0
    for cand in ledger.candidates.values():
        if cand.gate is None:
            continue
        why = disagreement(cand.gate, allow_fork=allow_fork, interval=interval, suite=suite)
        if why:
            problems.append(Problem("decision", f"event {cand.gate_position} (ledger.gate_judged): the verdict on "
                                                f"{cand.id} does not follow from its own checks: {why}",
                                    cand.gate_position))
        else:
            consistent += 1
        if cand.gate.passed and cand.proposal.build_error:
            problems.append(Problem("decision", f"event {cand.gate_position} (ledger.gate_judged): passes {cand.id}, "
                                                f"whose operations do not build ({cand.proposal.build_error})",
                                    cand.gate_position))
    shipped: dict[str, int] = {}
    for ship in ledger.shipments:
        problems += _check_ship(ledger, ship, threshold, shipped)
    for n, rnd in sorted(ledger.rounds.items()):
        decided = rnd.decided
        if decided is None:
            continue
        made = {c for s in rnd.ships for c in s.candidates}
        stray = [c for c in decided.shipped if c not in made]
        at = ledger.entry_of(decided).position
        if stray:
            problems.append(Problem("decision", f"event {at} (ledger.round_decided): round {n} says it shipped "
                                                f"{', '.join(stray)}, which no ship of the round carried", at))
        if decided.shipped and decided.outcome != "shipped":
            problems.append(Problem("decision", f"event {at} (ledger.round_decided): round {n} lists ships but its "
                                                f"outcome is {decided.outcome!r}", at))
    for scored in ledger.heldout:
        if scored.heldout_digest != ledger.opened.heldout_digest:
            entry = ledger.entry_of(scored)
            problems.append(Problem("decision", f"{entry.label}: scores held-out split {scored.heldout_digest[:19]}, "
                                                f"not the run's frozen split {ledger.opened.heldout_digest[:19]}",
                                    entry.position))
    return consistent, problems


def _check_ship(ledger: RunLedger, ship: ShipRecord, threshold: float, shipped: dict[str, int]) -> list[Problem]:
    """Why a ship or fork is not the one its candidates' verdicts allow."""
    ev, where = ship.event, f"event {ship.position} ({type(ship.event).TYPE})"
    out: list[str] = []
    inputs: list[str] = []
    kind = "ship" if isinstance(ev, HarnessShipped) else "fork"
    base = _base(ledger, ship)
    operations: list[AnyEditOp] = []
    for cid in ship.candidates:
        cand = ledger.candidates[cid]
        operations += cand.proposal.operations
        gate = cand.gate
        if cid in shipped:
            out.append(f"ships {cid} again (it shipped at event {shipped[cid]})")
        shipped.setdefault(cid, ship.position)
        if gate is None or cand.gate_position > ship.position:
            out.append(f"ships candidate {cid}, which no earlier gate_judged judged")
            continue
        if not gate.passed:
            out.append(f"ships candidate {cid}, which the gate rejected at {gate.first_failure or '?'} "
                       f"(event {cand.gate_position})")
        elif gate.outcome != kind:
            out.append(f"is a {kind} of {cid}, but the gate passed it for a {gate.outcome} (event "
                       f"{cand.gate_position})")
        elif isinstance(ev, VariantForked) and tuple(ev.clusters) != tuple(gate.clusters):
            out.append(f"forks for clusters {', '.join(ev.clusters) or 'none'}, the gate passed "
                       f"{', '.join(gate.clusters) or 'none'}")
        asked = cand.request is not None or cand.proposal.risk > threshold
        if asked and not (cand.answer is not None and cand.answer.approved and cand.answer_position < ship.position):
            why = "was refused" if cand.answer is not None and not cand.answer.approved else "has no earlier approval"
            out.append(f"ships candidate {cid} (risk {cand.proposal.risk:.2f}), which waits for a human and {why}")
        if cand.proposal.variant != ship.on:
            out.append(f"applies {cid} to {ship.on}; it was proposed on {cand.proposal.variant}")
        elif base is not None and cand.proposal.base_digest != base.digest:
            out.append(f"applies {cid} to {ship.on}'s harness {base.digest[:19]}; it was judged on "
                       f"{cand.proposal.base_digest[:19]}")
    if tuple(ev.operations) != tuple(operations):
        inputs.append(f"its edits are not those of {', '.join(ship.candidates)} as proposed (or revised) on the "
                      "ledger")
    return [*(Problem("decision", f"{where}: {w}", ship.position) for w in out),
            *(Problem("input", f"{where}: {w}", ship.position) for w in inputs)]
