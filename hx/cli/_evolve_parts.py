"""What ``hx evolve`` wires around the loop: progress on the terminal, approvals, the LLM stages, resumed jobs,
and what it says when stopped (``StopNote``: what the ledger keeps, how to resume)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import click
import msgspec
from rich.console import Console
from rich.progress import Progress as Bar
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from hx.aegis.job import EvolveJob
from hx.aegis.llm_stages import LlmCritic, LlmProse, llm_prose
from hx.aegis.meta import MetaAgent
from hx.aegis.session import recorded_job
from hx.aegis.settings import Progress
from hx.aegis.smoke import SandboxCodeCheck
from hx.cli.learn import describe
from hx.gate.rule import Verdict
from hx.replay.audit import verified_ledger
from hx.runtime.code import CodeStore
from hx.runtime.loop import AttemptResult
from hx.runtime.models import ModelConfig
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import (
    CandidateProposed,
    HeldoutScored,
    RoundDecided,
)
from streams.connection import Connection


async def load_job(conn: Connection, run_id: str, data_dir: Path) -> EvolveJob:
    """The job a run's ledger recorded, once the ledger verifies against the trace (``LedgerRefused`` names what
    does not; ``AuditError`` a run with no ledger): a resumed run acts on nothing it cannot vouch for."""
    ledger = await verified_ledger(conn.log, run_id, Path(data_dir).resolve() / "plugins")
    assert ledger.opened is not None
    return recorded_job(ledger.opened.settings)


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
                        decided=self._decided, heldout=self._heldout,
                        shown=lambda t, what, line: self._describe(f"round {t + 1}/{self.rounds} · {what}: {line}"))

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
