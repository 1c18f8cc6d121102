"""What ``hx evolve`` wires around the loop: progress on the terminal, approvals, the LLM stages, resumed jobs,
and what it says when stopped (``StopNote``: what the ledger keeps, how to resume)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import click
import msgspec
import nats.errors
from rich.console import Console
from rich.progress import Progress as Bar
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from hx.aegis.code import CodeStore
from hx.aegis.gate import Verdict
from hx.aegis.ledger import read_records
from hx.aegis.llm_stages import LlmCritic, LlmProse, llm_prose
from hx.aegis.meta import MetaAgent
from hx.aegis.session import EvolveJob
from hx.aegis.settings import Progress
from hx.aegis.smoke import SandboxCodeCheck
from hx.cli.learn import describe
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from schemas.errors import HxError
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import (
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    LedgerOpened,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    VariantForked,
    VariantRetired,
)
from streams.connection import Connection

STOP_READ_S = 10.0
"""How long a stopping ``hx evolve`` waits to read its ledger for the note (a second SIGTERM ends it at once)."""
_ROUND_PARTS = {
    RoundDigested.TYPE: ("digest", "digests"), LandscapePlanned.TYPE: ("plan", "plans"),
    CandidateProposed.TYPE: ("candidate", "candidates"), CandidateRevised.TYPE: ("revision", "revisions"),
    CriticJudged.TYPE: ("critic's verdict", "critic's verdicts"),
    ApprovalRequested.TYPE: ("approval request", "approval requests"),
    GateJudged.TYPE: ("gate verdict", "gate verdicts"), HarnessShipped.TYPE: ("ship", "ships"),
    VariantForked.TYPE: ("fork", "forks"), VariantRetired.TYPE: ("retired variant", "retired variants"),
    ModelChanged.TYPE: ("model change", "model changes"),
}
"""What a round's ledger events are called in the stop note (singular, plural)."""
_COUNTED = {CandidateProposed.TYPE, CandidateRevised.TYPE, ApprovalRequested.TYPE, GateJudged.TYPE,
            HarnessShipped.TYPE, VariantForked.TYPE, VariantRetired.TYPE}


async def load_job(conn: Connection, run_id: str) -> EvolveJob | None:
    """The job a run's ledger recorded (None when the run has no ledger)."""
    records = await read_records(conn, run_id)
    if records is None:
        return None
    opened = records[0]
    assert isinstance(opened, LedgerOpened)
    return msgspec.convert(opened.settings, EvolveJob)


class EvolveProgress:
    """A live line on stderr (round, stage, attempts, elapsed) and a printed line per decision."""

    def __init__(self, console: Console, rounds: int) -> None:
        self.console = console
        self.rounds = rounds
        self.attempts = 0
        self.began = time.perf_counter()
        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"),
                        TextColumn("{task.fields[attempts]:,} attempts"), TimeElapsedColumn(), console=console,
                        transient=True)
        self._job = self._bar.add_task("starting", attempts=0, total=None)

    def __enter__(self) -> EvolveProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._bar.__exit__(kind, exc, tb)

    def attempt(self, _: AttemptResult) -> None:
        """One more attempt finished."""
        self.attempts += 1
        self._bar.update(self._job, attempts=self.attempts)

    def _describe(self, text: str) -> None:
        self._bar.update(self._job, description=text)

    def _decided(self, decision: RoundDecided) -> None:
        m = decision.metrics
        score = "–" if m.pass_at_k is None else f"{m.pass_at_k:.2f}"
        shipped = f" {', '.join(decision.shipped)}" if decision.shipped else ""
        self.console.print(f"round {decision.round}: {decision.outcome}{shipped} · adaptation pass@k {score} · "
                           f"{m.rollouts:,} attempts · {decision.reason[:100]}", highlight=False)

    def _heldout(self, scored: HeldoutScored) -> None:
        when = "before round 0" if scored.round < 0 else f"after round {scored.round}"
        games = ", ".join(f"{g.game} {g.pass_at_2:.2f}" for g in scored.games if g.pass_at_2 is not None)
        self.console.print(f"held-out {when}: pass@2 {games}", highlight=False)

    def learner(self, record: PolicyUpdated | UpdateSkipped | PolicyGated) -> None:
        """One learner pass (the new policy and its figures, or why the policy was kept), or a policy gate verdict."""
        self.console.print(f"learner {describe(record)}", highlight=False)

    def callbacks(self) -> Progress:
        """The loop's progress callbacks, drawing on this display."""
        return Progress(round=lambda t: self._describe(f"round {t + 1}/{self.rounds}"),
                        stage=lambda t, what: self._describe(f"round {t + 1}/{self.rounds} · {what}"),
                        decided=self._decided, heldout=self._heldout)

    async def approver(self, candidate: CandidateProposed, verdict: Verdict) -> bool:
        """Ask at the terminal whether a risky candidate that passed the gate may ship."""
        self._bar.stop()
        try:
            ops = "; ".join(msgspec.json.encode(op).decode() for op in candidate.operations)
            return click.confirm(f"{candidate.candidate} (risk {candidate.risk:.2f}) passed the gate: {ops}\nship it?",
                                 default=False, err=True)
        finally:
            self._bar.start()


