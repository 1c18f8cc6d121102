"""The offline evolver: a search over the typed edit space of library processors, no network.

For each live variant it weighs the levers against the round's evidence:

- a regression whose suspects are ships of this variant proposes removing what they
  attached (regressions come first, as the landscape orders them);
- a processor implicated in interrupted attempts proposes relaxing its limits
  (numeric parameters that stop an attempt, doubled);
- every library processor whose ``addresses`` meet the categories of the variant's
  failing tasks, and that the variant does not hold yet, proposes attaching it at every
  hook it serves, with its default parameters; the two and three heaviest are also
  proposed together, as one larger step.

A lever's weight is the number of failing tasks whose category it addresses, times its
reputation (untried levers first, then by hit rate); banned levers and candidates already
judged on the same base harness under the same model are skipped, and those judged on it
only under an earlier model (co-evolution's policy has moved since) come after every new
one. The manifest predicts flips on exactly the supporting tasks and anchors them to their
digests' evidence. Nothing here knows a benchmark, a game or a task: only categories,
counts and the processors' declarations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from hx.aegis import levers
from hx.aegis.evolvers.base import MAX_EVIDENCE, Context, Evolver, Proposal, evidence_for, standing, suspected
from hx.harness.config import Attachment, HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harness.processor import Processor, processor_type
from projections.ledger_records import lever_of
from schemas.edits import AcceptedRegression, Attach, CapabilityEvidence, Manifest, Remove, Reparam
from schemas.landscape import TaskDigest

MAX_PREDICTED = 40
COMBINE_UP_TO = 3
"""The largest combination of attachments proposed as one candidate."""


def _summary(cls: type[Processor]) -> str:
    doc = (cls.__doc__ or "").strip().splitlines()
    return doc[0] if doc else cls.type_name()


def relaxed(att: Attachment) -> dict[str, Any] | None:
    """Doubled limits of an attachment (the ``limits`` its processor declares, where set), or None when none."""
    try:
        processor = att.build()
    except CompositionError:
        return None
    current = msgspec.structs.asdict(processor)
    out = {k: current[k] * 2 for k in type(processor).limits
           if isinstance(current.get(k), int | float) and not isinstance(current[k], bool) and current[k] > 0}
    return out or None


class OfflineEvolver(Evolver):
    """Attach, remove or re-parameterise library processors, matched to the failure categories."""

    name = "offline"

    async def propose(self, context: Context, k: int) -> list[Proposal]:
        """Up to ``k`` candidates, the heaviest levers first."""
        scored: list[tuple[float, str, Proposal]] = []
        for variant, vstate in sorted(context.state.live().items()):
            failing = [d for d in context.digests if d.variant == variant and not d.solved and d.category]
            scored += self._reverts(context, variant, vstate.harness)
            scored += self._relaxations(context, variant, vstate.harness, failing)
            singles = self._attachments(context, variant, vstate.harness, failing)
            scored += singles + _combinations(vstate.harness, sorted(singles, key=lambda s: (-s[0], s[1])))
        seen: set[tuple[str, tuple[str, ...]]] = set()
        out: list[Proposal] = []
        stale: dict[tuple[str, tuple[str, ...]], Proposal] = {}
        for _, _, proposal in sorted(scored, key=lambda s: (-s[0], s[1])):
            key = (proposal.variant, tuple(lever_of(op) for op in proposal.operations))
            if key in seen:
                continue
            status = standing(context, proposal.variant, proposal.operations)
            if status == "new":
                seen.add(key)
                out.append(proposal)
                if len(out) >= k:
                    break
            elif status == "stale":
                stale.setdefault(key, proposal)
        # Edits judged under an earlier policy come after every new one: judged again only when nothing new is left.
        chosen = out + [p for key, p in stale.items() if key not in seen][:k - len(out)]
        return [completed(context, p) for p in chosen]

    def _reverts(self, context: Context, variant: str, harness: HarnessConfig) -> list[tuple[float, str, Proposal]]:
        out = []
        for task, cid, op, broke in suspected(context, variant):
            if not isinstance(op, Attach):
                continue
            group = processor_type(op.processor).group()
            if group not in harness.groups():
                continue
            manifest = Manifest(
                intended_effect=f"undo {cid}: remove {group}, suspected of breaking tasks it solved before",
                categories=(), predicted_flips=broke[:MAX_PREDICTED], evidence=evidence_for(context.digests, [task]),
                attribution=group)
            out.append((10.0 * len(manifest.predicted_flips), f"remove:{group}",
                        Proposal(variant, (Remove(group=group),), manifest)))
        return out

    def _relaxations(self, context: Context, variant: str, harness: HarnessConfig,
                     failing: Sequence[TaskDigest]) -> list[tuple[float, str, Proposal]]:
        out = []
        interrupted = [d for d in failing if d.category == "interrupted" and d.implicated]
        for att in harness.attachments:
            group = att.group()
            hit = [d for d in interrupted if d.implicated[0] == group]
            params = relaxed(att) if hit else None
            if not hit or params is None or f"reparam:{group}" in context.landscape.banned:
                continue
            manifest = Manifest(intended_effect=f"relax {group}: it ended attempts that might have succeeded",
                                categories=("interrupted",), predicted_flips=tuple(d.task for d in hit)[:MAX_PREDICTED],
                                evidence=evidence_for(hit, [d.task for d in hit]), attribution=group)
            out.append((float(len(hit)), f"reparam:{group}", Proposal(variant, (Reparam(group=group, params=params),),
                                                                      manifest)))
        return out

    def _attachments(self, context: Context, variant: str, harness: HarnessConfig,
                     failing: Sequence[TaskDigest]) -> list[tuple[float, str, Proposal]]:
        out = []
        records = {lever.name: lever for lever in context.landscape.levers}
        groups = set(harness.groups())
        for name, cls in sorted(levers.catalog(standalone=True).items()):
            lever = records.get(name)
            if cls.group() in groups or (lever is not None and lever.banned):
                continue
            support = [d for d in failing if d.category in cls.addresses]
            if not support:
                continue
            op = Attach(processor=name, hooks=tuple(cls.accepted_hooks()))
            try:
                apply(harness, (op,))
            except CompositionError:
                continue  # this lever does not compose with the variant (a dependency it lacks, say)
            weight = len(support) * (levers.reputation(lever) if lever is not None else 1.5)
            manifest = Manifest(intended_effect=_summary(cls),
                                categories=tuple(c for c in cls.addresses if any(d.category == c for d in support)),
                                predicted_flips=tuple(d.task for d in support)[:MAX_PREDICTED],
                                evidence=evidence_for(support, [d.task for d in support]), attribution=cls.group())
            out.append((weight, name, Proposal(variant, (op,), manifest)))
        return out


def completed(context: Context, proposal: Proposal) -> Proposal:
    """A proposal with the paper's manifest fields, read from the evidence: capability evidence (each attached
    processor is a registered library processor that composes with the variant: ``apply`` built it), the variant's
    tasks that pass only sometimes in the clusters it predicts flips in (to stabilise), one trigger of its
    attribution group expected on a flipped task, and the round's regressions it does not undo that passed only
    some attempts before (a partial pass lost is within pass@k's sampling noise), each with that reason."""
    m = proposal.manifest
    capability = tuple(CapabilityEvidence(kind="builtin_processor", claim=f"{op.processor} is a library processor "
                                          f"that serves {', '.join(op.hooks)}",
                                          evidence=f"registered as {processor_type(op.processor).__module__}."
                                          f"{processor_type(op.processor).__qualname__}; the edit built on the "
                                          "variant's harness")
                       for op in proposal.operations if isinstance(op, Attach))
    clusters = {d.cluster for d in context.digests if d.task in set(m.predicted_flips)}
    stabilise = tuple(d.task for d in context.digests if d.variant == proposal.variant and d.cluster in clusters
                      and 0 < d.passes < d.attempts)[:MAX_PREDICTED]
    before = {d.task: d for d in context.state.digests.get(context.round - 1, ())}
    accepted = tuple(AcceptedRegression(task=r.task, why=f"it passed {before[r.task].passes} of "
                                        f"{before[r.task].attempts} attempts in round {context.round - 1}: losing a "
                                        "partial pass is within the sampling noise of pass@k")
                     for r in context.landscape.regressions if r.variant == proposal.variant
                     and r.task not in m.predicted_flips and r.task in before
                     and before[r.task].passes < before[r.task].attempts)
    return Proposal(proposal.variant, proposal.operations, msgspec.structs.replace(
        m, capability_evidence=m.capability_evidence or capability, stabilise=m.stabilise or stabilise,
        expected_min_calls=m.expected_min_calls or int(bool(m.attribution)),
        accepted_regressions=m.accepted_regressions or accepted), proposal.code)


def _combinations(harness: HarnessConfig,
                  singles: Sequence[tuple[float, str, Proposal]]) -> list[tuple[float, str, Proposal]]:
    """The heaviest attachments taken together (two, then three): one structural step instead of several.

    Levers that each address the same failures often help most together (one prunes what
    another would explore); proposing the combinations lets the gate try the larger step
    first, with the single levers still there if it fails.
    """
    out = []
    for size in range(2, COMBINE_UP_TO + 1):
        if len(singles) < size:
            break
        chosen = [p for _, _, p in singles[:size]]
        ops = tuple(op for p in chosen for op in p.operations)
        try:
            apply(harness, ops)
        except CompositionError:
            continue
        flips = tuple(dict.fromkeys(t for p in chosen for t in p.manifest.predicted_flips))[:MAX_PREDICTED]
        lead = chosen[0].manifest
        manifest = Manifest(
            intended_effect="; ".join(p.manifest.intended_effect for p in chosen),
            categories=tuple(dict.fromkeys(c for p in chosen for c in p.manifest.categories)),
            predicted_flips=flips, evidence=tuple(dict.fromkeys(a for p in chosen for a in p.manifest.evidence))[
                :MAX_EVIDENCE], attribution=lead.attribution)
        weight = sum(w for w, _, _ in singles[:size])
        out.append((weight, "+".join(n for _, n, _ in singles[:size]), Proposal(chosen[0].variant, ops, manifest)))
    return out


