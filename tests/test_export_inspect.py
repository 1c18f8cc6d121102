"""``hx export --inspect RUN DIR``: a real evolution run's evaluations written as Inspect AI eval logs, read back by
Inspect itself (``inspect_ai.log``), checked against hx's own figures read off the trace and the ledger.

One real two-round run on toyworld (``audit_kit.evolved_run``) for the module; the last test adds
a live round to its trace (an attempt still in flight), so it runs last.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean

import pytest
from audit_kit import EvolvedRun, evolved_run
from hx_cli import error_line, ok
from inspect_ai.log import EvalLog, list_eval_logs, read_eval_log
from ledger_forger import ledger_of

from hx.replay.trace_rounds import trace_marks
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundStarted
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, TraceAddress, trace_filter

LIVE_ROUND = 900
"""The trace round the in-flight test adds (far past the run's own)."""


@pytest.fixture(scope="module")
def evolved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvolvedRun]:
    """A real two-round evolution run with held-out evaluations before and after."""
    with evolved_run(tmp_path_factory.mktemp("inspect"), "evo-inspect") as run:
        yield run


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def logs(directory: Path) -> list[EvalLog]:
    """Every eval log Inspect lists in ``directory``, read in full, oldest first."""
    return sorted((read_eval_log(info.name) for info in list_eval_logs(str(directory))),
                  key=lambda log: log.eval.created)


async def trace_figures(url: str, run_id: str) -> dict[int, dict[tuple[str, int], tuple[bool, float | None]]]:
    """Trace round -> (task, attempt) -> (passed, verifier score), read off the trace."""
    async with connect(NatsSettings(url=url)) as conn:
        marks = await trace_marks(conn.log, run_id)
        out: dict[int, dict[tuple[str, int], tuple[bool, float | None]]] = {n: {} for n in marks}
        scores: dict[str, float] = {}
        async for r in conn.log.read(TRACE.name, subjects=[trace_filter(run_id)],
                                     types=[AttemptFinished.TYPE, VerifierScore.TYPE]):
            if isinstance(r.event, VerifierScore):
                scores[r.subject] = r.event.score
            elif isinstance(r.event, AttemptFinished):
                out[r.event.round][(r.event.task_id, r.event.attempt)] = (r.event.passed, scores.get(r.subject))
    return out


def test_each_main_rollout_and_heldout_evaluation_is_an_inspect_log_with_hx_figures(evolved: EvolvedRun,
                                                                                     tmp_path: Path) -> None:
    out = tmp_path / "logs"
    assert "as Inspect AI eval logs (4 logs)" in ok(evolved.hx("export", "--inspect", evolved.run_id, str(out))).stdout
    ledger = asyncio.run(ledger_of(evolved.url, evolved.run_id))
    figures = asyncio.run(trace_figures(evolved.url, evolved.run_id))
    found = logs(out)
    digested = [r.digested for r in ledger.ordered() if r.digested is not None]
    assert [(log.eval.metadata or {})["kind"] for log in found] == ["heldout", "main", "main", "heldout"]
    assert len(digested) == 2 and len(ledger.heldout) == 2

    mains = [log for log in found if log.eval.task == "adaptation"]
    for log, digest in zip(mains, digested, strict=True):
        assert log.status == "success" and log.eval.run_id == evolved.run_id and log.eval.model == "random:"
        assert (log.eval.metadata or {})["trace_rounds"] == list(digest.trace_rounds)
        want = {key: v for t in digest.trace_rounds for key, v in figures[t].items()}
        got = {(str(s.id), s.epoch - 1): s for s in log.samples or []}
        assert sorted(got) == sorted(want) and len(want) == sum(d.attempts for d in digest.digests)
        for key, (passed, score) in want.items():
            s = got[key]
            assert s.scores is not None and s.scores["passed"].value == ("C" if passed else "I")
            assert s.scores["score"].value == score
        accuracy = {sc.name: sc.metrics for sc in log.results.scores} if log.results else {}
        assert accuracy["passed"]["accuracy"].value == pytest.approx(fmean(p for p, _ in want.values()))
        assert accuracy["score"]["mean"].value == pytest.approx(fmean(s for _, s in want.values() if s is not None))
        assert log.results is not None and log.results.total_samples == len(want)

    held = [log for log in found if log.eval.task == "heldout"]
    for log, scored in zip(held, ledger.heldout, strict=True):
        # the ledger keeps only aggregates: the log's accuracy is its pass@1 (every task ran the same attempts)
        assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == pytest.approx(
            scored.pass_at_1)
        assert len({s.id for s in log.samples or []}) == scored.tasks
        assert (log.eval.metadata or {})["round"] == scored.round
    assert [log.eval.task_display_name for log in held] == ["held-out before round 0", "held-out after round 1"]

    for log in found:
        for s in log.samples or []:
            roles = [m.role for m in s.messages]
            assert roles[:2] == ["system", "user"] and "assistant" in roles and "tool" in roles
            assert s.input and isinstance(s.input, str) and s.input in s.messages[1].text
            assert s.metadata["status"] in ("completed", "budget_exhausted")
            assert s.metadata["harness_digest"].startswith("sha256:")
            # the attempt's own start and end times on the log: a duration, not two events of one frame
            assert s.total_time is not None and s.total_time > 0
    header = read_eval_log(list_eval_logs(str(out))[0].name, header_only=True)
    assert header.samples is None and header.results is not None and header.results.total_samples > 0


