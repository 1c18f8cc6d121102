"""The Critic: each candidate's manifest against the evidence, one revision at most, then a ranking or no-op.

Deterministic by default (an LLM critic may replace ``review``, but not the gate):

- A predicted flip is *supported* when the task failed this round and its digest's
  category is one the manifest claims to address (a revert's flips are the regressions it
  undoes). A candidate with an unsupported prediction, or no evidence anchor, is asked to
  revise once; after that, one with no supported prediction is left out.
- The ship ranking orders the rest by supported flips times the reputation of their levers.
- Regressions: a round whose regressions (tasks solved in the previous round and not in this one)
  include one that no candidate addresses (predicts it flips back, e.g. by reverting the ship
  that broke it) and none accepts with a stated reason (``Manifest.accepted_regressions``) is a
  no-op, naming the tasks left unaddressed (the paper's rule).
- Overlap: for each candidate, what it shares with the harness it edits (a group it replaces,
  removes or re-parameterises; the hooks it joins and who serves them already), on the ledger so
  a reader can weigh interference.
- The portfolio audit looks across rounds: three or more ships in a row in one bucket raise
  a strategy concern; so does a lever whose hit rate fell below 0.4 in two of its last
  three shipping rounds, and that lever is banned for the next round. Only a new low rate
  raises a ban, so a ban lapses rather than renewing itself from the same old rates. The
  next planner relays the concern.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hx.aegis import levers
from hx.aegis.state import RunState
from hx.harness.edits import program_of
from hx.harness.processor import registered
from projections.ledger_records import levers_of
from schemas.edits import AddRule, Attach, DropRule, Remove, Reparam, Replace
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateConcern, CandidateProposed

STREAK = 3
LOW_HIT_RATE = 0.4


@dataclass
class Review:
    """What the critic decided about a round's candidates."""

    ranking: tuple[str, ...] = ()
    concerns: dict[str, list[str]] = field(default_factory=dict)
    revisions: dict[str, str] = field(default_factory=dict)
    """Candidate -> what to revise (only on the first pass)."""
    strategy_concern: str = ""
    banned: tuple[str, ...] = ()
    overlaps: dict[str, list[str]] = field(default_factory=dict)
    """Candidate -> what it shares with the harness it edits."""
    unaddressed: tuple[str, ...] = ()
    """Regressions no candidate addresses or accepts: the round is a no-op."""

    @property
    def no_op(self) -> bool:
        """Nothing to ship."""
        return not self.ranking

    def concern_list(self) -> tuple[CandidateConcern, ...]:
        """The concerns as ledger payloads."""
        return tuple(CandidateConcern(candidate=c, concerns=tuple(v)) for c, v in sorted(self.concerns.items()) if v)

    def overlap_list(self) -> tuple[CandidateConcern, ...]:
        """The overlaps as ledger payloads."""
        return tuple(CandidateConcern(candidate=c, concerns=tuple(v)) for c, v in sorted(self.overlaps.items()) if v)


def supported(candidate: CandidateProposed, digests: Sequence[TaskDigest]) -> tuple[str, ...]:
    """The predicted flips the round's evidence backs."""
    by_task = {d.task: d for d in digests}
    if any(isinstance(op, Remove | DropRule) for op in candidate.operations):  # a revert: its flips are regressions
        return tuple(t for t in candidate.manifest.predicted_flips if t in by_task and not by_task[t].solved)
    claims = set(candidate.manifest.categories)
    return tuple(t for t in candidate.manifest.predicted_flips
                 if t in by_task and not by_task[t].solved and by_task[t].category in claims)


def review(state: RunState, round: int, candidates: Sequence[CandidateProposed], digests: Sequence[TaskDigest],
           *, revised: bool) -> Review:
    """Judge the candidates; on the first pass (``revised`` False) ask for revisions where the manifest overreaches."""
    out = Review()
    scored: list[tuple[float, str]] = []
    records = {lv.name: lv for lv in levers.records(state, {n for c in candidates for n in levers_of(c.operations)})}
    for cand in candidates:
        notes: list[str] = []
        if cand.build_error:
            notes.append(f"does not build: {cand.build_error}")
        backed = supported(cand, digests)
        unbacked = [t for t in cand.manifest.predicted_flips if t not in backed]
        if unbacked:
            notes.append(f"{len(unbacked)} predicted flip(s) not backed by a failing task of a claimed category, "
                         f"e.g. {unbacked[0]!r}")
        if not cand.manifest.evidence:
            notes.append("no evidence anchor")
        if notes and not revised and not cand.build_error:
            out.revisions[cand.candidate] = "; ".join(notes)
        out.concerns[cand.candidate] = notes
        if backed and not cand.build_error:
            pulled = levers_of(cand.operations)
            weight = min((levers.reputation(records[n]) for n in pulled if n in records), default=1.0)
            scored.append((len(backed) * weight, cand.candidate))
    out.ranking = tuple(c for _, c in sorted(scored, key=lambda s: (-s[0], s[1])))
    out.strategy_concern, out.banned = audit(state, round)
    out.overlaps = {c.candidate: overlap(state, c) for c in candidates}
    out.unaddressed = unaddressed(state, round, candidates, digests)
    if out.unaddressed:  # the reason is CriticJudged.unaddressed (not a strategy concern the next planner relays)
        out.ranking = ()
    return out


