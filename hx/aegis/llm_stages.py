"""Optional LLM passes for two deterministic stages: a critic that re-ranks, a digester that writes prose.

``LlmCritic.review`` runs the deterministic critic first, and its verdicts stand: the
support checks, the revision requests, the candidates left out, the portfolio audit and
its bans. The model only re-orders the candidates that survived and adds concerns; a
reply that does not parse (or a model that cannot be reached) keeps the deterministic
ranking, with a concern saying so. ``llm_prose`` writes a short prose summary per failing
task (capped) for ``TaskDigest.summary``; on any failure it gives no summary and says
why in its ``notes``. Both call the model through ``MetaAgent``, so every call is on the log.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from hx.aegis import critic
from hx.aegis.critic import Review
from hx.aegis.errors import EvolverReplyError
from hx.aegis.evolvers.prompts import digests_text
from hx.aegis.evolvers.reply import parse
from hx.aegis.meta import MetaAgent
from hx.aegis.state import RunState
from hx.harness.edits import describe
from hx.runtime.code import CodeStore
from hx.runtime.errors import CodeError, ProviderError
from schemas.landscape import TaskDigest
from schemas.ledger import CandidateProposed
from schemas.messages import Message

MAX_PROSE = 20
MAX_SOURCE = 4000
MAX_SUMMARY = 600

CRITIC_SYSTEM = """You are the critic of a harness-evolution loop. The candidate edits below already passed
deterministic checks: each predicts flips on failing tasks whose failure category it claims to
address. Rank them, best first, by how likely each is to make its predicted tasks pass without
breaking tasks that pass today. Weigh: does the mechanism fit the failure evidence; could the
edit act beyond its target through state or control flow shared with other processors at the
same hooks; does it overfit to a few tasks; is its attribution signal one that will really show.
You cannot add or remove candidates. Reply with one JSON object and nothing else:
{"ranking": ["<candidate id>", "..."], "concerns": {"<candidate id>": ["<short concern>"]}}"""

PROSE_SYSTEM = """You summarise why an agent failed tasks, for engineers improving the agent's harness.
For each task below, write one or two plain sentences: what went wrong and which part of the
harness seems involved, using only the evidence given. Reply with one JSON object and nothing else:
{"summaries": {"<task id>": "<summary>"}}"""


class CriticReply(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The critic model's reply."""

    ranking: tuple[str, ...]
    concerns: dict[str, tuple[str, ...]] = {}


