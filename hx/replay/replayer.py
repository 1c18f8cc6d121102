"""Deterministic replay: a logged round re-executed by the run loop and compared, event body by event body.

``replay_round`` reads the round's attempts (one subject-filtered read, each attempt
replayed as soon as the read reaches its end and dropped once compared), finds the harness
the round ran (its ``harness_digest``: from the run's ledger, or for a plain ``hx run``
from the harness source its ``run.started`` names, checked against the digest), and runs
every attempt again through ``RunLoop`` with

- the model responses of the log (the ``replay:`` provider, every role);
- the environment of the log (``env="log"``, the default: ``RecordedTask`` feeds the
  first observation, every tool result, the environment's events and the verifier's
  score; no game runs), or the real environment (``env="live"``: the benchmark builds the
  task again, and only tools marked nondeterministic are fed from the log);
- the attempt's own seed and the run's step cap.

The replayed events never reach the log: the loop writes them to an in-memory writer and
they are compared with the logged ones (``hx.replay.compare``). A replay under another
harness (``harness=``) shows where behaviour departs from the log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hx.environments.errors import BenchmarkError
from hx.environments.registry import Benchmark, TaskId, benchmark
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harnesses import families, starter_harness
from hx.replay.audit import refused, verify_ledger
from hx.replay.compare import Aliases, Divergence, compare_attempt
from hx.replay.errors import HarnessMissing, ReplayError
from hx.replay.logged import LoggedRound, describe_round, logged_attempts, model_specs, round_header
from hx.replay.recorded import FedTask, RecordedTask, Recording
from hx.runtime.cancel import cancel_all
from hx.runtime.code import CodeStore, restore_plugins
from hx.runtime.loop import RunLoop
from hx.runtime.models import ModelConfig
from hx.runtime.task import Task
from hx.runtime.tracer import TraceWriter
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from projections.ledger_records import HarnessVersion
from schemas.envelope import Record
from schemas.errors import HxError
from schemas.event import Event
from schemas.harness import HarnessSpec
from streams.channels import attempt_subject
from streams.connection import Connection
from streams.topology import trace_subject

Env = Literal["log", "live"]
ENVS: tuple[Env, ...] = ("log", "live")


# --- the harness of a round -----------------------------------------------------------------


def _made(variant: str, version: HarnessVersion) -> str:
    """How a listing names a harness version: ``variant v1, shipped in round 2``."""
    if version.kind == "opened":
        return f"variant {variant}, initial"
    return f"variant {variant}, {'shipped' if version.kind == 'ship' else 'forked'} in round {version.round}"


def harness_on_ledger(ledger: RunLedger, digest: str, *, candidate: str = "",
                      variant: str = "") -> tuple[HarnessConfig, str] | None:
    """The harness of ``digest`` on a run's ledger (a variant's version or a candidate's build).

    Several ledger entries can build the same harness (two candidates with the same edits, a
    candidate equal to a shipped version): the round's own ``candidate`` and ``variant``, when
    given, pick the entry that names it, so the label says what the round ran.
    """
    versions = [(name, v, _made(name, v)) for name, v in ledger.versions()]
    known: dict[str, tuple[HarnessSpec, str]] = {}
    for _, v, label in versions:
        known.setdefault(v.digest, (v.harness, label))

    def candidate_build(only: str) -> tuple[HarnessConfig, str] | None:
        for cand in ledger.candidates.values():
            builds = [p for p in (cand.first, cand.proposal) if p.digest == digest]
            base = known.get(cand.first.base_digest)
            if not builds or (only and cand.id != only) or base is None:
                continue
            try:
                built = apply(HarnessConfig.from_spec(base[0]), builds[-1].operations)
            except CompositionError:
                continue
            if built.digest == digest:
                return built, f"candidate {cand.id} of round {cand.first.round} on {base[1]}"
        return None

    if candidate and (own := candidate_build(candidate)) is not None:
        return own
    mine = [(v.harness, label) for name, v, label in versions if v.digest == digest and name == variant]
    found = mine[0] if variant and mine else known.get(digest)
    if found is not None:
        return HarnessConfig.from_spec(found[0]), found[1]
    return candidate_build("")


def harness_of_source(source: str) -> HarnessConfig | None:
    """The harness a plain run's recorded source names (``starter:FAMILY`` or a file still on disk), if any."""
    family = source.removeprefix("starter:")
    if source.startswith("starter:") and family in families():
        return starter_harness(family)
    path = Path(source)
    if source and path.is_file():
        try:
            return HarnessConfig.load(path)
        except (HxError, OSError):
            return None
    return None