def test_the_same_log_gives_the_same_bytes(evolved: EvolvedRun, tmp_path: Path) -> None:
    ok(evolved.hx("export", "--inspect", evolved.run_id, str(tmp_path / "a")))
    ok(evolved.hx("export", "--inspect", evolved.run_id, str(tmp_path / "b")))
    first = tree(tmp_path / "a")
    assert first == tree(tmp_path / "b") and len(first) == 5 and ".hx-export" in first


def test_a_directory_that_is_not_an_hx_inspect_export_is_refused(evolved: EvolvedRun, tmp_path: Path) -> None:
    ok(evolved.hx("export", "--inspect", evolved.run_id, str(tmp_path / "mine")))
    foreign = tmp_path / "foreign"  # an Inspect log dir hx did not write
    foreign.mkdir()
    name = next(p for p in (tmp_path / "mine").iterdir() if p.suffix == ".json").name
    shutil.copy(tmp_path / "mine" / name, foreign / name)
    plain = evolved.export  # a run directory from plain `hx export`
    before = {p: tree(p) for p in (foreign, plain)}
    for force in ((), ("--force",)):
        line = error_line(evolved.hx("export", "--inspect", evolved.run_id, str(foreign), *force))
        assert line.startswith(f"error: not an hx export: {foreign} is not empty")
        line = error_line(evolved.hx("export", "--inspect", evolved.run_id, str(plain), *force))
        assert line == (f"error: not an hx export --inspect log directory: {plain} holds an hx export run "
                        f"directory (run {evolved.run_id}); refusing to replace it, --force or not")
        line = error_line(evolved.hx("export", evolved.run_id, str(tmp_path / "mine"), *force))
        assert "not an hx export run directory: " in line and "holds an hx export --inspect log directory" in line
    assert {p: tree(p) for p in (foreign, plain)} == before
    assert "pass --force" in error_line(evolved.hx("export", "--inspect", evolved.run_id, str(tmp_path / "mine")))
    ok(evolved.hx("export", "--inspect", evolved.run_id, str(tmp_path / "mine"), "--force"))
    assert error_line(evolved.hx("export", "--inspect", "nope", str(tmp_path / "x"))) == \
        "error: run 'nope' has no ledger (no evolution run of that id is on HX_LEDGER)"
    assert "--trajectories does not apply" in error_line(
        evolved.hx("export", "--inspect", "--trajectories", evolved.run_id, str(tmp_path / "y")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "mine"]  # nothing half-written


async def live_round(url: str, run_id: str, *, finish: bool) -> None:
    """A main rollout still running on the trace: one attempt finished, the other started (``finish``: now ended)."""
    task = "toyworld:rooms:dev:0"
    async with connect(NatsSettings(url=url)) as conn:
        def at(attempt: int | None) -> str:
            return TraceAddress(run_id, LIVE_ROUND, task if attempt is not None else None, attempt).subject

        if not finish:
            await conn.log.append(at(None), RoundStarted(run_id=run_id, round=LIVE_ROUND, task_ids=(task,),
                                                         split="adaptation", attempts_per_task=2, purpose="main",
                                                         variant="v0", stage_round=2))
            for attempt in (0, 1):
                await conn.log.append(at(attempt), AttemptStarted(run_id=run_id, round=LIVE_ROUND, task_id=task,
                                                                  attempt=attempt, model="random:"))
        for attempt in (1,) if finish else (0,):
            await conn.log.append(at(attempt), VerifierScore(verifier="toyworld", passed=True, score=1.0))
            await conn.log.append(at(attempt), AttemptFinished(run_id=run_id, round=LIVE_ROUND, task_id=task,
                                                               attempt=attempt, passed=True, score=1.0, steps=3))


def test_attempts_in_flight_are_left_out_with_a_note_and_exported_once_they_finish(evolved: EvolvedRun,
                                                                                     tmp_path: Path) -> None:
    out = tmp_path / "logs"
    asyncio.run(live_round(evolved.url, evolved.run_id, finish=False))
    result = ok(evolved.hx("export", "--inspect", evolved.run_id, str(out)))
    assert "note: 1 attempt(s) still in flight (started, not finished) were left out" in result.stderr
    live = [log for log in logs(out) if (log.eval.metadata or {})["trace_rounds"] == [LIVE_ROUND]]
    assert len(live) == 1 and live[0].status == "started" and live[0].eval.task_display_name == "round 2 main rollout"
    assert [(s.id, s.epoch) for s in live[0].samples or []] == [("toyworld:rooms:dev:0", 1)]

    asyncio.run(live_round(evolved.url, evolved.run_id, finish=True))
    result = ok(evolved.hx("export", "--inspect", evolved.run_id, str(out), "--force"))
    assert "in flight" not in result.stderr
    live = [log for log in logs(out) if (log.eval.metadata or {})["trace_rounds"] == [LIVE_ROUND]]
    assert [(s.id, s.epoch) for s in live[0].samples or []] == [("toyworld:rooms:dev:0", 1),
                                                                 ("toyworld:rooms:dev:0", 2)]
