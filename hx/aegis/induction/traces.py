"""The steps of a round's attempts, as the rule induction reads them: one pass over the adaptation trace.

Each ``Step`` is one action the environment took (its ``EnvObservation``): the action, what
it showed, the actions offered before it, whether it raised the score, ended the attempt in
failure, or won it, and its place on the log (the evidence anchor). Only adaptation rounds
are read (``Evidence.check``); only ``env.observation`` and ``attempt.finished`` events, so
reading costs what the induction uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hx.aegis.evidence import Evidence
from hx.processors._rule_view import content, words
from schemas.edits import Anchor
from schemas.lifecycle import AttemptFinished
from schemas.tools import EnvObservation

TYPES = (EnvObservation.TYPE, AttemptFinished.TYPE)


@dataclass(frozen=True)
class Step:
    """One action and what came of it."""

    action: str
    observation: str
    offered: tuple[str, ...]
    """The actions the environment offered before this one."""
    rose: bool
    """The score went up, or the attempt was won, on this action."""
    fatal: bool
    """The action ended the attempt in failure."""
    anchor: Anchor
    enabled: bool = False
    """A later action of the attempt that raised the score names everything this one names (under another
    verb): ``pull 3 levers`` before a rising ``press 3 levers on panel``. Set by ``credit``."""

    @property
    def useful(self) -> bool:
        """It raised the score or enabled a later action that did."""
        return self.rose or self.enabled


@dataclass
class AttemptTrace:
    """One attempt's steps, its task text and opening, and its verdict."""

    task: str
    attempt: int
    trace_round: int
    instruction: str = ""
    opening: str = ""
    offered: tuple[str, ...] = ()
    """The actions offered now (after the last step read)."""
    score: float = 0.0
    passed: bool = False
    steps: list[Step] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, str, int]:
        """Where it is: (trace round, task, attempt)."""
        return self.trace_round, self.task, self.attempt


def _fold(trace: AttemptTrace, event: EnvObservation, anchor: Anchor) -> None:
    action = event.info.get("action") if isinstance(event.info, dict) else None
    if event.step == 0 or not action:
        trace.instruction = str(event.info.get("task", "")) if isinstance(event.info, dict) else ""
        trace.opening = event.observation
    else:
        trace.steps.append(Step(action=str(action), observation=event.observation, offered=trace.offered,
                                rose=event.score > trace.score or event.success, fatal=event.failure, anchor=anchor))
    trace.offered, trace.score = event.valid_actions, event.score


def credit(trace: AttemptTrace) -> None:
    """Mark the steps that enabled a later score-raising step (``Step.enabled``)."""
    later: list[tuple[str, frozenset[str]]] = []
    for i in range(len(trace.steps) - 1, -1, -1):
        step = trace.steps[i]
        toks = words(step.action)
        verb = toks[0] if toks else ""
        named = content(step.action, verb)
        if named and any(v != verb and named <= c for v, c in later):
            trace.steps[i] = replace(step, enabled=True)
        if step.rose:
            later.append((verb, content(step.action, verb)))


async def read_traces(evidence: Evidence, trace_rounds: list[int]) -> list[AttemptTrace]:
    """Every attempt of the given adaptation trace rounds, in log order (``HeldoutAccess`` for any other round)."""
    out: dict[tuple[int, str, int], AttemptTrace] = {}
    async for key, record in evidence.records(trace_rounds, TYPES):
        trace = out.get(key)
        if trace is None:
            trace = out[key] = AttemptTrace(key[1], key[2], key[0])
        event = record.event
        if isinstance(event, EnvObservation):
            _fold(trace, event, Anchor(seq=record.seq, index=record.index, note=f"step {event.step}"))
        elif isinstance(event, AttemptFinished):
            trace.passed = event.passed
    for trace in out.values():
        credit(trace)
    return list(out.values())
