"""The counterfactual check: a candidate's processors replayed over recorded attempts, no model, no environment.

An attempt's hook records hold every event its processors were given (``emitted``) and
what they made of it (``returned``). Replaying means feeding the emitted events, in
order, to fresh instances of the *candidate's* pipelines and comparing what comes out
with what the recorded harness returned. While they agree, the attempt is exactly what
it would have been under the candidate (the model saw the same input, so the recorded
response stands; the environment got the same actions). Then:

- ``same``: they agreed to the end: the outcome cannot change;
- ``diverged``: the candidate changed what the model sees (the offer, the history, a
  tool result, the system prompt): from there the recorded responses are no evidence,
  so nothing is concluded (not a failure);
- ``changed``: with the model's input unchanged, the candidate changed what happens (a
  response edited, a tool call corrected or refused, the attempt interrupted): its
  outcome may change, and the gate rejects the candidate.

A harness holding a processor that calls a model itself (``Processor.calls_model``, a
judge) is not replayed at all: ``diverged``, since the replay makes no model call.

``diverged`` concludes nothing, and every narrowing edit diverges. So each replayed attempt
is also checked for the *winning path* it recorded (``hx.aegis.winning``): fresh candidate
pipelines are fed, in order, the emitted events of the attempt's start, of every step that
took a winning action, and of its end: the attempt as if the model had walked the winning
path straight, without the detours and no-ops (a processor keeps state over an attempt, and
one that remembers what was tried would otherwise hold the random walk's wandering against
the path). At every winning action the candidate must still offer it (its
before_model output keeps the call in the offer wherever the recorded one did; task_start
keeps its tool) and let it run as it ran (its before_tool output approves the same call),
and it must not interrupt the attempt. Narrowing a winning step to the action that scored
next on the path is a shortcut, not a closure. A winning action closed is a path the recorded
model could no longer take: the gate rejects the candidate, naming task, attempt and step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from hx.aegis.winning import WinningStep, winning_steps
from hx.harness.config import HarnessConfig
from hx.harness.errors import ContractViolation, Interrupt
from hx.runtime.errors import ProcessorFailed
from hx.runtime.pipeline import HookPipeline
from schemas.envelope import Record
from schemas.history import resolve
from schemas.hooks import HOOK_OF, BeforeModel, BeforeTool, HookName, HookPayload, HookRecord, TaskStart
from schemas.messages import ToolCall, ToolSchema

Verdict = Literal["same", "diverged", "changed"]
INPUT_HOOKS: frozenset[HookName] = frozenset({"task_start", "step_start", "before_model", "after_tool"})
"""Hooks whose output is (part of) what the model sees next: a difference there makes the replay diverge."""


def _calling(harness: HarnessConfig) -> str:
    """Why the harness cannot be replayed (a processor that calls a model), or ""."""
    calling = [a.type for a in harness.attachments if a.cls().calls_model]
    return f"{', '.join(calling)} calls a model, which a replay may not" if calling else ""


def _passes(records: Sequence[Record]) -> Iterator[tuple[HookRecord, list[HookPayload]]]:
    """Each hook pass of an attempt: the event emitted and what the recorded pipeline returned, in log order."""
    hooks = [r.event for r in resolve(records, strict=False) if isinstance(r.event, HookRecord)]
    i = 0
    while i < len(hooks):
        emitted = hooks[i]
        i += 1
        if emitted.stage != "emitted":
            continue
        expected: list[HookPayload] = []
        while i < len(hooks) and hooks[i].stage == "returned":
            expected.append(hooks[i].event)
            i += 1
        yield emitted, expected


Stages = list[tuple[str, list[HookPayload]]]
"""Each processor of a hook pass and what it yielded, in chain order."""


def _narrowing(stages: Stages, call: ToolCall) -> str:
    """The first processor of a before_model pass whose offer no longer holds ``call`` ("" when none)."""
    for name, produced in stages:
        if any(isinstance(ev, BeforeModel) and not offers(ev.tools, call) for ev in produced):
            return name
    return ""


def _pipes(harness: HarnessConfig, stages: Stages | None = None) -> dict[HookName, HookPipeline]:
    """Fresh pipelines of ``harness`` (its processors' state starts anew, as in an attempt), logging nothing; the
    before_model one adds to ``stages`` what each processor yielded, to name the one that closes a path."""
    observe = None if stages is None else (
        lambda proc, produced: stages.append((type(proc).type_name(), produced)))
    return {hook: HookPipeline(hook, procs, lambda event: None, observe if hook == "before_model" else None)
            for hook, procs in harness.instantiate().items()}


async def replay(harness: HarnessConfig, records: Sequence[Record]) -> tuple[Verdict, str]:
    """Replay one attempt's records (in log order) under ``harness``; the verdict and where it was decided."""
    calling = _calling(harness)
    if calling:  # it would call a model: a replay makes none, so it proves nothing either way
        return "diverged", calling
    pipes = _pipes(harness)
    for emitted, expected in _passes(records):
        hook = HOOK_OF[type(emitted.event)]
        where = f"step {emitted.step} {hook}"
        try:
            produced = await pipes[hook].run(emitted.event, emitted.step)
        except (Interrupt, ContractViolation) as exc:
            if isinstance(exc, ProcessorFailed):
                return "diverged", f"{where}: a processor could not run without its services ({exc})"
            return "changed", f"{where}: the candidate interrupts the attempt"
        if list(produced) != expected:
            return ("diverged", f"{where}: the model's input changes") if hook in INPUT_HOOKS else (
                "changed", f"{where}: the candidate changes what happens with the same model input")
    return "same", "every hook returned what it did before"


# --- winning paths -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedPath:
    """Where a candidate closes a recorded winning path: the step, the action, and how."""

    step: int
    action: str
    how: str
    """``no longer offered`` (``by`` the processor that narrowed it away), ``refused``, ``altered to ...``, or the
    candidate interrupts the attempt."""

    def describe(self, attempt: str) -> str:
        """``task#attempt step N 'action' how``, as the check's detail names it."""
        return " ".join(part for part in (f"{attempt} step {self.step}", repr(self.action) if self.action else "",
                                          self.how) if part)


@dataclass(frozen=True)
class Paths:
    """One attempt's winning path checked under a candidate."""

    winning: int = 0
    """Winning actions the attempt recorded."""
    closed: ClosedPath | None = None
    """The first winning action the candidate closes (None: the path stays open)."""
    unchecked: str = ""
    """Why the path could not be checked (a processor calling a model, or failing without its services)."""


def _same_call(a: ToolCall, b: ToolCall) -> bool:
    """The same tool with the same input (ids aside)."""
    return a.name == b.name and msgspec.to_builtins(a.input) == msgspec.to_builtins(b.input)


def offers(tools: Sequence[ToolSchema], call: ToolCall) -> bool:
    """True when ``call`` names one of ``tools`` and every enumerated property it sets holds an offered value."""
    for tool in tools:
        if tool.name != call.name:
            continue
        props: Any = tool.input_schema.get("properties")
        enums = {k: p["enum"] for k, p in props.items() if isinstance(p, dict) and isinstance(p.get("enum"), list)
                 } if isinstance(props, dict) else {}
        return all(k not in call.input or call.input[k] in values for k, values in enums.items())
    return False


async def paths(harness: HarnessConfig, records: Sequence[Record],
                winning: Sequence[WinningStep] | None = None) -> Paths:
    """Check one passing attempt's winning actions (``hx.aegis.winning``; ``winning`` when already chosen, e.g.
    ``corroborated`` across the task's attempts) under ``harness``'s pipelines."""
    winning = winning_steps(records) if winning is None else tuple(winning)
    index = {(w.step, w.call.id): i for i, w in enumerate(winning)}
    if not winning:
        return Paths()
    calling = _calling(harness)
    if calling:
        return Paths(len(winning), unchecked=calling)
    passing: Stages = []  # the before_model pass under way
    pipes = _pipes(harness, passing)
    started: set[str] | None = None  # the tools the candidate's task_start keeps
    offer: dict[int, tuple[BeforeModel | None, BeforeModel | None]] = {}  # step -> (recorded, candidate's)
    stages: dict[int, Stages] = {}  # step -> how its before_model pass made the offer
    skip = -1  # the winning actions up to this one are bypassed by a shortcut the candidate offered
    on_path = {0} | {w.step for w in winning}  # step 0: task_start and task_end
    for emitted, expected in _passes(records):
        if emitted.step not in on_path:
            continue
        hook = HOOK_OF[type(emitted.event)]
        passing.clear()
        try:
            produced = await pipes[hook].run(emitted.event, emitted.step)
        except (Interrupt, ContractViolation) as exc:
            if isinstance(exc, ProcessorFailed):
                return Paths(len(winning), unchecked=f"step {emitted.step} {hook}: a processor could not run "
                                                     f"without its services ({exc})")
            # the attempt ends there, before its success: the path is closed at the next winning action
            ahead = [w for w in winning if w.step >= emitted.step] if hook != "task_end" else []
            return Paths(len(winning), ClosedPath(emitted.step, ahead[0].action if ahead else "",
                                                  f"the candidate interrupts the attempt at {hook}"))
        event = emitted.event
        if isinstance(event, TaskStart):
            started = {t.name for t in produced[-1].tools} if produced else set()
        elif isinstance(event, BeforeModel):
            recorded, narrowed = expected[-1] if expected else None, produced[-1] if produced else None
            offer[emitted.step] = (recorded if isinstance(recorded, BeforeModel) else None,
                                   narrowed if isinstance(narrowed, BeforeModel) else None)
            stages[emitted.step] = list(passing)
        elif isinstance(event, BeforeTool) and index.get((emitted.step, event.call.id), -1) > skip:
            i = index[(emitted.step, event.call.id)]
            win, (recorded, narrowed) = winning[i], offer.get(emitted.step, (None, None))
            how = _closed(win, event, started, (recorded, narrowed), produced)
            if how.startswith("no longer offered") and (goal := _shortcut(winning, i, narrowed)) is not None:
                skip = goal
            elif how == "no longer offered" and (by := _narrowing(stages.get(emitted.step, []), event.call)):
                return Paths(len(winning), ClosedPath(win.step, win.action, f"{how} (by {by})"))
            elif how:
                return Paths(len(winning), ClosedPath(win.step, win.action, how))
    return Paths(len(winning))


def _shortcut(winning: Sequence[WinningStep], i: int, candidate: BeforeModel | None) -> int | None:
    """The next goal action after winning action ``i``, when the candidate offers it instead (its index), else None.

    The recorded path may change state on its way without need (a door closed before the coin
    is taken): a candidate that narrows such a step to the very action that scored next offers
    a shorter way to the same goal, not a closed one.
    """
    goal = next((j for j in range(i, len(winning)) if winning[j].goal), None)
    if goal is None or goal == i or candidate is None or not offers(candidate.tools, winning[goal].call):
        return None
    return goal


def _closed(win: WinningStep, event: BeforeTool, started: set[str] | None,
            offer: tuple[BeforeModel | None, BeforeModel | None], produced: list[Any]) -> str:
    """How the candidate closes a winning action at its step ("" when it stays open)."""
    recorded, candidate = offer
    chosen = event.call  # what the model chose: it must stay on offer wherever the recorded harness offered it
    if started is not None and chosen.name not in started:
        return "no longer offered (task_start drops its tool)"
    if recorded is not None and offers(recorded.tools, chosen):
        if candidate is None:
            return "no longer offered (before_model intercepts the step)"
        if not offers(candidate.tools, chosen):
            return "no longer offered"
    ran = [p.call for p in produced if isinstance(p, BeforeTool) and p.approved]
    if any(_same_call(call, win.call) for call in ran):
        return ""
    if not ran:
        return "refused"
    return f"altered to {WinningStep(win.step, ran[0], '').action!r}"


# --- the check's verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    """One solved attempt replayed under a candidate: the replay's verdict and its winning path."""

    attempt: str
    """``task#attempt``."""
    verdict: Verdict
    where: str
    paths: Paths


def decide(replayed: Sequence[Replayed]) -> tuple[bool, str]:
    """The counterfactual check from the replayed attempts: whether it passes, and its detail line."""
    closed = [(r.attempt, r.paths.closed) for r in replayed if r.paths.closed is not None]
    changed = [r for r in replayed if r.verdict == "changed"]
    unchecked = sum(1 for r in replayed if r.paths.unchecked)
    # an attempt with no winning action recorded had no path to keep open: counted apart, not as kept
    pathless = sum(1 for r in replayed if not r.paths.winning)
    kept = len(replayed) - len(closed) - unchecked - pathless
    same = sum(1 for r in replayed if r.verdict == "same")
    line = f"{len(replayed)} attempts replayed: {kept} paths kept open, {len(closed)} closed"
    if closed:
        line += " (" + "; ".join(c.describe(a) for a, c in closed) + ")"
    if pathless:
        line += f", {pathless} no winning action recorded"
    if unchecked:
        line += f", {unchecked} not checked ({next(r.paths.unchecked for r in replayed if r.paths.unchecked)})"
    if changed:
        line += (f"; {len(changed)} may change outcome with the same model input, e.g. {changed[0].attempt} "
                 f"({changed[0].where})")
    else:
        line += f"; {same} unchanged, {len(replayed) - same} diverge"
    return not closed and not changed, line
