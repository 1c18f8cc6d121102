"""``rule_program``: the interpreter of the rule language (``schemas.rules``); its program is its parameter.

One processor runs any program, so the rules an evolver learns are data on the ledger, not
code. Per attempt it keeps what the rules read (``AttemptView``): the task's words, what
each action showed, the actions taken, the states visited. At ``before_model`` every rule
whose conditions hold narrows the offer in two passes: first the restrictions (``avoid``,
``require_before``, ``forbid_repeat``), then the preferences among what is left, each in
program order; a rule that would leave nothing is passed over, so the offer is never
narrowed to nothing and the before_model contract holds unchanged. At ``before_tool`` the
restrictions written for that hook refuse a matching call, with the rule's sentence as the
reason the model reads, unless the offer the model last got holds no other action the rule
lets through (there too a rule never leaves nothing). Nothing is kept from one attempt to
the next.

A program is checked when the harness is built (``check``): a rule of a newer language,
one that cannot act at its hook, one that matches no action or every action where that
empties the offer, bad words or counts: each a ``ValueError`` naming the rule and why,
which the harness config reports as a bad parameter.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import ClassVar

from hx.harness.processor import Processor
from hx.processors._choices import action_of, choices, narrowed, state_key
from hx.processors._rule_view import AttemptView, all_hold, matches, number_in, words
from hx.processors.refusal import Refusals
from hx.runtime.loop import BLOCKED
from schemas.hooks import AfterTool, BeforeModel, BeforeTool, TaskStart
from schemas.rules import (
    LANGUAGE,
    AnyText,
    Avoid,
    Did,
    ForbidRepeat,
    NotDid,
    Pattern,
    Prefer,
    RequireBefore,
    Revisited,
    Rule,
    Says,
    ShownAfter,
    sentence,
)

_LOWER_WORD = re.compile(r"[a-z0-9]+")
Keep = Callable[[str], bool]


def _check_words(values: Sequence[str], where: str) -> None:
    for w in values:
        if not _LOWER_WORD.fullmatch(w):
            raise ValueError(f"{where}: {w!r} is not one lower-case word (letters and digits)")


def _check_text(text: AnyText | None, where: str) -> None:
    if isinstance(text, ShownAfter):
        _check_pattern(text.action, f"{where} (the action it follows)")


def _check_pattern(pattern: Pattern, where: str) -> None:
    if pattern.starts and " ".join(_LOWER_WORD.findall(pattern.starts)) != pattern.starts:
        raise ValueError(f"{where}: starts {pattern.starts!r} must be lower-case words separated by single spaces")
    _check_words(pattern.mentions, f"{where}: mentions")
    if pattern.named_in is not None and pattern.named_in == pattern.not_named_in:
        raise ValueError(f"{where}: named_in and not_named_in are the same text, so it matches no action")
    _check_text(pattern.named_in, where)
    _check_text(pattern.not_named_in, where)


def _every(pattern: Pattern) -> bool:
    return pattern == Pattern()


def _covers(general: Pattern, special: Pattern) -> bool:
    """True when every action ``special`` matches, ``general`` matches too (judged from the constraints alone)."""
    lead, own = general.starts.split(), special.starts.split()
    return (own[:len(lead)] == lead and set(general.mentions) <= set(special.mentions)
            and general.named_in in (None, special.named_in) and general.not_named_in in (None, special.not_named_in))


def check_rule(rule: Rule, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` when the rule cannot run as written."""
    if rule.language > LANGUAGE:
        raise ValueError(f"{where}: rule language {rule.language} is newer than this hx reads ({LANGUAGE}); "
                         "upgrade hx to run it")
    effect = rule.do
    if isinstance(effect, Prefer) and rule.at == "before_tool":
        raise ValueError(f"{where}: prefer cannot act at before_tool (a call has no offer to choose from); "
                         "use before_model")
    for i, cond in enumerate(rule.when, 1):
        at = f"{where}, condition {i}"
        if isinstance(cond, Says):
            if not cond.words:
                raise ValueError(f"{at}: says needs at least one word")
            _check_words(cond.words, at)
            _check_text(cond.text, at)
        elif isinstance(cond, Did | NotDid):
            _check_pattern(cond.action, at)
            if isinstance(cond, Did) and cond.within < 0:
                raise ValueError(f"{at}: within must be >= 0 (0: at any time)")
        elif isinstance(cond, Revisited) and cond.times < 1:
            raise ValueError(f"{at}: times must be >= 1")
    if isinstance(effect, RequireBefore):
        _check_pattern(effect.first, f"{where}: first")
        _check_pattern(effect.then, f"{where}: then")
        if _covers(effect.then, effect.first):
            raise ValueError(f"{where}: `then` also holds back the `first` actions, so they could never be taken "
                             "and the rule would narrow the offer to nothing")
        return
    _check_pattern(effect.what, where)
    if isinstance(effect, Avoid | ForbidRepeat) and _every(effect.what) and not rule.when:
        raise ValueError(f"{where}: {effect.__struct_config__.tag} of every action would narrow the offer "
                         "to nothing")
    if isinstance(effect, Prefer) and _every(effect.what) and not effect.order:
        raise ValueError(f"{where}: prefers every action, so it does nothing")


