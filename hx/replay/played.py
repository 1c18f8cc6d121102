"""Which harness each round a ledger cites played, and, for a held-out score, under which routing.

A ledger's verdicts and scores are read from trace rounds; each round's ``RoundStarted`` names
the harness it played (``harness_digest``), its variant and its tasks. An audit that only
counted a round's attempts would accept a verdict read from attempts of another harness, so
every cited round is held to the harness it stands for:

- a main round of evolution round N: its variant's harness in force during N;
- a gate's first round and every retry: the candidate's harness; under the sequential rule each
  later wave is a pair, the variant's own harness (the base) then the candidate's;
- a held-out score: the rounds from the one it cites, one a variant, together the score's tasks;
  each task under the variant its cluster routes to in the ledger as it stood when the score was
  recorded (``RunLedger.route``, a fold of the ledger: the loop used the same), and each round
  that variant's harness then. The routing is checked by the rule the run's job names
  (``loop.routing``); a job recorded before it named one, once the run has forked, leaves the
  routing unchecked and says so.

A round logged before rounds named their harness has nothing to compare and is passed over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hx.gate.rule import cluster_of
from hx.replay.ledger_checks import Problem, gate_rule, routing_rule
from hx.replay.trace_rounds import TraceRound
from projections.ledger import ROUTING, RunLedger
from projections.ledger_records import LedgerEntry
from schemas.ledger import HeldoutScored


@dataclass
class Played:
    """What comparing the cited rounds with the harness they stand for found."""

    rounds: int = 0
    """Rounds that played the harness they stand for (the cited ones, and a held-out score's later ones)."""
    problems: list[Problem] = field(default_factory=list)
    bad_rounds: set[int] = field(default_factory=set)
    """Evolution rounds whose digest cites a round of another harness."""
    bad_candidates: set[str] = field(default_factory=set)
    """Candidates whose verdict cites a round of another harness."""
    unchecked: list[str] = field(default_factory=list)
    """What could not be checked, and why."""

    def other(self, entry: LedgerEntry, tr: TraceRound, want: str, what: str) -> bool:
        """Name a round that played another harness than ``want`` (``what``); True when it did."""
        got = tr.started.harness_digest
        if not got or not want:  # a round logged before rounds named their harness: nothing to compare
            return False
        if got == want:
            self.rounds += 1
            return False
        self.problems.append(Problem("input", f"{entry.label}: trace round {tr.number} played harness {got[:19]}..., "
                                              f"but it stands for {what}, {want[:19]}...", entry.position))
        return True


def played(marks: dict[int, TraceRound], ledger: RunLedger) -> Played:
    """Hold every cited main, gate and held-out round to the harness (and routing) it stands for."""
    out = Played()
    for rnd in ledger.ordered():
        if rnd.digested is None:
            continue
        entry = ledger.entry_of(rnd.digested)
        for r in rnd.digested.trace_rounds:
            variant = ledger.variants.get(marks[r].started.variant) if r in marks else None
            version = variant.during(rnd.round) if variant is not None else None
            if variant is not None and version is not None and out.other(
                    entry, marks[r], version.digest, f"the harness {variant.name} had during round {rnd.round}"):
                out.bad_rounds.add(rnd.round)
    then = RunLedger(run_id=ledger.run_id)  # the ledger as it stood at each score: one fold for every score
    rule = routing_rule(ledger)
    for e in ledger.entries:
        if isinstance(e.event, HeldoutScored):
            # with the root alone every rule routes every cluster to it; with forks, only the rule the job names
            routed = rule == ROUTING or len(then.variants) == 1
            if not routed and not out.unchecked:
                why = ("its job, recorded before jobs named one, names no routing rule" if rule is None else
                       f"its job names the routing rule {rule!r}, which this hx does not know")
                out.unchecked.append(f"{e.label} and the held-out scores after it: which variant each task ran "
                                     f"under ({why})")
            _heldout(out, marks, then, e.event, e, routed=routed)
        then.fold(e.event, e.position, e.seq)
    sequential = gate_rule(ledger) is not None
    for cand in ledger.candidates.values():
        gate = cand.gate
        if gate is None or any(r not in marks for r in gate.trace_rounds):
            continue  # a round not on the trace is named where it is cited
        entry = ledger.entry_of(gate)
        for i, r in enumerate(gate.trace_rounds):
            base = sequential and i % 2 == 1  # rounds 1, 3, ...: a wave's base half
            want = cand.proposal.base_digest if base else cand.proposal.digest
            said = f"{gate.variant}'s harness (a wave's base half)" if base else f"{cand.id}'s harness"
            if out.other(entry, marks[r], want, said):
                out.bad_candidates.add(cand.id)
                break
    return out


def _heldout(out: Played, marks: dict[int, TraceRound], then: RunLedger, scored: HeldoutScored,
             entry: LedgerEntry, *, routed: bool) -> None:
    """The score's rounds: its tasks each under its cluster's route ``then`` (the ledger before the score), each
    round its variant's harness then."""
    first = marks.get(scored.trace_round)
    if first is None or not first.labelled:
        return  # not on the trace: named where it is cited; unlabelled: no variant to route by
    ran, r = 0, scored.trace_round
    while ran < scored.tasks and (tr := marks.get(r)) is not None and tr.started.split == "heldout" \
            and tr.started.stage_round == first.started.stage_round:
        variant = then.variants.get(tr.started.variant)
        if variant is None:
            out.problems.append(Problem("input", f"{entry.label}: trace round {r} played variant "
                                                 f"{tr.started.variant!r}, which the ledger did not hold then",
                                        entry.position))
            return
        stray = [t for t in tr.started.task_ids if routed and then.route(cluster_of(t)) != variant.name]
        if stray:
            t = stray[0]
            out.problems.append(Problem("input", f"{entry.label}: trace round {r} played {t} under {variant.name}; "
                                                 f"the ledger then routed {cluster_of(t)} to "
                                                 f"{then.route(cluster_of(t))}", entry.position))
            return
        if out.other(entry, tr, variant.current.digest, f"the harness {variant.name} had when the score was "
                                                        "recorded"):
            return
        ran, r = ran + len(tr.started.task_ids), r + 1
    if ran != scored.tasks:
        out.problems.append(Problem("input", f"{entry.label}: its held-out rounds from trace round "
                                             f"{scored.trace_round} ran {ran} task(s); it records {scored.tasks}",
                                    entry.position))