async def run_ledger(conn: Connection, run_id: str, plugin_dir: Path | None = None) -> RunLedger | None:
    """The run's ledger fold, verified on the ledger alone (``LedgerRefused`` when it does not); None: a plain run.

    The code of new processors its harnesses name is restored to ``plugin_dir`` first.
    """
    read = await read_run_ledger(conn.log, run_id)
    if read is None:
        return None
    return refused(await verify_ledger(conn.log, read, plugin_dir, trace=False), run_id)


async def round_harness(conn: Connection, logged: LoggedRound, ledger: RunLedger | None,
                        plugin_dir: Path | None = None) -> tuple[HarnessConfig, str]:
    """The harness the round ran and where it was found; ``HarnessMissing`` when it cannot be rebuilt."""
    digest = logged.harness_digest
    where = f"round {logged.round} of run {logged.run_id!r} ran harness {digest[:19]}"
    if ledger is not None:
        if plugin_dir is not None:
            await restore_plugins(CodeStore(conn.log, plugin_dir), ledger)
        found = harness_on_ledger(ledger, digest, candidate=logged.started.candidate,
                                  variant=logged.started.variant)
        if found is None:
            raise HarnessMissing(f"{where}, which the run's ledger does not hold; pass --harness FILE to replay "
                                 "under a harness of your own")
        return found[0], f"from the ledger ({found[1]})"
    inline = logged.setting("harness_config")
    if isinstance(inline, dict):  # a run that recorded its whole harness (a fork does)
        recorded = HarnessConfig.from_dict(inline, where=f"run.started of run {logged.run_id!r}")
        if recorded.digest == digest:
            return recorded, "from the run's run.started"
    source = str(logged.setting("harness") or "")
    harness = harness_of_source(source)
    if harness is None or harness.digest != digest:
        what = (f"its source {source!r} builds {harness.digest[:19]} now" if harness is not None
                else f"its source {source!r} cannot be read" if source else "the run recorded no harness source")
        raise HarnessMissing(f"{where}; the run has no ledger and {what}; pass --harness FILE to replay under "
                             "a harness of your own")
    return harness, f"from the run's source {source}"


# --- running it again -----------------------------------------------------------------------


class CapturedTrace(TraceWriter):
    """Keeps a replay's events in memory, per attempt subject: nothing reaches the log."""

    def __init__(self) -> None:
        self.events: dict[str, list[Event]] = {}

    async def write(self, subject: str, events: Sequence[Event], key: str) -> None:
        """Keep the frame's events (as emitted: conversations in full) under their attempt's subject."""
        self.events.setdefault(attempt_subject(subject), []).extend(events)


def replay_spec(spec: str) -> str:
    """The spec a replay calls for a logged model spec: its responses, from the log."""
    return f"replay:{spec}"


def replay_models(specs: dict[str, str], options: dict[str, Any] | None = None) -> ModelConfig:
    """Every role answered from the log (``replay:`` with ``options``), no retries."""
    main = specs.get("main", "random:")
    roles = {role: replay_spec(spec) for role, spec in specs.items() if role != "main"}
    used = {replay_spec(s) for s in specs.values()} | {replay_spec(main)}
    return ModelConfig(main=replay_spec(main), roles=roles, retries=0,
                       provider_options={s: dict(options or {}) for s in used})


@dataclass
class ReplayReport:
    """What a replay found."""

    run_id: str
    round: int
    attempts: int
    events: int
    """Logged events compared."""
    harness_note: str
    env: Env
    seconds: float
    """How long the replay took (wall clock)."""
    logged_s: float = 0.0
    """How long the replayed attempts took when they were logged, summed (from their events' own times)."""
    logged_model_s: float = 0.0
    """Of which, waiting on model calls (the ``took_ns`` of their responses and errors), summed."""
    what: str = ""
    """What the trace round was ("trace round 11: gate rollouts of candidate C-R1-03 on v0, evolution round 1")."""
    divergence: Divergence | None = None
    diverged: int = 0
    """Attempts that diverged."""
    first_attempt: tuple[str, int] | None = None
    """The (task, attempt) of the first divergence."""

    @property
    def identical(self) -> bool:
        """True when every replayed event body equals the logged one."""
        return self.divergence is None


