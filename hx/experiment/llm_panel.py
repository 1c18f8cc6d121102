"""The LLM panel: the three personas as model calls through hx's router, every call on the log.

Each persona gets its own system prompt and the same account of the experiment (the spec, the
seeded order, the conclusion with its intervals, what each arm's attempts recorded) and must
answer with one JSON object: ``{"verdict": ..., "reasons": [...]}``, the optimizer with
``"proposal"`` too, the next ``ExperimentSpec``. A reply that does not parse, a verdict off the
persona's scale, a proposal ``hx experiment run`` would refuse, or a model that cannot be
reached is a rejection recorded in ``PanelReviewed``: the persona counts as its scale's worst
(the optimizer's proposal is then the offline panel's), and the review goes on.

Calls land under ``hx.trace.<experiment run>.0.panel:<persona>.<review>`` as ``model.request`` /
``model.response`` (or ``model.error``), like AEGIS's meta-agent calls.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec

from hx.aegis.errors import EvolverReplyError
from hx.aegis.evolvers.reply import json_object
from hx.experiment.design import units
from hx.experiment.errors import ReplyUnparsed, SpecRejected
from hx.experiment.offline_panel import offline_review
from hx.experiment.panel import PERSONAS, SCALES, TITLES, ExperimentRecord, decide, proposal_json, worst
from hx.experiment.spec import parse_spec, spec_to_dict
from hx.runtime.errors import ProviderError
from hx.runtime.models import ModelConfig
from hx.runtime.providers.base import CallContext
from hx.runtime.router import ModelRouter
from hx.runtime.tracer import AttemptTracer, LogWriter
from schemas.messages import Message
from schemas.panel import PanelReviewed, Persona, PersonaRejection, PersonaVerdict
from streams.log import EventLog
from streams.redaction import scrub
from streams.topology import trace_subject

PANEL_ROLE = "main"
PANEL_ROUND = 0
"""Panel calls sit in round 0 of the experiment run, under their own task ``panel:<persona>``."""
REPLY_SHOWN = 400
"""Characters of a rejected reply kept in the review."""

_SHAPE = ('Reply with one JSON object and nothing else: {"verdict": "<one of %s>", "reasons": ["<short reason>", '
          '...]%s}')

SYSTEMS: dict[Persona, str] = {
    "methodologist": """You review the design of a controlled experiment on an AI agent's harness, not its results.
Judge whether the design can answer its question at all: is the hypothesis falsifiable (a falsified_if the
data decided); are there enough replications per cell (three or more is sound, two is marginal, one is not);
did the units run in the seeded random order the spec implies; did the arms differ in anything besides the
factor (model, harness, step cap, stop rule, options); was a test range reused that an earlier run had
already seen. SOUND: none of these flaws. MARGINAL: a weakness that leaves the data readable. UNSOUND: a
flaw that makes the data uninterpretable whatever they show.""",
    "auditor": """You audit whether an experiment's conclusion follows from its data. Check that the falsification
verdict agrees with the intervals: a hypothesis left standing needs an effect whose interval excludes zero
in the claimed direction; a refuted one must not have such an effect. Look for alternative explanations the
experiment leaves open, such as infrastructure failures or interrupted attempts that hit one arm more than
another. VALID: the conclusion follows and the alternatives are closed. INCONCLUSIVE: the data cannot settle
it. INVALID: the conclusion drawn contradicts the data.""",
    "optimizer": """You decide what a research loop on an AI agent's harness should run next. Weigh the main effect