@dataclass
class LlmParts:
    """The code store with its sandbox, and what a meta-model adds: its agent, a critic, the digest prose."""

    store: CodeStore
    code_check: SandboxCodeCheck
    meta: MetaAgent | None = None
    critic: LlmCritic | None = None
    prose: LlmProse | None = None

    async def aclose(self) -> None:
        """Close the meta-model's providers."""
        if self.meta is not None:
            await self.meta.aclose()


def llm_parts(conn: Connection, job: EvolveJob, data_dir: Path) -> LlmParts:
    """The LLM stages of a job (none without a meta-model); new code is kept under ``data_dir/plugins``."""
    store = CodeStore(conn.log, Path(data_dir).resolve() / "plugins")
    parts = LlmParts(store=store, code_check=SandboxCodeCheck(store))
    if job.meta_model:
        parts.meta = MetaAgent(ModelConfig(main=job.meta_model), conn.log, job.run_id)
        parts.critic, parts.prose = LlmCritic(parts.meta, store), llm_prose(parts.meta)
    return parts


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def ledger_holds(records: Sequence[LedgerEvent]) -> str:
    """What an unfinished run's ledger keeps, in words: held-out before round 0, rounds decided, the next round."""
    decided = sorted({r.round for r in records if isinstance(r, RoundDecided)})
    upcoming = decided[-1] + 1 if decided else 0
    held = sorted({r.round for r in records if isinstance(r, HeldoutScored)})
    when = [f"after round {r}" if r >= 0 else "before round 0" for r in held]
    kept = [f"the held-out scores ({', '.join(when)})" if len(when) > 1 else f"the held-out score {when[0]}"
            ] if held else []
    if decided:
        kept.append(f"rounds 0..{decided[-1]} decided" if decided[-1] else "round 0 decided")
    counts = Counter(type(r).TYPE for r in records
                     if getattr(r, "round", None) == upcoming and not isinstance(r, RoundDecided | HeldoutScored))
    parts = [(f"{n} {_ROUND_PARTS[t][1]}" if n > 1 else f"1 {_ROUND_PARTS[t][0]}") if t in _COUNTED
             else _ROUND_PARTS.get(t, (t, t))[0] for t, n in counts.items()]
    if parts:
        kept.append(f"round {upcoming}'s {_and(parts)}")
    return _and(kept) if kept else "nothing of round 0 yet"


@dataclass
class StopNote:
    """What a stopped ``hx evolve`` (Ctrl-C, SIGTERM) says on stderr: what its ledger keeps and how to resume.

    The ledger is read as the command stops (``on_stop``), not guessed from memory.
    """

    run_id: str
    command: str
    """``hx evolve`` or ``hx coevolve``: the command that resumes the run."""
    records: list[LedgerEvent] | None = None
    read: bool = False
    """Whether the ledger was read (``records`` None then means the run has no ledger)."""

    async def read_ledger(self, conn: Connection) -> None:
        """Read the run's ledger as it stands now; on failure the note says it could not."""
        try:
            self.records = await asyncio.wait_for(read_records(conn, self.run_id), STOP_READ_S)
            self.read = True
        except (HxError, nats.errors.Error, TimeoutError):
            self.read = False  # the note then says so rather than guess

    def line(self, why: str) -> str:
        """The one line: ``stopped by <why>: the ledger of RUN keeps ...; resume with: hx evolve --resume RUN``."""
        resume = f"resume with: {self.command} --resume {self.run_id}"
        if not self.read:
            return (f"stopped by {why}; the ledger of {self.run_id} could not be read (`hx ledger {self.run_id}` "
                    f"shows what it keeps); {resume}")
        if self.records is None:
            return f"stopped by {why} before run {self.run_id} opened its ledger: nothing to resume"
        finished = next((r for r in self.records if isinstance(r, EvolutionFinished)), None)
        if finished is not None:
            return (f"stopped by {why} after run {self.run_id} finished ({finished.rounds} round(s) on its ledger): "
                    "nothing to resume")
        return f"stopped by {why}: the ledger of {self.run_id} keeps {ledger_holds(self.records)}; {resume}"


@contextlib.asynccontextmanager
async def on_stop(conn: Connection, note: StopNote) -> AsyncIterator[None]:
    """On Ctrl-C or SIGTERM (a cancellation), read what the ledger keeps into ``note``, then go on stopping."""
    try:
        yield
    except asyncio.CancelledError:
        if conn.log.gone is None:  # a server that died has nothing to read from: its own error line says so
            await note.read_ledger(conn)
        raise
