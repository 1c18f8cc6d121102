"""``hx diff``: how a task's harness changed between two rounds (builder operations) and where its trajectories split.

The harness diff is computed from the two versions themselves, per singleton group: a group
only in the later harness is an ``attach``, one only in the earlier a ``remove``, another
processor type (or other hooks) a ``replace``, other parameters a ``reparam`` of just the
changed ones. These are the ledger's own edit operations (``schemas.edits``), so applying
them to the earlier harness (``hx.harness.edits.apply``) gives the later one, which the
diff checks; the ships recorded between the rounds are listed beside it as the ledger has them.

The trajectory diff reads only the task's attempt subjects in the two rounds' main rollouts
and compares them step by step: the action (the tool calls, or the model's text when it
called none) and the observation (what the tool returned). The first step where either
differs, or where one attempt ended and the other went on, is the divergence.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hx.harness.config import Attachment, HarnessConfig
from hx.harness.edits import apply, describe, program_of
from hx.harness.errors import CompositionError
from hx.replay.errors import TimeTravelError
from hx.replay.regressions import ShipBetween, ledger_of
from hx.replay.timetravel import RunMarks, run_marks
from hx.replay.trace_rounds import read_decoded
from projections.ledger import RunLedger
from schemas.edits import RULE_GROUP, AddRule, AnyEditOp, Attach, DropRule, Remove, Reparam, Replace
from schemas.lifecycle import AttemptFinished
from schemas.model import ModelResponse
from schemas.rules import Rule
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned
from streams.log import EventLog
from streams.topology import TRACE, trace_subject


def harness_ops(before: HarnessConfig, after: HarnessConfig) -> list[AnyEditOp]:
    """The builder operations that turn ``before`` into ``after``, group by group (removals first).

    The rule interpreter's group changes by the rules that left and came (``DropRule``, ``AddRule``), as the
    ledger records such edits, whenever those rebuild it exactly; otherwise like any group.
    """
    old = {a.group(): a for a in before.attachments}
    new = {a.group(): a for a in after.attachments}
    program = rule_ops(old.get(RULE_GROUP), new.get(RULE_GROUP))
    ops: list[AnyEditOp] = [Remove(group=g) for g in old if g not in new and (g != RULE_GROUP or program is None)]
    for group, att in new.items():
        was = old.get(group)
        if group == RULE_GROUP and program is not None:
            ops += program
        elif was is None:
            ops.append(Attach(processor=att.type, hooks=att.hooks, params=dict(att.params)))
        elif was.type != att.type or set(was.params) - set(att.params):
            # reparam merges parameters, so a dropped one needs the whole processor replaced
            ops.append(Replace(group=group, processor=att.type, params=dict(att.params)))
        elif was.hooks != att.hooks:
            ops += [Remove(group=group), Attach(processor=att.type, hooks=att.hooks, params=dict(att.params))]
        elif was.params != att.params:
            ops.append(Reparam(group=group, params={k: v for k, v in att.params.items()
                                                    if k not in was.params or was.params[k] != v}))
    if RULE_GROUP not in new and program is not None:
        ops = [*program, *ops]  # the interpreter went with its last rule: a removal, so first
    return ops


def _program(att: Attachment | None) -> tuple[Rule, ...]:
    return program_of(HarnessConfig([att]), RULE_GROUP) if att is not None else ()


def rule_ops(was: Attachment | None, att: Attachment | None) -> list[AnyEditOp] | None:
    """The rules dropped and added that turn the rule interpreter ``was`` into ``att`` (either may be absent);
    None when those edits would not rebuild ``att`` exactly (other hooks or parameters: a plain group edit)."""
    if was is None and att is None:
        return None
    old, new = _program(was), _program(att)
    kept = [r for r in old if r in new]
    same = next((i for i, (a, b) in enumerate(zip(kept, new, strict=False)) if a != b), min(len(kept), len(new)))
    # AddRule appends: the rules after the common prefix come out and go back in, in their new order
    ops: list[AnyEditOp] = [DropRule(rule=r) for r in old if r not in new[:same]]
    ops += [AddRule(rule=r) for r in new[same:]]
    try:
        rebuilt = apply(HarnessConfig([was] if was is not None else []), ops)
    except CompositionError:
        return None
    got = next(iter(rebuilt.attachments), None)
    return ops if got == att else None


@dataclass
class Step:
    """One step of an attempt: what the agent did and what it saw."""

    step: int
    action: str = ""
    observation: str = ""
    seq: int = 0
    """The log position of the step's first event."""


