"""The agent criteria: how an attempt went (verdict, score, effort, actions, tools) and what its answer says.

Each reads the fields ``projections.attempt_outputs`` folds from the log; none knows a game, a
task or an answer: its parameters carry anything specific. Registered on import of
``hx.eval.criteria``; the reference with examples is docs/criteria.md.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from hx.eval.criteria import Check, NoParams, compile_pattern, criterion, listed, shown
from projections.attempt_outputs import AttemptOutput
from schemas.lifecycle import SCORED_STATUSES

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


@criterion("task_verdict", NoParams)
def task_verdict(_: NoParams) -> Check:
    """The task's own verifier passed the attempt."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.passed, f"verifier {'passed' if out.passed else 'failed'} ({out.status or 'unfinished'})"
    return check


@criterion("finished", NoParams)
def finished(_: NoParams) -> Check:
    """The attempt ran to its end: it finished ``completed`` or ``budget_exhausted``, not interrupted or failed."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        if not out.finished:
            return False, "no attempt.finished on the log (still running, or cut off)"
        why = f": {shown(out.reason)}" if out.reason else ""
        return out.status in SCORED_STATUSES, f"ended {out.status}{why} (need {' or '.join(SCORED_STATUSES)})"
    return check


class Score(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A verifier score."""

    score: float


@criterion("score_at_least", Score)
def score_at_least(p: Score) -> Check:
    """The verifier's score is at least ``score``."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.score >= p.score, f"score {out.score:g} (need >= {p.score:g})"
    return check


class Steps(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A step count."""

    steps: NonNegative


@criterion("steps_at_most", Steps)
def steps_at_most(p: Steps) -> Check:
    """The attempt took at most ``steps`` steps."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.steps <= p.steps, f"{out.steps} steps (need <= {p.steps})"
    return check


class AtMost(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How many of something are allowed."""

    at_most: NonNegative = 0


@criterion("no_invalid_actions", AtMost)
def no_invalid_actions(p: AtMost) -> Check:
    """At most ``at_most`` actions the environment called invalid plus tool results flagged as errors."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        bad = out.invalid_actions + out.tool_errors
        return bad <= p.at_most, (f"{out.invalid_actions} invalid actions + {out.tool_errors} tool errors = {bad} "
                                  f"of {out.actions} actions (need <= {p.at_most})")
    return check


class Repeats(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The length of a run of one repeated tool call that counts as a loop."""

    repeats: Annotated[int, msgspec.Meta(ge=2)] = 3


@criterion("no_loop", Repeats)
def no_loop(p: Repeats) -> Check:
    """No identical tool call (same name and input) made ``repeats`` or more times back to back."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.longest_repeat < p.repeats, (f"longest run of one identical tool call: {out.longest_repeat} "
                                                f"(need < {p.repeats})")
    return check


class ToolCount(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool name and how often it must be called."""

    name: Annotated[str, msgspec.Meta(min_length=1)]
    at_least: Positive = 1


@criterion("tool_used", ToolCount)
def tool_used(p: ToolCount) -> Check:
    """Tool ``name`` was called at least ``at_least`` times."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        n = out.tool_calls.get(p.name, 0)
        return n >= p.at_least, f"{p.name!r} called {_times(n) if n else '0 times'} (need >= {p.at_least})"
    return check


class ToolName(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool name."""

    name: Annotated[str, msgspec.Meta(min_length=1)]


@criterion("tool_not_used", ToolName)
def tool_not_used(p: ToolName) -> Check:
    """Tool ``name`` was never called."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        n = out.tool_calls.get(p.name, 0)
        return n == 0, f"{p.name!r} called {_times(n) if n else '0 times'} (need 0)"
    return check


class KnownTools(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The tool names an attempt may call."""

    known: list[str]


@criterion("tools_known", KnownTools)
def tools_known(p: KnownTools) -> Check:
    """Every tool the attempt called is in ``known`` (a call to a tool the task never offered fails it)."""
    known = frozenset(p.known)

    def check(out: AttemptOutput) -> tuple[bool, str]:
        unknown = sorted(name for name in out.tool_calls if name not in known)
        if unknown:
            return False, "called tools not in the known list: " + ", ".join(
                f"{name!r} ({_times(out.tool_calls[name])})" for name in unknown)
        return True, f"{len(out.tool_calls)} tools called, all known" + (
            f": {listed(sorted(out.tool_calls))}" if out.tool_calls else "")
    return check


class AnswerPattern(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A regular expression and its flag letters (``i`` ignore case, ``m`` multiline, ``s`` dot-all, ``x`` verbose)."""

    pattern: Annotated[str, msgspec.Meta(min_length=1)]
    flags: str = ""


@criterion("answer_matches", AnswerPattern)
def answer_matches(p: AnswerPattern) -> Check:
    """The output text (submitted answer, else last content) contains a match of ``pattern`` (``re.search``)."""
    regex = compile_pattern(p.pattern, p.flags)
    slashed = f"/{p.pattern}/{p.flags}"

    def check(out: AttemptOutput) -> tuple[bool, str]:
        text = out.text
        found = regex.search(text)
        if found is None:
            if not text:
                return False, f"no answer to match {slashed} against"
            return False, f"no match of {slashed} in the answer {shown(text)}"
        return True, f"{slashed} matched {shown(found.group(0))} at character {found.start()}"
    return check