against its noise (the interval's half-width against the estimate). ADVANCE: the effect is clear and
worth building on; propose the next level of the factor, or the same contrast on fresh tasks. REVISE: the
effect may be real but the interval is too wide; propose the same experiment with more replications, sized
from the observed spread. REDESIGN: the effect is too small to resolve at a sensible size, or the design is
flawed; propose a fixed or different design. The proposal is a complete experiment spec in the same JSON
shape as the spec you are given (title, hypothesis, falsified_if, factors, tasks, replications,
response_variables, controlled_variables, seed, design); it must change exactly one thing per factor and
its falsified_if may only name its own response variables and levels.""",
}


def system_prompt(persona: Persona) -> str:
    """A persona's system prompt: its brief, then the reply shape with its scale."""
    scale = " | ".join(SCALES[persona])
    extra = ', "proposal": {<the next experiment spec>}' if persona == "optimizer" else ""
    return f"You are the {TITLES[persona]} of an experiment panel. {SYSTEMS[persona]}\n{_SHAPE % (scale, extra)}"


class PersonaReply(msgspec.Struct, frozen=True, kw_only=True):
    """A persona's reply as the model writes it (unknown keys are ignored)."""

    verdict: str
    reasons: tuple[str, ...] = ()
    proposal: dict[str, Any] | None = None


def account(record: ExperimentRecord) -> str:
    """The experiment as every persona is shown it: one JSON document."""
    order = list(record.started.order)
    concluded = record.concluded
    doc = {
        "run": record.run_id,
        "spec": spec_to_dict(record.spec),
        "order": {"units": len(order), "first": order[:12], "is_the_seeded_shuffle": order == [
            u.key for u in units(record.spec)], "is_sorted": order == sorted(order)},
        "conclusion": {"units": concluded.units, "falsified": concluded.falsified, "detail": concluded.detail,
                       "levels": msgspec.to_builtins(concluded.levels),
                       "effects": msgspec.to_builtins(concluded.effects),
                       "interactions": msgspec.to_builtins(concluded.interactions)},
        "arms": [{"cell": a.cell, "models": sorted(a.models), "harness_digests": sorted(a.harnesses),
                  "step_caps_hit": sorted(a.step_caps), "finished_attempts": a.units, "lost_attempts": a.lost}
                 for a in record.arms.values()],
        "test_tasks_played_by_earlier_runs": list(record.reused_test_tasks),
    }
    return json.dumps(doc, indent=1, sort_keys=True)


def judge_reply(persona: Persona, text: str) -> tuple[PersonaVerdict, dict[str, Any] | None]:
    """A reply as the persona's verdict (and, optimizer, its proposal validated); ``ReplyUnparsed`` says why not."""
    try:
        reply = msgspec.convert(json_object(text), PersonaReply)
    except EvolverReplyError as exc:
        raise ReplyUnparsed(str(exc)) from None
    except msgspec.ValidationError as exc:
        raise ReplyUnparsed(f"reply: {exc}") from None
    if reply.verdict not in SCALES[persona]:
        raise ReplyUnparsed(f"verdict: {reply.verdict!r} is not on the {TITLES[persona]}'s scale "
                            f"({', '.join(SCALES[persona])})")
    proposal = None
    if persona == "optimizer":
        if reply.proposal is None:
            raise ReplyUnparsed("proposal: missing; the optimizer must propose the next experiment spec")
        try:
            proposal = proposal_json(parse_spec(reply.proposal, where="proposal"))
        except SpecRejected as exc:
            raise ReplyUnparsed(str(exc)) from None
    return PersonaVerdict(persona=persona, verdict=reply.verdict, reasons=reply.reasons), proposal


class LlmPanel:
    """The three personas asked through one model config; ``review`` appends nothing, it returns the event."""

    def __init__(self, models: ModelConfig, log: EventLog) -> None:
        self.models = models
        self.log = log
        self._router = ModelRouter(models, log=log)

    async def _ask(self, record: ExperimentRecord, persona: Persona, prompt: str) -> str:
        subject = trace_subject(record.run_id, PANEL_ROUND, f"panel:{persona}", record.reviews)
        tracer = AttemptTracer(LogWriter(self.log), subject)
        ctx = CallContext(run_id=record.run_id, round=PANEL_ROUND, task_id=f"panel:{persona}",
                          attempt=record.reviews, step=1)
        messages = (Message(role="system", content=system_prompt(persona)), Message(role="user", content=prompt))
        try:
            _, completion = await self._router.complete(PANEL_ROLE, messages, (), ctx, tracer.emit)
        finally:
            await tracer.drain()
        return completion.content

    async def _persona(self, record: ExperimentRecord, persona: Persona,
                       prompt: str) -> tuple[PersonaVerdict, dict[str, Any] | None, PersonaRejection | None]:
        text = ""
        try:
            text = await self._ask(record, persona, prompt)
            verdict, proposal = judge_reply(persona, text)
            return verdict, proposal, None
        except (ProviderError, ReplyUnparsed) as exc:
            why = scrub(str(exc) if isinstance(exc, ReplyUnparsed) else f"model unreachable: {exc}")
            rejection = PersonaRejection(persona=persona, reason=why, reply=scrub(text[:REPLY_SHOWN]))
            verdict = PersonaVerdict(persona=persona, verdict=worst(persona), reasons=(f"reply rejected: {why}",))
            return verdict, None, rejection

    async def review(self, record: ExperimentRecord) -> PanelReviewed:
        """Ask the three personas at once and draw the cascade's decision from their verdicts."""
        prompt = account(record)
        answers = await asyncio.gather(*(self._persona(record, p, prompt) for p in PERSONAS))
        verdicts = tuple(a[0] for a in answers)
        proposal = answers[2][1]
        if proposal is None:  # the optimizer's reply was rejected: the offline rules propose
            proposal = offline_review(record).proposal
            verdicts = (*verdicts[:2], msgspec.structs.replace(
                verdicts[2], reasons=(*verdicts[2].reasons, "proposal: the offline panel's")))
        m, a, o = (v.verdict for v in verdicts)
        return PanelReviewed(run_id=record.run_id, spec_digest=record.concluded.spec_digest,
                             reviewer=scrub(self.models.main), review=record.reviews, verdicts=verdicts,
                             decision=decide(m, a, o), proposal=proposal,
                             rejections=tuple(r for _, _, r in answers if r is not None))

    async def aclose(self) -> None:
        """Close the providers."""
        await self._router.aclose()


__all__ = ["PANEL_ROUND", "SYSTEMS", "LlmPanel", "PersonaReply", "account", "judge_reply", "system_prompt"]