@dataclass
class RecordedAttempt:
    """One attempt of the task, step by step."""

    subject: str
    steps: list[Step] = field(default_factory=list)
    passed: bool | None = None
    status: str = ""
    finished_steps: int | None = None
    """The steps ``attempt.finished`` reports (what ``hx trace`` and ``hx regressions`` show)."""

    @property
    def step_count(self) -> int:
        """The attempt's steps, counted as ``attempt.finished`` counts them (the opening observation is no step)."""
        if self.finished_steps is not None:
            return self.finished_steps
        return sum(1 for s in self.steps if s.step)


@dataclass
class Divergence:
    """Where two trajectories first differ (``step`` None: they never do)."""

    step: int | None
    a: Step | None = None
    b: Step | None = None
    what: str = ""
    """``action``, ``observation``, or ``ended`` (one attempt stopped before the other)."""


@dataclass
class HarnessDiff:
    """``hx diff``: the harness change and the trajectory divergence of one task between two rounds."""

    run: str
    task: str
    rounds: tuple[int, int]
    variants: tuple[str, str]
    digests: tuple[str, str]
    operations: list[AnyEditOp]
    reproduces: bool
    """Applying ``operations`` to the first harness gives the second (slots aside, which no operation edits)."""
    ships: list[ShipBetween]
    trajectories: tuple[RecordedAttempt, RecordedAttempt]
    divergence: Divergence

    @property
    def lines(self) -> list[str]:
        """The operations, one line each."""
        return [describe(op) for op in self.operations]


def _action(calls: Sequence[Any]) -> str:
    return "; ".join(f"{c.name}({json.dumps(c.input, sort_keys=True)})" for c in calls)


async def trajectory(log: EventLog, subject: str) -> RecordedAttempt:
    """The steps of one attempt from its own subject (no conversation needed: actions and results only)."""
    out = RecordedAttempt(subject)
    steps: dict[int, Step] = {}
    calls: dict[int, list[str]] = {}
    said: dict[int, str] = {}
    async for r in read_decoded(log, TRACE.name, [subject], [
            ToolInvoked.TYPE, ToolReturned.TYPE, ModelResponse.TYPE, EnvObservation.TYPE, AttemptFinished.TYPE],
                                what="an attempt compared"):
        ev = r.event
        if isinstance(ev, AttemptFinished):
            out.passed, out.status, out.finished_steps = ev.passed, ev.status, ev.steps
        elif isinstance(ev, EnvObservation):
            if ev.step == 0:  # the first observation; later ones repeat what the tool returned
                steps.setdefault(0, Step(0, "(start)", ev.observation, r.seq))
        elif isinstance(ev, ToolInvoked | ToolReturned | ModelResponse):
            s = steps.setdefault(ev.step, Step(ev.step, seq=r.seq))
            if isinstance(ev, ToolInvoked):  # what was executed, after every processor had its say
                calls.setdefault(ev.step, []).append(_action([ev.call]))
            elif isinstance(ev, ToolReturned):
                s.observation = "\n".join(x for x in (s.observation, ev.result.output) if x)
            else:
                said.setdefault(ev.step, _action(ev.tool_calls) if ev.tool_calls else f"say: {ev.content}")
    for n, s in steps.items():
        if n:
            s.action = "; ".join(calls[n]) if n in calls else said.get(n, "")
    out.steps = [steps[n] for n in sorted(steps)]
    return out