def unaddressed(state: RunState, round: int, candidates: Sequence[CandidateProposed],
                digests: Sequence[TaskDigest]) -> tuple[str, ...]:
    """The round's regressions that no candidate answers: one that builds, on the task's variant, predicting the
    task flips back or accepting its loss with a stated reason."""
    out = []
    for r in state.regressions(round, digests):
        mine = [c for c in candidates if c.variant == r.variant and not c.build_error]
        if not any(r.task in c.manifest.predicted_flips or any(a.task == r.task and a.why.strip()
                                                                for a in c.manifest.accepted_regressions)
                   for c in mine):
            out.append(r.task)
    return tuple(sorted(out))


def overlap(state: RunState, candidate: CandidateProposed) -> list[str]:
    """What a candidate shares with its variant's harness: groups it edits there, hooks it joins and their users."""
    variant = state.variants.get(candidate.variant)
    if variant is None:
        return []
    present = {a.group(): a for a in variant.harness.attachments}
    by_hook: dict[str, list[str]] = {}
    for a in variant.harness.attachments:
        for hook in a.hooks:
            by_hook.setdefault(hook, []).append(a.type)
    out = []
    for op in candidate.operations:
        if isinstance(op, Attach):
            try:
                group = registered_group(op.processor)
            except KeyError:
                continue
            if group in present:
                out.append(f"replaces {present[group].type} in group {group}")
            shared = [f"{hook} (with {', '.join(by_hook[hook])})" for hook in op.hooks if by_hook.get(hook)]
            if shared:
                out.append(f"{op.processor} joins {'; '.join(shared)}")
        elif isinstance(op, Remove | Reparam | Replace) and op.group in present:
            verb = {Remove: "removes", Reparam: "re-parameterises", Replace: "replaces"}[type(op)]
            out.append(f"{verb} {present[op.group].type} (group {op.group})")
        elif isinstance(op, AddRule | DropRule) and op.group in present:
            held = len(program_of(variant.harness, op.group))
            verb = "adds a rule to" if isinstance(op, AddRule) else "drops a rule from"
            out.append(f"{verb} the {held} rule(s) of {op.group}")
    return out


def registered_group(processor: str) -> str:
    """The singleton group a registered processor occupies (KeyError when none is registered by that name)."""
    return registered()[processor].group()


def audit(state: RunState, round: int) -> tuple[str, tuple[str, ...]]:
    """The portfolio audit: a strategy concern (or ``""``) and the levers it bans for the next round."""
    concerns: list[str] = []
    ships = sorted(state.ships, key=lambda s: s.round)
    tail = ships[-STREAK:]
    if len(tail) == STREAK:
        common = set(tail[0].buckets).intersection(*(set(s.buckets) for s in tail[1:]))
        if common:
            concerns.append(f"the last {STREAK} ships all edit the {'/'.join(sorted(common))} bucket: weigh an edit of "
                            "another kind before adding more of the same")
    banned = []
    for name in sorted({n for s in ships for n in s.levers}):
        rates = levers.hit_rates(state, name)
        recent = [rates[r] for r in sorted(rates)[-3:]]
        # Only news bans: the outcome of the lever's ship in the previous round came in with this round's
        # rollout. A banned lever ships nothing, so the same old rates would otherwise ban it for ever.
        if sum(rate < LOW_HIT_RATE for rate in recent) >= 2 and max(rates) == round - 1:
            banned.append(name)
            concerns.append(f"lever {name} realised under {LOW_HIT_RATE:.0%} of its predicted flips in two of its "
                            "last three rounds: banned for a round")
    return " ".join(concerns), tuple(banned)
