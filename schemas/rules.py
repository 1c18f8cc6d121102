"""The rule language: processor behaviour as data, learnt from traces and judged like any edit.

A ``Rule`` says, of the actions a text environment offers, which to prefer or avoid, and
when: *conditions* over what the attempt has seen so far (the task text, the latest
observation, all text read, what some kind of action showed, the recent actions, how
often the current state was visited) and one *effect* on the offer the model gets
(``before_model``) or on the call it makes (``before_tool``). Actions are matched by a
``Pattern``: their leading words, words they mention, and whether the things they name
appear in some text the attempt read. A program is a tuple of rules; the interpreter
processor ``rule_program`` (``hx.processors.rule_program``) runs any program, and
``hx.aegis.induction`` learns them from the adaptation split's traces.

Rules are values: frozen Structs, encoded canonically on the ledger (an ``AddRule`` edit
holds the rule, never code), digested with the harness that holds them. They keep no
memory across attempts: what one attempt learnt reaches the next only as a rule that went
through the gate.

Compatibility: ``LANGUAGE`` is the newest version of this vocabulary this hx reads. A rule's
``language`` defaults to 1 for good; a later hx that adds a condition, text or effect kind
raises ``LANGUAGE``, and a rule using that kind states the version (so it is written out and an
older hx refuses the rule in one line instead of misreading it).

>>> rule = Rule(do=Avoid(what=Pattern(starts="press", not_named_in=TaskText())))
>>> sentence(rule)
'avoid `press …` that names something not in the task'
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

from schemas.event import Payload

LANGUAGE = 1
"""The rule language this hx reads and writes."""

Hook = Literal["before_model", "before_tool"]
Order = Literal["", "least", "most"]


# --- texts an attempt has seen --------------------------------------------------------------


class Text(Payload, frozen=True, kw_only=True, omit_defaults=True, tag_field="text"):
    """Some text the attempt has seen so far (base of the kinds)."""


class TaskText(Text, frozen=True, kw_only=True, omit_defaults=True, tag="task"):
    """The task's instruction."""


class LastObservation(Text, frozen=True, kw_only=True, omit_defaults=True, tag="last"):
    """The latest observation (the task's opening before the first action)."""


class ReadText(Text, frozen=True, kw_only=True, omit_defaults=True, tag="read"):
    """Everything the attempt has read: the task, its opening and every observation since."""


class ShownAfter(Text, frozen=True, kw_only=True, omit_defaults=True, tag="after"):
    """What the actions matching ``action`` showed (a book read, a note examined)."""

    action: Pattern


AnyText = TaskText | LastObservation | ReadText | ShownAfter


# --- which actions --------------------------------------------------------------------------


class Pattern(Payload, frozen=True, kw_only=True, omit_defaults=True):
    """A set of actions: all four constraints hold (an empty pattern is every action)."""

    starts: str = ""
    """The action's leading words (lower case, whole words): ``"press"``, ``"turn left"``."""
    mentions: tuple[str, ...] = ()
    """Words the action contains, each whole (lower case)."""
    named_in: AnyText | None = None
    """Every content word the action names after ``starts`` appears in this text."""
    not_named_in: AnyText | None = None
    """Some content word the action names after ``starts`` does not appear in this text."""


# --- when -----------------------------------------------------------------------------------


class Condition(Payload, frozen=True, kw_only=True, omit_defaults=True, tag_field="if"):
    """Something the attempt has seen (base of the kinds)."""


class Says(Condition, frozen=True, kw_only=True, omit_defaults=True, tag="says"):
    """The text contains every one of ``words`` (whole words, lower case)."""

    text: AnyText
    words: tuple[str, ...]


class Did(Condition, frozen=True, kw_only=True, omit_defaults=True, tag="did"):
    """An action matching ``action`` was taken among the last ``within`` actions (0: at any time so far)."""

    action: Pattern
    within: int = 0


class NotDid(Condition, frozen=True, kw_only=True, omit_defaults=True, tag="not_did"):
    """No action matching ``action`` was taken so far."""

    action: Pattern


class Revisited(Condition, frozen=True, kw_only=True, omit_defaults=True, tag="revisited"):
    """The current state (the set of actions offered) was seen at least ``times`` times before."""

    times: int = 1


AnyCondition = Says | Did | NotDid | Revisited


# --- what -----------------------------------------------------------------------------------


class Effect(Payload, frozen=True, kw_only=True, omit_defaults=True, tag_field="do"):
    """What a rule does to the offer or the call (base of the kinds)."""


class Prefer(Effect, frozen=True, kw_only=True, omit_defaults=True, tag="prefer"):
    """Offer only the actions matching ``what`` when any is offered; with ``order``, only those naming the least
    (or most) number among them."""

    what: Pattern
    order: Order = ""


class Avoid(Effect, frozen=True, kw_only=True, omit_defaults=True, tag="avoid"):
    """Offer no action matching ``what`` while others remain; at ``before_tool``, refuse such a call."""

    what: Pattern


class RequireBefore(Effect, frozen=True, kw_only=True, omit_defaults=True, tag="require_before"):
    """Avoid actions matching ``then`` until an action matching ``first`` was taken."""

    first: Pattern
    then: Pattern