def diverge(a: RecordedAttempt, b: RecordedAttempt) -> Divergence:
    """The first step where two trajectories differ in action or observation, or where one ends."""
    for x, y in zip(a.steps, b.steps, strict=False):
        if x.action != y.action:
            return Divergence(x.step, x, y, "action")
        if x.observation != y.observation:
            return Divergence(x.step, x, y, "observation")
    if len(a.steps) != len(b.steps):
        longer = a.steps if len(a.steps) > len(b.steps) else b.steps
        nxt = longer[min(len(a.steps), len(b.steps))]
        return Divergence(nxt.step, nxt if longer is a.steps else None, nxt if longer is b.steps else None, "ended")
    return Divergence(None)


def task_variant(marks: RunMarks, digests: dict[int, dict[str, str]], task: str, round: int) -> str:
    """The variant ``task`` ran under in evolution round ``round`` (from the round's digests)."""
    variant = digests.get(round, {}).get(task)
    if variant is None:
        if round not in digests:
            known = sorted(digests)
            raise TimeTravelError(f"run {marks.run!r} has no round {round}"
                                  + (f" (rounds {known[0]}..{known[-1]})" if known else ""))
        raise TimeTravelError(f"task {task!r} did not run in round {round} of run {marks.run!r}")
    return variant


def task_round(marks: RunMarks, digests: dict[int, dict[str, str]], task: str, round: int) -> tuple[str, int]:
    """(variant, trace round) of ``task``'s main rollout in evolution round ``round``."""
    variant = task_variant(marks, digests, task, round)
    trace = [t.number for t in marks.main_rounds(round) if t.started.variant in ("", variant)
             and task in t.started.task_ids]
    if not trace:
        raise TimeTravelError(f"round {round} of run {marks.run!r} has no main rollout of {task!r} on the trace")
    return variant, trace[0]


async def harness_diff(log: EventLog, run: str, task: str, a: int, b: int, *, attempt: int = 0) -> HarnessDiff:
    """The harness diff of ``task`` between rounds ``a`` and ``b`` and where its attempt ``attempt`` diverges."""
    marks = await run_marks(log, run)
    if not marks.evolution:
        raise TimeTravelError(f"run {run!r} has no ledger: hx diff compares the rounds of an evolution run")
    state = ledger_of(marks)
    digests = {n: {d.task: d.variant for d in ds} for n, ds in state.digests.items()}
    (va, ta), (vb, tb) = task_round(marks, digests, task, a), task_round(marks, digests, task, b)
    ha, hb = harness_in(state, va, a), harness_in(state, vb, b)
    ops = harness_ops(ha, hb)
    try:
        reproduces = apply(ha, ops).with_slots(**_slots(hb)).digest == hb.digest
    except CompositionError:
        reproduces = False
    ships = [ShipBetween(s.event, []) for s in state.shipments if min(a, b) <= s.round < max(a, b)
             and s.variant in (va, vb)]
    first, second = (await trajectory(log, trace_subject(run, ta, task, attempt)),
                     await trajectory(log, trace_subject(run, tb, task, attempt)))
    if not first.steps and not second.steps:
        raise TimeTravelError(f"task {task!r} has no attempt {attempt} on the trace in rounds {a} and {b}")
    return HarnessDiff(run, task, (a, b), (va, vb), (ha.digest, hb.digest), ops, reproduces, ships,
                       (first, second), diverge(first, second))


def harness_in(ledger: RunLedger, variant: str, round: int) -> HarnessConfig:
    """The harness ``variant`` ran in ``round``: its last version shipped before that round (from the ledger)."""
    version = ledger.as_of(round).get(variant)
    if version is None:
        raise TimeTravelError(f"variant {variant!r} did not exist in round {round}")
    return HarnessConfig.from_spec(version.harness)


def _slots(h: HarnessConfig) -> dict[str, Any]:
    return {name: getattr(h.slots, name) for name in h.slots.__struct_fields__}
