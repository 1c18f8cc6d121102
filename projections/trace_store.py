"""TraceStore: every task attempt's ordered events, steps, outcome and score."""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar, Literal

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.hooks import HookRecord
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.tools import VerifierScore
from streams.topology import TraceAddress

# An attempt's events share one subject: parse each subject once, not once per event.
_address = lru_cache(maxsize=65_536)(TraceAddress.parse)

Outcome = Literal["running", "passed", "failed", "infra_failure"]


class EventRef(msgspec.Struct, array_like=True, gc=False):
    """Where one event of an attempt lies on the log."""

    seq: int
    index: int
    type: str


class AttemptTrace(msgspec.Struct):
    """One task attempt as the trace store holds it."""

    run: str
    round: int
    task: str
    attempt: int
    events: list[EventRef] = []
    steps: int = 0
    outcome: Outcome = "running"
    status: str = ""
    score: float = 0.0
    reason: str = ""
    harness_digest: str = ""
    model: str = ""
    verifier_passed: bool | None = None


def attempt_key(run: str, round: int, task: str, attempt: int) -> str:
    """The trace store's key of one attempt."""
    return f"{run}/{round}/{task}/{attempt}"


class TraceStore(Projection[dict[str, AttemptTrace]]):
    """Per task attempt: ordered event references, step count, outcome and score."""

    name: ClassVar[str] = "trace_store"
    state_type = dict[str, AttemptTrace]

    def initial(self) -> dict[str, AttemptTrace]:
        """No attempts yet."""
        return {}

    def fold(self, state: dict[str, AttemptTrace], record: Record) -> dict[str, AttemptTrace]:
        """File the record under its attempt and update the attempt's summary."""
        event = record.event
        try:
            addr = _address(record.subject)
        except ValueError:
            return state
        if addr.round is None or addr.task is None or addr.attempt is None:
            return state  # run- and round-level events belong to no attempt
        key = attempt_key(addr.run, addr.round, addr.task, addr.attempt)
        trace = state.get(key)
        if trace is None:
            trace = state[key] = AttemptTrace(addr.run, addr.round, addr.task, addr.attempt)
        trace.events.append(EventRef(record.seq, record.index, record.type))
        if isinstance(event, AttemptStarted):
            trace.harness_digest = event.harness_digest
            trace.model = event.model
        elif isinstance(event, HookRecord):
            if event.step > trace.steps:
                trace.steps = event.step
        elif isinstance(event, VerifierScore):
            trace.verifier_passed = event.passed
            trace.score = event.score
        elif isinstance(event, AttemptFinished):
            trace.steps = event.steps
            trace.score = event.score
            trace.status = event.status
            trace.reason = event.reason
            if event.status == "infra_failure":
                trace.outcome = "infra_failure"
            else:
                trace.outcome = "passed" if event.passed else "failed"
        return state
