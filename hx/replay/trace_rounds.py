"""A run's trace rounds read at round level: why each ran, where it ended, and how its attempts came out.

Every trace round of a run begins with ``RoundStarted`` (its purpose: a main rollout, a gate's
fresh attempts, held-out, ...) and ends with ``RoundFinished``, which also records every
attempt's verdict. Both sit on the round's own subject (``hx.trace.<run>.<round>._._``), so
``trace_marks`` reads a run's rounds with one subject-filtered read that opens no attempt
frame, whatever the size of the run; only a round logged before ``RoundFinished`` carried the
verdicts makes ``outcomes`` read that round's ``attempt.finished`` events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from hx.replay.errors import TimeTravelError
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished, RoundFinished, RoundStarted
from streams.log import EventLog
from streams.topology import NO_TOKEN, TRACE, subject_token, trace_filter


async def read_decoded(log: EventLog, stream: str, subjects: Sequence[str], types: Iterable[str] = (), *,
                       what: str) -> AsyncIterator[Record]:
    """``log.read`` that fails on a message this hx cannot decode (another schema version) instead of skipping it.

    ``EventLog`` quarantines such a message and reads on; time travel must not present a
    partial log as the whole (a diff of "identical" steps, no regression), so ``what`` (the
    thing being read) is named in a ``TimeTravelError`` with the message's subject and sequence.
    """
    skipped = log.quarantine.count
    async with aclosing(log.read(stream, subjects=subjects, types=types)) as records:
        async for r in records:
            if log.quarantine.count > skipped:
                break
            yield r
    if log.quarantine.count > skipped:
        bad = log.quarantine.records[-1]
        raise TimeTravelError(f"{what}: this hx cannot decode {bad.stream} message {bad.seq} on {bad.subject} "
                              f"({bad.type or 'no type'}: {bad.reason}); it would read part of the log")


def round_level_filter(run: str) -> str:
    """The subject filter of one run's round-level trace events (no attempt frame is opened)."""
    return f"hx.trace.{subject_token(run)}.*.{NO_TOKEN}.{NO_TOKEN}"


@dataclass
class TraceRound:
    """One trace round of a run: why it ran, where it ended on the trace, and its attempts' verdicts."""

    started: RoundStarted
    start_seq: int
    time_ns: int
    """When its ``RoundStarted`` reached the log (its message's ``Hx-Time``: comparable with a time-travel cut)."""
    end_seq: int = 0
    """The sequence of its ``RoundFinished`` (0: not finished)."""
    end_ns: int = 0
    """The time of its ``RoundFinished`` on the log (0: not finished)."""
    finished: RoundFinished | None = None
    labelled: bool = True
    """False for a ``RoundStarted`` of schema version 1, which did not say what the round was for."""

    @property
    def number(self) -> int:
        """The trace round."""
        return self.started.round


async def trace_marks(log: EventLog, run: str) -> dict[int, TraceRound]:
    """Every trace round of a run, from its round-level events (one subject-filtered read)."""
    trace: dict[int, TraceRound] = {}
    async for r in read_decoded(log, TRACE.name, [round_level_filter(run)], [RoundStarted.TYPE, RoundFinished.TYPE],
                                what=f"the trace of run {run!r}"):
        ev = r.event
        if isinstance(ev, RoundStarted) and ev.round not in trace:
            trace[ev.round] = TraceRound(ev, r.seq, r.frame_ns, labelled=r.version >= 2)
        elif isinstance(ev, RoundFinished) and ev.round in trace:
            trace[ev.round].end_seq, trace[ev.round].end_ns, trace[ev.round].finished = r.seq, r.time_ns, ev
    return trace


Verdicts = dict[tuple[str, int], bool]
"""(task, attempt) -> passed."""


async def outcomes(log: EventLog, run: str, rounds: Iterable[TraceRound]) -> dict[int, Verdicts]:
    """Each finished round's attempt verdicts: from its ``RoundFinished``, or (logged before it held them) attempts."""
    out: dict[int, Verdicts] = {}
    older: list[int] = []
    for tr in rounds:
        fin = tr.finished
        if fin is None:
            continue
        if fin.outcomes or not fin.attempts:
            out[tr.number] = {(m.task_id, m.attempt): m.passed for m in fin.outcomes}
        else:
            older.append(tr.number)
    if older:
        for n in older:
            out[n] = {}
        async for r in read_decoded(log, TRACE.name, [trace_filter(run, n) for n in older], [AttemptFinished.TYPE],
                                    what=f"the attempts of run {run!r}"):
            ev = r.event
            if isinstance(ev, AttemptFinished) and ev.round in out:
                out[ev.round][(ev.task_id, ev.attempt)] = ev.passed
    return out