class ForbidRepeat(Effect, frozen=True, kw_only=True, omit_defaults=True, tag="forbid_repeat"):
    """Avoid taking again an action matching ``what`` that was already taken in this attempt."""

    what: Pattern


AnyEffect = Prefer | Avoid | RequireBefore | ForbidRepeat


class Rule(Payload, frozen=True, kw_only=True, omit_defaults=True):
    """When every condition holds, the effect applies at the hook."""

    do: AnyEffect
    when: tuple[AnyCondition, ...] = ()
    at: Hook = "before_model"
    language: int = 1
    """The language version the rule needs: 1, or the version that added a kind it uses (always written then, so
    an older hx sees it and refuses the rule in one line)."""


class RuleSupport(Payload, frozen=True, kw_only=True, omit_defaults=True):
    """What a learnt rule rests on: counts of the adaptation attempts and steps it was induced from."""

    method: str
    """How it was induced (``fatal``, ``rising``, ``order``, ``precedence``, ``repeat``)."""
    attempts: int
    """Attempts showing the evidence (failing ones for an avoidance, score-raising ones for a preference)."""
    tasks: int
    """Distinct tasks among them."""
    steps: int = 0
    """Steps matched by the rule's pattern in the evidence."""
    against: int = 0
    """Steps that speak against it (a matched action that raised the score, for an avoidance)."""


def rule_digest(rule: Rule) -> str:
    """A rule's content digest (``sha256:`` + hex of its canonical JSON): the same rule, the same name."""
    return "sha256:" + hashlib.sha256(msgspec.json.encode(rule, order="sorted")).hexdigest()


def rule_lever(rule: Rule) -> str:
    """The lever name of adding this rule: ``rule:`` and the first 12 hex digits of its digest."""
    return "rule:" + rule_digest(rule).removeprefix("sha256:")[:12]


# --- plain sentences ------------------------------------------------------------------------


def text_phrase(text: AnyText) -> str:
    """A text kind in words."""
    if isinstance(text, TaskText):
        return "the task"
    if isinstance(text, LastObservation):
        return "the last observation"
    if isinstance(text, ReadText):
        return "what the attempt has read"
    return f"what `{pattern_phrase(text.action)}` showed"


def pattern_phrase(pattern: Pattern) -> str:
    """The actions of a pattern as a short template: ``press … lever``."""
    words = [pattern.starts] if pattern.starts else []
    return " ".join([*words, "…", *pattern.mentions]).strip()


def _qualifier(pattern: Pattern) -> str:
    parts = []
    if pattern.named_in is not None:
        parts.append(f"that names only things in {text_phrase(pattern.named_in)}")
    if pattern.not_named_in is not None:
        parts.append(f"that names something not in {text_phrase(pattern.not_named_in)}")
    return " and ".join(parts)


def condition_phrase(condition: AnyCondition) -> str:
    """A condition in words."""
    if isinstance(condition, Says):
        return f"{text_phrase(condition.text)} says {' '.join(condition.words)!r}"
    if isinstance(condition, Did):
        if condition.within == 1:
            return f"`{pattern_phrase(condition.action)}` was just done"
        when = f"in the last {condition.within} actions" if condition.within else "earlier"
        return f"`{pattern_phrase(condition.action)}` was done {when}"
    if isinstance(condition, NotDid):
        return f"`{pattern_phrase(condition.action)}` was not done yet"
    return f"the state was visited {condition.times} time(s) before"


def sentence(rule: Rule, support: RuleSupport | None = None) -> str:
    """The rule as one plain sentence, with its support when given."""
    effect = rule.do
    if isinstance(effect, Prefer):
        head, pattern = f"prefer `{pattern_phrase(effect.what)}`", effect.what
    elif isinstance(effect, Avoid):
        head, pattern = f"avoid `{pattern_phrase(effect.what)}`", effect.what
    elif isinstance(effect, RequireBefore):
        head = f"do `{pattern_phrase(effect.then)}` only after `{pattern_phrase(effect.first)}`"
        pattern = effect.then
    else:
        head, pattern = f"never repeat `{pattern_phrase(effect.what)}`", effect.what
    qualifier = _qualifier(pattern)
    out = f"{head} {qualifier}" if qualifier else head
    if isinstance(effect, Prefer) and effect.order:
        out += f", the one naming the {effect.order} number"
    if rule.when:
        out += " when " + " and ".join(condition_phrase(c) for c in rule.when)
    if rule.at == "before_tool":
        out += " (refusing the call)"
    return out + (f", {support_phrase(support)}" if support is not None else "")


def support_phrase(support: RuleSupport) -> str:
    """What a rule rests on, in words."""
    kind = {"fatal": "failing attempts that ended on it", "rising": "attempts where it raised the score",
            "order": "attempts where the choice it makes raised the score",
            "precedence": "attempts where the order it asks for raised the score",
            "repeat": "failing attempts that repeated it to no effect"}.get(support.method, "attempts")
    out = f"supported by {support.attempts} {kind} ({support.tasks} task(s))"
    return out + (f", {support.against} step(s) against" if support.against else "")
