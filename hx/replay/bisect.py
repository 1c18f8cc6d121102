"""``hx bisect``: apply the shipped edits between two rounds one at a time and name the first that flips a task.

The edits are the ships (and the fork, when the task's variant was forked in between) of the
task's variant lineage recorded in rounds ``A`` .. ``B-1``, in ledger order: exactly what
turned the harness the task ran in round ``A`` into the one it ran in round ``B``. Starting
from round ``A``'s harness, each edit is applied with ``hx.harness.edits.apply`` and the
task is run again under the intermediate harness, through the same rollout code and with the
run's model spec, settings and attempt seeds (``attempt_seed(run seed, task, attempt)``, the
attempts its main rollouts used): with a seeded agent and environment a re-run under round
``A``'s harness repeats round ``A``'s outcome, which the report checks. The first harness whose
k-aware outcome (solved: some attempt passed) differs from the first's names the edit; when
none flips the task outright, the first after which its pass count differs (``2/2 -> 1/2``).
Between two rounds with no edit there is nothing to bisect: that is said and nothing is run.

The model is the run's model spec, except in a co-evolution run, whose rounds ran different
policy checkpoints (``policy:<version>``, the ``model_version`` of their ``model.response``
events): there the re-runs use the policy round ``A``'s attempts of the task ran, so only the
harness changes between the trials.

The re-runs are a scratch run of their own (``<run>.bisect-<id>`` unless named), labelled
``bisect`` with the source run in its ``RunStarted``: nothing is written to the run bisected.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from hx.environments.registry import Benchmark, benchmark
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply, describe
from hx.harness.errors import CompositionError
from hx.replay.errors import TimeTravelError
from hx.replay.harness_diff import harness_in, task_round, task_variant
from hx.replay.regressions import AttemptEvidence, attempts_of, ledger_of
from hx.replay.timetravel import run_marks
from hx.runtime.models import ModelConfig, restore_spec
from projections.ledger import RunLedger
from schemas.edits import AnyEditOp
from schemas.identities import PolicyVersion, is_policy, policy_spec
from schemas.job import nested_job
from streams.log import EventLog
from streams.redaction import scrub
from streams.topology import check_run_id


@dataclass(frozen=True)
class Edit:
    """One shipped edit between the rounds: a ship or fork, its candidates and operations."""

    round: int
    kind: str
    """``ship`` or ``fork``."""
    variant: str
    candidates: tuple[str, ...]
    operations: tuple[AnyEditOp, ...]

    @property
    def name(self) -> str:
        """How the report names it."""
        return f"{'+'.join(self.candidates)} ({self.kind} to {self.variant} in round {self.round})"

    @property
    def lines(self) -> list[str]:
        """Its operations, one line each."""
        return [describe(op) for op in self.operations]


@dataclass
class Trial:
    """The task re-run under one intermediate harness."""

    edits: int
    """How many edits the harness has applied (0: round A's harness)."""
    digest: str
    trace_round: int
    attempts: int = 0
    passes: int = 0

    @property
    def solved(self) -> bool:
        """Some attempt passed (the gate's k-aware state)."""
        return self.passes > 0


@dataclass
class Bisection:
    """``hx bisect``: the edits, a trial per intermediate harness, and the first edit that flips the task."""

    run: str
    task: str
    rounds: tuple[int, int]
    scratch: str
    edits: list[Edit]
    trials: list[Trial] = field(default_factory=list)
    logged: tuple[bool, bool] = (False, False)
    """The task's solved state as the run logged it in rounds A and B."""
    reaches: bool = True
    """The edits applied to round A's harness give round B's."""
    model: str = ""
    """The model spec the re-runs used, as shown (credentials masked)."""
    model_note: str = ""
    """Why that model (the run's spec, or round A's policy checkpoint)."""

    @property
    def flip(self) -> Edit | None:
        """The first edit after which the task's outcome differs from round A's harness's."""
        if not self.trials:
            return None
        first = self.trials[0].solved
        hit = next((t for t in self.trials[1:] if t.solved != first), None)
        return self.edits[hit.edits - 1] if hit is not None else None

    @property
    def shift(self) -> Edit | None:
        """When no edit flips the task: the first edit after which its pass count differs from round A's harness's."""
        if not self.trials or self.flip is not None:
            return None
        first = self.trials[0]
        hit = next((t for t in self.trials[1:] if t.passes * first.attempts != first.passes * t.attempts), None)
        return self.edits[hit.edits - 1] if hit is not None else None

    @property
    def reproduced(self) -> bool:
        """The re-run under round A's harness repeats round A's logged outcome."""
        return bool(self.trials) and self.trials[0].solved == self.logged[0]


def edits_between(ledger: RunLedger, va: str, vb: str, a: int, b: int) -> list[Edit]:
    """The ships (and the fork) of the lineage from ``va`` in round ``a`` to ``vb`` in round ``b``, in ledger order."""
    lineage, out = va, []
    for ship in ledger.shipments:
        if not a <= ship.round < b:
            continue
        if ship.kind == "ship" and ship.variant == lineage:
            out.append(Edit(ship.round, "ship", ship.variant, ship.candidates, ship.event.operations))
        elif ship.kind == "fork" and ship.on == lineage and ship.variant == vb:
            out.append(Edit(ship.round, "fork", ship.variant, ship.candidates, ship.event.operations))
            lineage = vb
    return out


def rerun_model(spec: str, before: Sequence[AttemptEvidence], after: Sequence[AttemptEvidence]) -> tuple[str, str]:
    """(model spec, why) for the re-runs: the run's spec, or round A's policy when the rounds ran different ones."""
    versions_a = {v for a in before for v in a.versions}
    versions_b = {v for a in after for v in a.versions}
    # only the trainable policy changes under a run: another provider's version is not a checkpoint to load
    policy = is_policy(spec) or any(is_policy(a.model) for a in before)
    if not policy or not versions_a or versions_a == versions_b:
        return spec, "the run's model spec"
    if len(versions_a) == 1:
        [version] = versions_a
        # a co-evolution round runs one checkpoint: the policy provider loads it by version
        why = (f"co-evolution run: round A's attempts ran policy version {version}, round B's "
               f"{', '.join(sorted(versions_b)) or 'none logged'}")
        return policy_spec(PolicyVersion(version)), why
    return spec, f"the run's model spec (round A's attempts ran several versions: {', '.join(sorted(versions_a))})"


def scratch_id(run: str, scratch: str | None) -> str:
    """The scratch run's id (never the run itself)."""
    name = check_run_id(scratch or f"{run[:100]}.bisect-{uuid.uuid4().hex[:8]}")
    if name == run:
        raise TimeTravelError("the scratch run must not be the run bisected")
    return name


async def bisect(log: EventLog, run: str, task: str, a: int, b: int, *, scratch: str | None = None,
                 model: str | None = None, make_benchmark: Callable[[str], Benchmark] = benchmark) -> Bisection:
    """Re-run ``task`` under each harness between rounds ``a`` and ``b``; name the first edit that flips it.

    ``model``: the run's recorded model spec again, with the credentials the record masks.
    """
    if a >= b:
        raise TimeTravelError(f"--from {a} must be an earlier round than --to {b}")
    marks = await run_marks(log, run)
    if not marks.evolution:
        raise TimeTravelError(f"run {run!r} has no ledger: hx bisect applies an evolution run's shipped edits")
    state = ledger_of(marks)
    assert state.opened is not None
    job = nested_job(state.opened.settings)
    model_spec = restore_spec(str(job.get("model", "random:")), model, option="--model", what=f"run {run!r}")
    digests = {n: {d.task: d for d in ds} for n, ds in state.digests.items()}
    variants = {n: {t: d.variant for t, d in ds.items()} for n, ds in digests.items()}
    va, vb = task_variant(marks, variants, task, a), task_variant(marks, variants, task, b)
    edits = edits_between(state, va, vb, a, b)
    if not edits:
        raise TimeTravelError(f"no edit was shipped to {va} (the variant {task!r} ran) between round {a} and round "
                              f"{b}: nothing to bisect, nothing re-run")
    (_, ta), (_, tb) = task_round(marks, variants, task, a), task_round(marks, variants, task, b)
    harnesses = [harness_in(state, va, a)]
    for edit in edits:
        try:
            harnesses.append(apply(harnesses[-1], edit.operations))
        except CompositionError as exc:
            raise TimeTravelError(f"edit {edit.name} does not apply: {exc}") from None
    result = Bisection(run, task, (a, b), scratch_id(run, scratch), edits,
                       logged=(digests[a][task].solved, digests[b][task].solved),
                       reaches=harnesses[-1].digest == harness_in(state, vb, b).digest)
    first = marks.trace[ta].started.first_attempt
    settings = msgspec.convert(job["rollout"], RolloutSettings)
    ran = await attempts_of(log, run, [ta, tb], [task])
    live, result.model_note = rerun_model(model_spec, [x for x in ran[task] if x.trace_round == ta],
                                          [x for x in ran[task] if x.trace_round == tb])
    result.model = scrub(live)
    names = sorted({str(spec).partition(":")[0] for spec in job.get("benches", ())} or {task.partition(":")[0]})
    benches = [make_benchmark(n) for n in names]
    try:
        await _trials(log, result, harnesses, benches, ModelConfig(main=live), settings, first)
    finally:
        for bench in benches:
            bench.close()
    return result


async def _trials(log: EventLog, result: Bisection, harnesses: list[HarnessConfig], benches: list[Benchmark],
                  models: ModelConfig, settings: RolloutSettings, first: int) -> None:
    """One scratch trace round per intermediate harness, each attempt seeded as the run seeded it."""
    for i, harness in enumerate(harnesses):
        rollout = Rollout(benches, models, harness, log=log, settings=settings, harness_source=f"bisect:{i}")
        if i == 0:
            await rollout.start(result.scratch, kind="bisect", extra={
                "source_run": result.run, "task": result.task, "rounds": list(result.rounds)})
        outcome = await rollout.run_round(result.scratch, i, [result.task], label=RoundLabel(
            purpose="bisect", variant=f"edits:{i}", first_attempt=first))
        result.trials.append(Trial(i, harness.digest, i, len(outcome.results),
                                   sum(r.passed for r in outcome.results)))
    await Rollout(benches, models, harnesses[-1], log=log, settings=settings).finish(
        result.scratch, rounds=len(harnesses))
