"""The induced evolver: rules learnt from the round's adaptation traces, no model, no hand-made list.

Each round it reads the steps of the round's adaptation attempts (``hx.aegis.induction``),
induces the rules their evidence supports, and proposes each rule a live variant does not
hold yet as one candidate (an ``AddRule`` edit, its support on the op and in the manifest).
It also proposes dropping a rule whose ship is suspected of a regression, and, when no rule
is left to try, moves numeric parameters of the variant's processors (halved, doubled) where
the processor acted on failing tasks: the levers' defaults become a search space.

Rules already judged on the variant's current harness under the model in force are not
proposed again; those judged under an earlier model come after every new one. The notes say
how many rules were induced and how many stay untried, so a round without a candidate says
why. It needs the round's trace (``Context.evidence``); without one it proposes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from hx.aegis.evolvers.base import Context, Evolver, Proposal, evidence_for, standing, suspected
from hx.aegis.evolvers.offline import MAX_PREDICTED, completed
from hx.aegis.induction import Induced, InductionSettings, induce, read_traces
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply, program_of
from hx.harness.errors import CompositionError
from schemas.edits import RULE_GROUP, AddRule, AnyEditOp, CapabilityEvidence, DropRule, Manifest, Reparam
from schemas.landscape import TaskDigest
from schemas.rules import sentence, support_phrase


def _manifest(item: Induced, tasks: Sequence[str], digests: Sequence[TaskDigest]) -> Manifest:
    said = sentence(item.rule, item.support)
    categories = tuple(dict.fromkeys(d.category for d in digests if d.task in set(tasks) and d.category))
    return Manifest(intended_effect=said, categories=categories, predicted_flips=tuple(tasks)[:MAX_PREDICTED],
                    evidence=item.anchors, attribution=RULE_GROUP,
                    capability_evidence=(CapabilityEvidence(
                        kind="induced_rule", claim=sentence(item.rule),
                        evidence=f"{support_phrase(item.support)}, in this round's adaptation attempts"),))


def scaled(value: Any) -> list[Any]:
    """The neighbours of a numeric parameter: halved and doubled (integers stay integers, at least 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return []
    if isinstance(value, int):
        return sorted({max(1, value // 2), value * 2} - {value})
    return [value / 2, value * 2]


class InducedEvolver(Evolver):
    """Propose rules induced from the round's traces, their reverts, then parameter moves."""

    name = "induced"

    def __init__(self, settings: InductionSettings | None = None) -> None:
        self.settings = settings or InductionSettings()
        """Thresholds for a context without the run's settings (the run's ``loop.induction`` wins)."""
        self.notes: list[str] = []
        self._last: tuple[int, int, list[tuple[str, tuple[AnyEditOp, ...]]]] | None = None
        """Rules induced, attempts read and the new rule candidates (variant, edits), in the last ``propose`` (None:
        it read no trace)."""

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` candidates: reverts of suspected rules, the heaviest untried rules, then parameter moves."""
        self.notes, self._last = [], None
        if context.evidence is None:
            self.notes.append("induced: no trace to read")
            return []
        traces = await read_traces(context.evidence, list(context.trace_rounds))
        found = induce(traces, context.settings.induction if context.settings else self.settings)
        new: list[Proposal] = []
        stale: list[Proposal] = []
        untried: list[tuple[str, tuple[AnyEditOp, ...]]] = []
        for variant, vstate in sorted(context.state.live().items()):
            mine = [d for d in context.digests if d.variant == variant]
            candidates = [*self._drops(context, variant, vstate.harness), *self._rules(found, variant,
                                                                                        vstate.harness, mine),
                          *self._moves(variant, vstate.harness, mine)]
            for proposal in candidates:
                status = standing(context, variant, proposal.operations)
                if status == "new":
                    new.append(proposal)
                    if any(isinstance(op, AddRule) for op in proposal.operations):
                        untried.append((variant, proposal.operations))
                elif status == "stale":
                    stale.append(proposal)
        chosen = (new + stale)[:k]
        self._last = (len(found), len(traces), untried)
        self.notes.append(self.note(chosen))
        return [completed(context, p) for p in chosen]

    def counted(self, taken: Sequence[Proposal]) -> list[str]:
        """The notes of the last ``propose``, counting the untried rule candidates left once ``taken`` (the
        proposals the round actually judges, which may be fewer than it offered) are tried."""
        return self.notes if self._last is None else [self.note(taken)]

    def note(self, taken: Sequence[Proposal]) -> str:
        """What the last ``propose`` induced, and how many untried rule candidates are left once ``taken`` are
        tried (it read a trace)."""
        assert self._last is not None
        found, attempts, untried = self._last
        tried = [(p.variant, p.operations) for p in taken]  # a list: a Reparam's params (a dict) do not hash
        left = sum(key not in tried for key in untried)
        return f"induced: {found} rule(s) from {attempts} attempt(s); {left} untried rule candidate(s) left after " \
               "this round's"

    def _rules(self, found: Sequence[Induced], variant: str, harness: HarnessConfig,
               digests: Sequence[TaskDigest]) -> list[Proposal]:
        held = set(program_of(harness, RULE_GROUP))
        failing = {d.task for d in digests if not d.solved}
        out = []
        for item in found:
            tasks = [t for t in item.tasks if t in failing]
            if item.rule in held or not tasks:
                continue
            op = AddRule(rule=item.rule, support=item.support)
            if _builds(harness, (op,)):
                out.append(Proposal(variant, (op,), _manifest(item, tasks, digests)))
        return out

    def _drops(self, context: Context, variant: str, harness: HarnessConfig) -> list[Proposal]:
        held = set(program_of(harness, RULE_GROUP))
        out = []
        for task, cid, op, broke in suspected(context, variant):
            if not isinstance(op, AddRule) or op.rule not in held:
                continue
            manifest = Manifest(intended_effect=f"undo {cid}: drop the rule `{sentence(op.rule)}`, suspected of "
                                "breaking tasks it solved before", predicted_flips=broke[:MAX_PREDICTED],
                                evidence=evidence_for(context.digests, [task]), attribution=RULE_GROUP)
            out.append(Proposal(variant, (DropRule(rule=op.rule),), manifest))
        return out

    def _moves(self, variant: str, harness: HarnessConfig, digests: Sequence[TaskDigest]) -> list[Proposal]:
        out = []
        for att in harness.attachments:
            group = att.group()
            hit = [d for d in digests if not d.solved and group in d.implicated]
            if group == RULE_GROUP or not hit:
                continue
            try:
                current = msgspec.structs.asdict(att.build())
            except CompositionError:
                continue
            for key, value in sorted(current.items()):
                for moved in scaled(value):
                    op = Reparam(group=group, params={key: moved})
                    if not _builds(harness, (op,)):
                        continue
                    manifest = Manifest(
                        intended_effect=f"move {group}.{key} from {value} to {moved}: it acted on "
                                        f"{len(hit)} failing task(s), its default is one point of a search space",
                        categories=tuple(dict.fromkeys(d.category for d in hit if d.category)),
                        predicted_flips=tuple(d.task for d in hit)[:MAX_PREDICTED],
                        evidence=tuple(a for d in hit for a in d.evidence)[:8], attribution=group)
                    out.append(Proposal(variant, (op,), manifest))
        return out


def _builds(harness: HarnessConfig, ops: tuple[AnyEditOp, ...]) -> bool:
    try:
        apply(harness, ops)
    except CompositionError:
        return False
    return True