def check(rules: Sequence[Rule]) -> None:
    """Raise ``ValueError`` naming the first rule that cannot run as written."""
    for i, rule in enumerate(rules, 1):
        check_rule(rule, f"rule {i} ({sentence(rule)})")


def restriction(rule: Rule, view: AttemptView) -> Keep | None:
    """What a restricting rule keeps now (None: it does not restrict at the moment)."""
    effect = rule.do
    if isinstance(effect, Avoid):
        return lambda a: not matches(effect.what, a, view)
    if isinstance(effect, RequireBefore):
        if any(matches(effect.first, a, view) for a in view.taken):
            return None
        return lambda a: not matches(effect.then, a, view)
    if isinstance(effect, ForbidRepeat):
        taken = {words(a) for a in view.taken}  # by words: a call's case and spacing are not corrected yet
        return lambda a: words(a) not in taken or not matches(effect.what, a, view)
    return None


def preference(effect: Prefer, offered: Sequence[str], view: AttemptView) -> set[str]:
    """The offered actions a preference keeps (empty: it keeps nothing, so it is passed over)."""
    kept = [a for a in offered if matches(effect.what, a, view)]
    if effect.order and kept:
        numbered = [(n, a) for a in kept if (n := number_in(a)) is not None]
        if numbered:
            best = min(n for n, _ in numbered) if effect.order == "least" else max(n for n, _ in numbered)
            kept = [a for n, a in numbered if n == best]
    return set(kept)


def narrow(rules: Sequence[Rule], offered: Sequence[str], view: AttemptView) -> list[str]:
    """The offer after the rules whose conditions hold: restrictions, then preferences; never empty."""
    left = list(offered)
    live = [r for r in rules if r.at == "before_model" and all_hold(r.when, view)]
    for rule in live:
        keep = restriction(rule, view)
        if keep is not None:
            kept = [a for a in left if keep(a)]
            left = kept or left
    for rule in live:
        if isinstance(rule.do, Prefer):
            chosen = preference(rule.do, left, view)
            left = [a for a in left if a in chosen] or left
    return left


class RuleProgram(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Run a program of rules (``schemas.rules``) over the offer and the calls."""

    name: ClassVar[str] = "rule_program"
    _order: ClassVar[int] = 20  # after the pruning of refused actions, before the task-reading narrowings
    dimension: ClassVar[str] = "D4"
    standalone: ClassVar[bool] = False  # an empty program does nothing: only the rule evolver attaches it

    rules: tuple[Rule, ...] = ()
    """The program, applied in order."""

    def __post_init__(self) -> None:
        check(self.rules)
        self._view = AttemptView()
        self._refusals = Refusals()
        self._calls = [r for r in self.rules if r.at == "before_tool"]
        self._offer: tuple[str, ...] = ()
        """The actions the model was last offered (empty: not known, a free-form tool)."""

    async def process(self, event: TaskStart | BeforeModel | BeforeTool | AfterTool) -> AsyncIterator[
            TaskStart | BeforeModel | BeforeTool | AfterTool]:
        """Read the task (task_start) and each result (after_tool); narrow the offer; refuse calls."""
        if isinstance(event, TaskStart):
            # A new attempt: nothing seen, nothing refused (a reused instance must not explain an old call id).
            self._view = AttemptView(event.task.instruction)
            self._refusals = Refusals()
            self._offer = ()
            yield event
        elif isinstance(event, AfterTool):
            action = action_of(event.call)
            # a blocked or failed call (a malformed one, one after the episode ended) did not happen in the world
            if action is not None and not event.result.is_error and not event.result.output.startswith(BLOCKED):
                self._view.took(action, event.result.output)
            yield self._refusals.explain(event)
        elif isinstance(event, BeforeModel):
            yield self._before_model(event)
        else:
            yield self._before_tool(event)

    def _before_model(self, event: BeforeModel) -> BeforeModel:
        if not self._view.taken and not self._view.last:
            opening = next((m.content for m in reversed(event.messages) if m.role == "user"), "")
            self._view.opening(opening)
        full = choices(event.offered or event.tools)
        self._view.enter(state_key(full) if full else "")
        offered = choices(event.tools)
        if not offered or not self.rules:
            self._offer = offered
            return event
        keep = set(narrow(self.rules, offered, self._view))
        self._offer = tuple(a for a in offered if a in keep)
        return narrowed(event, lambda a: a in keep) if len(keep) < len(offered) else event

    def _before_tool(self, event: BeforeTool) -> BeforeTool:
        action = action_of(event.call)
        if action is None or not event.approved:
            return event
        for rule in self._calls:
            keep = restriction(rule, self._view) if all_hold(rule.when, self._view) else None
            # As at before_model, a rule never leaves nothing: with no other action offered that it lets through,
            # refusing would only spend the attempt's steps on refusals.
            if keep is not None and not keep(action) and (not self._offer or any(
                    keep(a) for a in self._offer if a != action)):
                return self._refusals.refuse(event, f"the harness's rule: {sentence(rule)}")
        return event