def open_benchmarks(task_ids: Iterable[str]) -> dict[str, Benchmark]:
    """The benchmarks that build the given tasks (to close after use)."""
    out: dict[str, Benchmark] = {}
    try:
        for text in task_ids:
            name = TaskId.parse(text).benchmark
            if name not in out:
                out[name] = benchmark(name)
    except BaseException:
        close_benchmarks(out)
        raise
    return out


def close_benchmarks(benches: dict[str, Benchmark]) -> None:
    """Close every benchmark opened."""
    for bench in benches.values():
        bench.close()


def live_task(benches: dict[str, Benchmark], task_id: str) -> Task:
    """A fresh real task; ``BenchmarkError`` when its benchmark cannot build it."""
    tid = TaskId.parse(task_id)
    try:
        return benches[tid.benchmark].make_task(tid)
    except BenchmarkError:
        raise
    except Exception as exc:  # noqa: BLE001 - a benchmark's failure to build, named for the person replaying
        raise BenchmarkError(f"the benchmark could not build task {task_id!r}: {type(exc).__name__}: {exc}") from None


async def replay_round(conn: Connection, run_id: str, round: int, *, task: str | None = None,
                       attempt: int | None = None, harness: HarnessConfig | None = None, env: Env = "log",
                       plugin_dir: Path | None = None, concurrency: int = 4) -> ReplayReport:
    """Replay a logged round (or one task's or attempt's part of it) and compare it with the log.

    Attempts are replayed as the read reaches their end and dropped once compared, so
    memory follows the run's concurrency, not the round's size.
    """
    if env not in ENVS:
        raise ReplayError(f"env {env!r} is not one of {', '.join(ENVS)}")
    header = await round_header(conn.log, run_id, round)
    ledger = await run_ledger(conn, run_id, plugin_dir)
    if harness is None:
        config, note = await round_harness(conn, header, ledger, plugin_dir)
        digests: dict[str, str] = {}
    else:
        config, digests = harness.validate(), {harness.digest: header.harness_digest}
        note = (f"{harness.digest[:19]} from --harness, instead of the logged {header.harness_digest[:19]}"
                if harness.digest != header.harness_digest else f"{harness.digest[:19]} from --harness, as logged")
    max_steps = header.max_steps(ledger)
    report = ReplayReport(run_id, round, 0, 0, note, env, 0.0, what=describe_round(round, header.started))
    benches = open_benchmarks([task] if task is not None else header.started.task_ids) if env == "live" else {}
    queue: asyncio.Queue[tuple[tuple[str, int], list[Record]] | None] = asyncio.Queue(maxsize=2 * concurrency)

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            (task_id, number), records = item
            recording = Recording.of(records)
            specs = model_specs(records)
            capture = CapturedTrace()
            job: Task = (RecordedTask(recording) if env == "log"
                         else FedTask(live_task(benches, task_id), recording.nondeterministic()))
            await RunLoop(replay_models(specs), config, log=conn.log, writer=capture).run(
                job, run_id=run_id, round=round, attempt=number, seed=recording.started.seed, max_steps=max_steps)
            subject = trace_subject(run_id, round, task_id, number)
            aliases = Aliases(models={replay_spec(s): s for s in specs.values()}, digests=digests)
            found = compare_attempt(subject, records, capture.events.get(subject, []), aliases)
            report.attempts += 1
            report.events += len(records)
            if records:
                report.logged_s += (records[-1].time_ns - records[0].time_ns) / 1e9
                report.logged_model_s += sum(r.took_ns for r in records if type(r.event).ENDS == "model") / 1e9
            if found is not None:
                report.diverged += 1
                if report.divergence is None or _order(found) < _order(report.divergence):
                    report.divergence, report.first_attempt = found, (task_id, number)

    began = time.perf_counter()
    # a recorded environment is all Python: one worker; real games run in their own processes, several at once
    count = 1 if env == "log" else max(1, concurrency)

    async def produce() -> None:
        async for item in logged_attempts(conn.log, header, task=task, attempt=attempt):
            await queue.put(item)
        for _ in range(count):
            await queue.put(None)

    tasks = [asyncio.create_task(produce()), *(asyncio.create_task(worker()) for _ in range(count))]
    try:
        await asyncio.gather(*tasks)  # the first failure (of the read or of a replay) ends them all
    except BaseException:
        await cancel_all(tasks)
        raise
    finally:
        close_benchmarks(benches)
    report.seconds = time.perf_counter() - began
    return report


def _order(d: Divergence) -> tuple[int, int]:
    """Log position of a divergence (one past the attempt's end sorts last)."""
    return (d.seq if d.seq is not None else 1 << 62, d.index or 0)
