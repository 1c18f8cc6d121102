"""What an edit is: the typed operations on a harness, the code and the claim a candidate brings."""

from __future__ import annotations

from typing import Literal

from schemas.event import JsonObject, Payload
from schemas.rules import Rule, RuleSupport

Bucket = Literal["prompt", "tools", "config", "processor"]
BUCKETS: tuple[Bucket, ...] = ("prompt", "tools", "config", "processor")


class Anchor(Payload, frozen=True, kw_only=True):
    """Evidence: a position on ``HX_TRACE`` (message sequence, index in its frame) and what it shows."""

    seq: int
    index: int = 0
    note: str = ""


class EditOp(Payload, frozen=True, kw_only=True, tag_field="op"):
    """A typed builder operation on a harness (base of the four kinds)."""


class Attach(EditOp, frozen=True, kw_only=True, tag="attach"):
    """Attach a library processor at some hooks."""

    processor: str
    hooks: tuple[str, ...]
    """Hook names as the evolver proposed them: a wrong one is recorded, and the candidate's ``build_error`` says so."""
    params: JsonObject = {}
    """The processor's parameters; its type checks them when the edit is built."""


class Replace(EditOp, frozen=True, kw_only=True, tag="replace"):
    """Replace the processor of a singleton group (same hooks)."""

    group: str
    processor: str
    params: JsonObject = {}
    """The new processor's parameters; its type checks them when the edit is built."""


class Remove(EditOp, frozen=True, kw_only=True, tag="remove"):
    """Remove the processor of a singleton group."""

    group: str


class Reparam(EditOp, frozen=True, kw_only=True, tag="reparam"):
    """Change some parameters of the processor of a singleton group (the others keep their values)."""

    group: str
    params: JsonObject
    """The parameters that change; the processor's type checks the result when the edit is built."""


RULE_GROUP = "rule_program"
"""The singleton group of the rule interpreter (``hx.processors.rule_program``), which holds a harness's rules."""


class AddRule(EditOp, frozen=True, kw_only=True, tag="add_rule"):
    """Add one rule to the harness's rule program (attaching the interpreter when the harness has none)."""

    rule: Rule
    support: RuleSupport | None = None
    """What the rule was learnt from (an induced rule); it does not change what the rule does."""
    group: str = RULE_GROUP


class DropRule(EditOp, frozen=True, kw_only=True, tag="drop_rule"):
    """Take one rule out of the harness's rule program (the interpreter goes when no rule is left)."""

    rule: Rule
    group: str = RULE_GROUP


AnyEditOp = Attach | Replace | Remove | Reparam | AddRule | DropRule


class CodeAsset(Payload, frozen=True, kw_only=True):
    """New processor source a candidate brings: kept in the object store by content digest."""

    name: str
    """The module's file name."""
    digest: str
    """``sha256:`` of the source; the object-store key."""
    size: int
    processor: str
    """The registry name of the processor it defines."""


class CapabilityEvidence(Payload, frozen=True, kw_only=True):
    """What shows the edit's mechanism works: a claim and something observed, not believed."""

    kind: str = "other"
    """``builtin_processor``, ``code_smoke``, ``python_package``, ``filesystem`` or ``other``."""
    claim: str
    evidence: str


class AcceptedRegression(Payload, frozen=True, kw_only=True):
    """A regression of the round the candidate does not undo, and why that is acceptable."""

    task: str
    why: str


class Manifest(Payload, frozen=True, kw_only=True):
    """A candidate's falsifiable claim: what it should change, on which tasks, shown by what."""

    intended_effect: str = ""
    categories: tuple[str, ...] = ()
    """The failure categories it addresses."""
    predicted_flips: tuple[str, ...] = ()
    """Failing tasks it should make pass."""
    at_risk: tuple[str, ...] = ()
    """Passing tasks it might break."""
    evidence: tuple[Anchor, ...] = ()
    attribution: str = ""
    """The singleton group whose trigger must appear on a flipped task (attribution signature)."""
    capability_evidence: tuple[CapabilityEvidence, ...] = ()
    """Observed evidence that the edit's mechanism works (the paper's ``capability_evidence``)."""
    stabilise: tuple[str, ...] = ()
    """Solved tasks that pass only sometimes and should pass every attempt (``tasks_will_stabilize``)."""
    expected_min_calls: int = 0
    """How often the attribution group must trigger on a flipped task, at least (0: no attribution)."""
    accepted_regressions: tuple[AcceptedRegression, ...] = ()
    """The round's regressions it leaves as they are, each with why (the paper's "why this regression is
    acceptable"): the critic turns down a round that neither addresses a regression nor says why."""
