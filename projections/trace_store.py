"""TraceStore: every task attempt's summary (harness, model, steps, outcome, score) and where its events lie.

The store folds only an attempt's summary events (``attempt.started``, ``verifier.score``,
``attempt.finished``), which the log keeps in messages of their own on the attempt's channels
(``streams.channels``). So a rebuild is served by the server's subject filters and never opens
an attempt's frames: for 3,000 attempts it reads a few thousand small messages, not 4M events,
and its state is one small summary per attempt whatever the attempts' length. The steps come
from ``attempt.finished`` (a running attempt shows 0 until it ends).

The events themselves are read back from the log by the attempt's subjects
(``AttemptTrace.filters``: its bulk subject and its channels), between the sequences of its
``attempt.started`` and ``attempt.finished`` messages (``AttemptTrace.first_seq`` and
``last_seq``): the tracer writes an attempt's messages one after another, so they lie there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar, Literal

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.tools import VerifierScore
from streams.topology import TraceAddress, trace_subject

# Several summary events share an attempt's address: parse each subject once, not once per event.
_address = lru_cache(maxsize=65_536)(TraceAddress.parse)

Outcome = Literal["running", "passed", "failed", "infra_failure"]


class AttemptTrace(msgspec.Struct):
    """One task attempt as the trace store holds it: its summary, and the span of the log it was written in."""

    run: str
    round: int
    task: str
    attempt: int
    steps: int = 0
    """Steps the attempt took, as its ``attempt.finished`` says (0 while it runs)."""
    outcome: Outcome = "running"
    status: str = ""
    score: float = 0.0
    reason: str = ""
    harness_digest: str = ""
    model: str = ""
    verifier_passed: bool | None = None
    first_seq: int = 0
    """Sequence of the attempt's first summary message (its ``attempt.started``): none of its events is before it."""
    last_seq: int = 0
    """Sequence of the last summary message seen: once the attempt ended, its ``attempt.finished``, its last event."""

    @property
    def subject(self) -> str:
        """The attempt's own trace subject (its frames)."""
        return trace_subject(self.run, self.round, self.task, self.attempt)

    @property
    def filters(self) -> list[str]:
        """Subject filters that read every event of the attempt: its frames and its summary channels."""
        subject = self.subject
        return [subject, f"{subject}.*"]


def attempt_key(run: str, round: int, task: str, attempt: int) -> str:
    """The trace store's key of one attempt."""
    return f"{run}/{round}/{task}/{attempt}"


class TraceStore(Projection[dict[str, AttemptTrace]]):
    """Per task attempt: harness, model, steps, outcome, score, and where on the log its events lie."""

    name: ClassVar[str] = "trace_store"
    version: ClassVar[int] = 2
    """2: summary events only, no reference per event (1 kept one per event: its state grew with the log)."""
    reads = frozenset({AttemptStarted.TYPE, VerifierScore.TYPE, AttemptFinished.TYPE})
    state_type = dict[str, AttemptTrace]

    def initial(self) -> dict[str, AttemptTrace]:
        """No attempts yet."""
        return {}

    def fold(self, state: dict[str, AttemptTrace], record: Record) -> dict[str, AttemptTrace]:
        """Update the summary of the record's attempt."""
        event = record.event
        try:
            addr = _address(record.subject)
        except ValueError:
            return state
        if addr.round is None or addr.task is None or addr.attempt is None:
            return state  # a summary type on a run- or round-level subject belongs to no attempt
        key = attempt_key(addr.run, addr.round, addr.task, addr.attempt)
        trace = state.get(key)
        if trace is None:
            trace = state[key] = AttemptTrace(addr.run, addr.round, addr.task, addr.attempt, first_seq=record.seq)
        trace.last_seq = record.seq
        if isinstance(event, AttemptStarted):
            trace.harness_digest = event.harness_digest
            trace.model = event.model
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