class ProseReply(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The prose digester's reply."""

    summaries: dict[str, str]


def _merged(kept: Sequence[str], ranked: Sequence[str]) -> tuple[str, ...]:
    """The model's order of the surviving candidates, then any it left out (``EvolverReplyError`` on others)."""
    for i, cid in enumerate(ranked):
        if cid not in kept:
            raise EvolverReplyError(f"ranking[{i}]: unknown candidate {cid!r}; candidates: {', '.join(kept)}")
        if cid in ranked[:i]:
            raise EvolverReplyError(f"ranking[{i}]: candidate {cid!r} ranked twice")
    return (*ranked, *(c for c in kept if c not in ranked))


class LlmCritic:
    """The deterministic critic, then a meta-model's re-ranking and concerns on top."""

    name = "llm"

    def __init__(self, meta: MetaAgent, store: CodeStore | None = None) -> None:
        self.meta = meta
        self.store = store

    async def review(self, state: RunState, round: int, candidates: Sequence[CandidateProposed],
                     digests: Sequence[TaskDigest], *, revised: bool) -> Review:
        """The deterministic review with the ranking re-ordered and concerns added by the model."""
        out = critic.review(state, round, candidates, digests, revised=revised)
        if not out.ranking:
            return out
        kept = [c for c in candidates if c.candidate in out.ranking]
        try:
            prompt = await self._prompt(kept, digests, out)
            completion = await self.meta.complete("critic", round, (Message(role="system", content=CRITIC_SYSTEM),
                                                                    Message(role="user", content=prompt)))
            reply = parse(completion.content, CriticReply)
            ranking = _merged(out.ranking, reply.ranking)
            unknown = sorted(set(reply.concerns) - set(out.ranking))
            if unknown:
                raise EvolverReplyError(f"concerns: unknown candidate {unknown[0]!r}")
        except (ProviderError, EvolverReplyError, CodeError) as exc:
            for cid in out.ranking:
                out.concerns.setdefault(cid, []).append(f"LLM critic unusable ({exc}); deterministic ranking kept")
            return out
        for cid in ranking:
            if cid not in reply.ranking:
                out.concerns.setdefault(cid, []).append("not ranked by the critic model; kept after the ranked ones")
            out.concerns.setdefault(cid, []).extend(f"critic model: {c}" for c in reply.concerns.get(cid, ()))
        out.ranking = ranking
        return out

    async def __call__(self, state: RunState, round: int, candidates: Sequence[CandidateProposed],
                       digests: Sequence[TaskDigest], revised: bool) -> Review:
        """``review`` with ``revised`` positional: the loop's critic callable."""
        return await self.review(state, round, candidates, digests, revised=revised)

    async def _prompt(self, kept: Sequence[CandidateProposed], digests: Sequence[TaskDigest], det: Review) -> str:
        parts = [f"Deterministic order (support times lever reputation): {', '.join(det.ranking)}"]
        for c in kept:
            m = c.manifest
            lines = [f"## {c.candidate} (variant {c.variant}; buckets {', '.join(c.buckets)}; risk {c.risk:g})",
                     "operations: " + "; ".join(describe(op) for op in c.operations),
                     f"intended effect: {m.intended_effect}", f"categories: {', '.join(m.categories)}",
                     f"predicted flips: {', '.join(m.predicted_flips)}", f"at risk: {', '.join(m.at_risk) or 'none'}",
                     f"attribution: {m.attribution}",
                     f"supported flips: {len(critic.supported(c, digests))} of {len(m.predicted_flips)}"]
            lines += [f"deterministic concern: {n}" for n in det.concerns.get(c.candidate, [])]
            if self.store is not None:
                for asset in c.code:
                    source = (await self.store.get(asset))[:MAX_SOURCE]
                    lines.append(f"new code {asset.name} ({asset.processor}):\n```python\n{source}\n```")
            parts.append("\n".join(lines))
        flips = {t for c in kept for t in c.manifest.predicted_flips}
        parts.append(digests_text([d for d in digests if d.task in flips or d.solved]))
        return "\n\n".join(parts)


class LlmProse:
    """A prose summary per failing task (at most ``cap``), from one meta-model call."""

    def __init__(self, meta: MetaAgent, cap: int = MAX_PROSE) -> None:
        self.meta = meta
        self.cap = cap
        self.notes: list[str] = []
        """Why a call gave no summaries (reset by each call)."""

    async def __call__(self, digests: Sequence[TaskDigest], round: int) -> dict[str, str]:
        """Task -> summary for the first ``cap`` failing tasks of ``round`` ({} when the model fails)."""
        self.notes = []
        failing = [d for d in digests if not d.solved][:self.cap]
        if not failing:
            return {}
        lines = []
        for d in failing:
            notes = "; ".join(a.note for a in d.evidence if a.note)
            lines.append(f"- {d.task}: {d.passes}/{d.attempts} passed; category {d.category or 'unknown'}; "
                         f"{d.continuity}; processors that acted: {', '.join(d.implicated) or 'none'}; "
                         f"features: {', '.join(f'{k}={v:g}' for k, v in sorted(d.features.items()))}"
                         + (f"; evidence: {notes}" if notes else ""))
        try:
            completion = await self.meta.complete("digester", round, (
                Message(role="system", content=PROSE_SYSTEM), Message(role="user", content="\n".join(lines))))
            reply = parse(completion.content, ProseReply)
        except (ProviderError, EvolverReplyError) as exc:
            self.notes.append(f"prose digester: {exc}")
            return {}
        asked = {d.task for d in failing}
        return {t: " ".join(s.split())[:MAX_SUMMARY] for t, s in reply.summaries.items() if t in asked and s.strip()}


def llm_prose(meta: MetaAgent, *, cap: int = MAX_PROSE) -> LlmProse:
    """The prose pass of the digester: ``await prose(digests, round)`` gives task -> summary."""
    return LlmProse(meta, cap)
