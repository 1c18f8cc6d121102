"""Time travel, hx's part: a run's rounds as log positions, and a run's state (``hx state``) as of one.

``--as-of`` takes ``rN`` (round ``N`` of a run) or a bare stream sequence (``1234``). A round
becomes a position per stream: on ``HX_LEDGER`` the run's ``RoundDecided`` of that round, on
``HX_TRACE`` the last ``RoundFinished`` of the trace rounds that belong to it (``stage_round``
of an evolution run; the trace round itself for a plain ``hx run``).

A projection folded as of a position is ``ProjectionRunner.as_of``/``fold_as_of``
(``projections/runner.py``): it starts from the nearest sound snapshot (``projections/snapshots.py``)
or checkpoint at or before the position and never writes the checkpoint. This module is what is
hx's own: the rounds of a run on the log, a round -> position mapping, and the ``hx state`` view.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nats.js.errors import NotFoundError

from hx.replay.audit import refused, verify_ledger
from hx.replay.errors import TimeTravelError
from hx.replay.scoreboard import EvolutionReport, report
from hx.replay.trace_rounds import TraceRound, read_decoded, trace_marks
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from projections.ledger_records import HarnessVersion, LedgerEntry
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory, TaskRound
from schemas.envelope import HX_TIME
from schemas.job import nested_job
from schemas.lifecycle import AttemptFinished
from streams.log import EventLog
from streams.topology import LEDGER, TRACE, trace_filter

_AS_OF = re.compile(r"(?:[rR](?P<round>\d+)|(?P<seq>\d+))")


@dataclass(frozen=True)
class AsOf:
    """Where to stop: a round of a run (``r3``) or a stream sequence (``1234``)."""

    round: int | None = None
    seq: int | None = None

    def __str__(self) -> str:
        return f"r{self.round}" if self.round is not None else str(self.seq)


def parse_as_of(text: str) -> AsOf:
    """``r3`` is round 3, ``1234`` stream sequence 1234; anything else is a ``TimeTravelError``.

    >>> parse_as_of("r3"), parse_as_of("1234")
    (AsOf(round=3, seq=None), AsOf(round=None, seq=1234))
    """
    match = _AS_OF.fullmatch(text.strip())
    if match is None:
        raise TimeTravelError(f"--as-of {text!r} is neither a round (r3) nor a stream sequence (1234)")
    if match["round"] is not None:
        return AsOf(round=int(match["round"]))
    seq = int(match["seq"])
    if seq < 1:
        raise TimeTravelError("a stream sequence starts at 1")
    return AsOf(seq=seq)


# --- a run's rounds on the log ----------------------------------------------------------------


@dataclass
class RunMarks:
    """A run's landmarks: its ledger's fold (an evolution run's; verified) and its trace rounds."""

    run: str
    fold: RunLedger | None
    trace: dict[int, TraceRound]

    @property
    def evolution(self) -> bool:
        """True for a run with an edit ledger (``hx evolve``/``hx coevolve``)."""
        return self.fold is not None

    @property
    def ledger(self) -> list[LedgerEntry]:
        """The run's ledger events with their places (none for a plain run)."""
        return self.fold.entries if self.fold is not None else []

    def decided(self) -> dict[int, LedgerEntry]:
        """Evolution round -> the entry of its ``RoundDecided``."""
        return {n: self.fold.entry_of(d) for n, d in self.fold.decisions.items()} if self.fold is not None else {}

    def rounds(self) -> list[int]:
        """The run's rounds: decided evolution rounds, or the trace rounds of a plain run."""
        return sorted(self.decided()) if self.evolution else sorted(self.trace)

    def main_rounds(self, stage: int) -> list[TraceRound]:
        """The main adaptation rollouts (one per variant) of an evolution round."""
        return [t for _, t in sorted(self.trace.items())
                if t.started.purpose == "main" and t.started.split != "heldout" and t.started.stage_round == stage]

    def check_round(self, round: int) -> None:
        """Raise ``TimeTravelError`` unless the run has round ``round``."""
        known = self.rounds()
        if round not in known:
            have = f"rounds {known[0]}..{known[-1]}" if known else "no finished round"
            raise TimeTravelError(f"run {self.run!r} has no round {round} ({have})")

    def position(self, as_of: AsOf, stream: str) -> int:
        """The sequence of ``stream`` that ``as_of`` names (a round's end, or the sequence itself)."""
        if as_of.seq is not None:
            return as_of.seq
        assert as_of.round is not None
        self.check_round(as_of.round)
        if stream == LEDGER.name:
            if not self.evolution:
                raise TimeTravelError(f"run {self.run!r} has no ledger: a round has no position on {stream}")
            return self.decided()[as_of.round].seq
        if stream != TRACE.name:
            raise TimeTravelError(f"a round has no position on {stream}: give a stream sequence")
        if self.evolution:
            ends = [t.end_seq for t in self.trace.values() if 0 <= t.started.stage_round <= as_of.round]
        else:
            ends = [self.trace[as_of.round].end_seq]
        if not ends or not max(ends):
            raise TimeTravelError(f"round {as_of.round} of run {self.run!r} has no finished trace round")
        return max(ends)


async def run_marks(log: EventLog, run: str) -> RunMarks:
    """Read a run's ledger (verified on the ledger alone: ``LedgerRefused`` names what is wrong) and its
    round-level trace events (subject-filtered reads)."""
    read = await read_run_ledger(log, run)
    fold = refused(await verify_ledger(log, read, trace=False), run) if read is not None else None
    trace = await trace_marks(log, run)
    if fold is None and not trace:
        raise TimeTravelError(f"run {run!r} is not on the log")
    return RunMarks(run, fold, trace)


async def time_of(log: EventLog, stream: str, seq: int) -> int:
    """The append time (``Hx-Time``, ns) of message ``seq`` of ``stream``; ``TimeTravelError`` past the end."""
    last = await log.last_seq(stream)
    if not 1 <= seq <= last:
        raise TimeTravelError(f"position {seq} is not on {stream} (sequences 1..{last})")
    try:
        msg = await log.js.get_msg(stream, seq)
    except NotFoundError:
        raise TimeTravelError(f"message {seq} of {stream} is gone") from None
    try:
        return int((msg.headers or {}).get(HX_TIME, "0"))
    except ValueError:
        return 0


# --- a run's state as of a round or a ledger position -----------------------------------------


@dataclass
class TaskAt:
    """One task's verdicts round by round (evolution rounds), as of the cut."""

    task: str
    rounds: dict[int, TaskRound]

    def pass_at(self, round: int, k: int) -> float | None:
        """pass@k of the task in ``round`` (None when it did not run then or ran fewer than k attempts)."""
        tr = self.rounds.get(round)
        return tr.pass_at(min(k, tr.n)) if tr is not None and tr.n else None


@dataclass
class RunAt:
    """What ``hx state`` shows: the harness of every variant, the task history and the scoreboard at a point."""

    run: str
    as_of: AsOf
    ledger_seq: int
    round: int | None
    """The last round decided at the cut (None: none yet)."""
    harnesses: dict[str, HarnessVersion]
    """Each live variant's harness version at the cut."""
    ran: dict[str, HarnessVersion]
    """Each variant's harness during ``round``."""
    tasks: list[TaskAt]
    report: EvolutionReport
    k: int


async def run_at(log: EventLog, run: str, as_of: AsOf) -> RunAt:
    """Fold the run's ledger (its one fold, ``projections.ledger``) and trace verdicts up to ``as_of``.

    A round cuts at its ``RoundDecided``; a bare sequence is a position on ``HX_LEDGER``. The
    trace is cut at the same moment (the append time of the ledger event): attempts that
    finished by then count.
    """
    marks = await run_marks(log, run)
    if not marks.evolution:
        raise TimeTravelError(f"run {run!r} has no ledger: hx state reads evolution runs (hx evolve, hx coevolve)")
    cut = marks.position(as_of, LEDGER.name)
    cut_time = await time_of(log, LEDGER.name, cut)
    records = [e for e in marks.ledger if e.seq <= cut]
    if not records:
        raise TimeTravelError(f"run {run!r} has no ledger event at or before position {cut} "
                              f"(its first is at {marks.ledger[0].seq})")
    mine = RunLedger()
    for e in records:
        mine.fold(e.event, e.position, e.seq)
    board = report(mine, {})
    decided = [r.round for r in board.rounds]
    last = max(decided) if decided else None
    history: ProjectionRunner[dict[str, TaskRound]] = ProjectionRunner(log, TaskHistory())
    mains = {t.number: t.started.stage_round for t in marks.trace.values() if t.started.purpose == "main"
             and t.started.split != "heldout" and t.time_ns <= cut_time}
    if mains:
        async for r in read_decoded(log, TRACE.name, [trace_filter(run, n) for n in sorted(mains)],
                                    [AttemptFinished.TYPE], what=f"the attempts of run {run!r}"):
            if r.frame_ns <= cut_time:  # when it reached the log, as the cut is
                history.apply(r)
    tasks: dict[str, TaskAt] = {}
    for tr in history.state.values():
        stage = mains.get(tr.round)
        if stage is not None:
            tasks.setdefault(tr.task, TaskAt(tr.task, {})).rounds[stage] = tr
    assert mine.opened is not None
    k = int(nested_job(mine.opened.settings)["rollout"].get("attempts", 2) or 2)
    return RunAt(run, as_of, cut, last, mine.active(), mine.as_of(last) if last is not None else {},
                 sorted(tasks.values(), key=lambda t: t.task), board, k)
