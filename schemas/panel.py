"""The experiment panel's review: three personas judge an experiment as a source of knowledge.

``hx experiment review RUN`` appends one ``PanelReviewed`` per review on the experiment run's
run-level subject ``hx.trace.<experiment run>._._._``: each persona's verdict on its own scale
and its reasons, the optimizer's next ``ExperimentSpec``, the decision the precedence cascade
draws from the three verdicts, and (LLM panel) the persona replies that were rejected and why.
"""

from __future__ import annotations

from typing import Literal

from schemas.event import Event, JsonObject, Payload

Persona = Literal["methodologist", "auditor", "optimizer"]
Decision = Literal["KEEP", "REVISE", "REDESIGN"]


class PersonaVerdict(Payload, frozen=True, kw_only=True):
    """One persona's verdict on its scale and the reasons it gives."""

    persona: Persona
    verdict: str
    """Methodologist SOUND / MARGINAL / UNSOUND; auditor VALID / INCONCLUSIVE / INVALID; optimizer
    ADVANCE / REVISE / REDESIGN. A rejected reply counts as its scale's worst."""
    reasons: tuple[str, ...] = ()


class PersonaRejection(Payload, frozen=True, kw_only=True):
    """A persona reply the LLM panel could not use: why, and the start of what the model said."""

    persona: Persona
    reason: str
    """What is wrong with it: not JSON, a field missing, a verdict off the scale, a proposal the runner refuses."""
    reply: str = ""
    """The reply's first characters (empty when the model could not be reached)."""


class PanelReviewed(Event, frozen=True, kw_only=True):
    """A panel's review of one experiment: three verdicts, the cascade's decision and the next experiment."""

    TYPE = "panel.reviewed"
    LEVEL = "run"

    run_id: str
    """The experiment run reviewed."""
    spec_digest: str
    reviewer: str
    """``offline`` (the deterministic panel) or the model spec of the LLM panel, credentials masked."""
    review: int = 0
    """This run's n-th review (0 first); an LLM panel's calls are attempt ``review`` of ``panel:<persona>``."""
    verdicts: tuple[PersonaVerdict, ...]
    """Methodologist, auditor, optimizer, in that order."""
    decision: Decision
    proposal: JsonObject
    """The optimizer's next experiment: an ``ExperimentSpec`` that ``hx experiment run`` accepts as is."""
    rejections: tuple[PersonaRejection, ...] = ()
