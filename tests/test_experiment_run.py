"""``hx experiment run`` end to end: a real nats-server, TextWorldExpress coin, the random agent."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hx_cli import error_line, hx, ok

from hx.experiment import runner
from hx.experiment.design import design_cells, units
from hx.experiment.errors import ExperimentError
from hx.experiment.levels import Product, arm_of
from hx.experiment.runner import ExperimentRun, attempt_outputs, run_events
from hx.experiment.spec import parse_spec, spec_digest, spec_to_dict
from hx.harness.config import HarnessConfig
from hx.harnesses import starter_harness
from hx.runtime.models import ModelConfig
from projections.ledger_reader import read_run_ledger
from schemas.experiment import ExperimentConcluded, ExperimentStarted
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundFinished, RoundStarted, RunFinished, RunStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.signing import LedgerKey
from streams.topology import TRACE, trace_filter, trace_subject

SPEC: dict[str, Any] = {
    "title": "history window",
    "hypothesis": "a 4-step history window lowers the random agent's steps on coin",
    "falsified_if": 'diff_low(steps, "short", "long") >= 0',
    "factors": [{"name": "window", "levels": ["long", "short"],
                 "scope": {"kind": "processor_param", "target": "history_window.keep_last",
                           "levels": {"long": 24, "short": 4}}}],
    "tasks": ["twx:coin:dev:0", "twx:coin:dev:1", "twx:coin:dev:2"],
    "replications": 2,
    "response_variables": ["passed", "steps", "invalid_actions"],
    "controlled_variables": {"model": "random:", "max_steps": 12},
    "seed": 5,
}


def write(tmp_path: Path, data: dict[str, Any], name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def records(nats_url: str, run_id: str) -> list[Any]:
    async def read() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [r async for r in conn.log.read(TRACE.name, subjects=[f"{trace_filter(run_id)[:-6]}.>"])]
    return asyncio.run(read())


def conclusion(nats_url: str, run_id: str) -> ExperimentConcluded:
    async def read() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return await run_events(conn.log, run_id)
    [concluded] = [e for e in asyncio.run(read()) if isinstance(e, ExperimentConcluded)]
    return concluded


def plain(value: Any) -> Any:
    return json.loads(msgspec.json.encode(value))


def same_result(a: ExperimentConcluded, b: ExperimentConcluded) -> bool:
    return msgspec.structs.replace(a, run_id="") == msgspec.structs.replace(b, run_id="")


def run(nats_url: str, tmp_path: Path, *args: str) -> Any:
    return hx("--nats-url", nats_url, "--data-dir", str(tmp_path / "data"), "experiment", "run", *args)


def test_a_run_puts_every_unit_on_the_log_in_the_seeded_order_and_concludes(tmp_path: Path, nats_url: str) -> None:
    path = write(tmp_path, SPEC)
    result = ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-one", "--json", "--concurrency", "2"))
    printed = json.loads(result.stdout)
    spec = parse_spec(SPEC)
    logged = records(nats_url, "exp-one")
    events = [r.event for r in logged]
    [started] = [e for e in events if isinstance(e, RunStarted)]
    assert started.kind == "experiment" and started.config["spec_digest"] == spec_digest(spec)
    [exp] = [e for e in events if isinstance(e, ExperimentStarted)]
    assert exp.order == tuple(u.key for u in units(spec)) and exp.spec_digest == spec_digest(spec)
    assert exp.order != tuple(sorted(exp.order))  # shuffled, not in listing order
    # one round per cell, each with the harness its level makes: only keep_last differs
    rounds = {e.round: e for e in events if isinstance(e, RoundStarted)}
    assert [(r, rounds[r].variant) for r in sorted(rounds)] == [(0, "long"), (1, "short")]
    short = starter_harness("textworld").to_dict()
    next(p for p in short["processors"] if p["type"] == "history_window")["params"]["keep_last"] = 4
    assert rounds[0].harness_digest == starter_harness("textworld").digest
    assert rounds[1].harness_digest == HarnessConfig.from_dict(short).digest != rounds[0].harness_digest
    started_attempts = {(e.round, e.task_id, e.attempt) for e in events if isinstance(e, AttemptStarted)}
    assert started_attempts == {(c, t, r) for c in (0, 1) for t in SPEC["tasks"] for r in (0, 1)}
    concluded = conclusion(nats_url, "exp-one")
    assert printed == plain(concluded)
    assert concluded.units == 12 and concluded.spec_digest == spec_digest(spec)
    means = {(s.level, s.variable): s for s in concluded.levels}
    assert set(means) == {(lv, v) for lv in ("long", "short") for v in SPEC["response_variables"]}
    assert means[("long", "passed")].mean.method.startswith("wilson")
    assert all(s.n == 6 for s in concluded.levels)
    assert {(e.level, e.reference, e.variable) for e in concluded.effects} == {
        ("short", "long", v) for v in SPEC["response_variables"]}
    assert concluded.falsified in ("falsified", "not_falsified")
    assert concluded.detail.startswith(SPEC["falsified_if"])
    assert [e.attempts for e in events if isinstance(e, RoundFinished)] == [6, 6]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"]


def test_resume_after_a_unit_budget_equals_an_uninterrupted_run(tmp_path: Path, nats_url: str) -> None:
    path = write(tmp_path, SPEC)
    first = ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-part", "--units", "5"))
    assert "5 of 12 units done" in first.stdout and "--resume exp-part" in first.stdout
    assert not [e for e in (r.event for r in records(nats_url, "exp-part")) if isinstance(e, ExperimentConcluded)]
    # an attempt cut off mid-way (its process killed): started on the log, never finished
    spec = parse_spec(SPEC)
    done = {(r.event.round, r.event.task_id, r.event.attempt) for r in records(nats_url, "exp-part")
            if isinstance(r.event, AttemptStarted)}
    cut = next(u for u in units(spec) if (u.cell.index, u.task, u.replication) not in done)

    async def plant() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            await conn.log.append(trace_subject("exp-part", cut.cell.index, cut.task, cut.replication),
                                  AttemptStarted(run_id="exp-part", round=cut.cell.index, task_id=cut.task,
                                                 attempt=cut.replication))
    asyncio.run(plant())
    resumed = ok(run(nats_url, tmp_path, str(path), "--resume", "exp-part"))
    assert "run exp-part" in resumed.stdout and "falsified_if:" in resumed.stdout
    ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-whole"))
    assert same_result(conclusion(nats_url, "exp-part"), conclusion(nats_url, "exp-whole"))

    async def outputs() -> dict[str, Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return await attempt_outputs(conn.log, "exp-part")
    retried = [o for o in asyncio.run(outputs()).values() if o.task == cut.task and o.round == cut.cell.index]
    # the cut-off attempt stays as it was; the unit ran again on a fresh attempt number
    assert sorted((o.attempt, o.finished) for o in retried if o.attempt % 2 == cut.replication) == [
        (cut.replication, False), (cut.replication + 2, True)]
    again = ok(run(nats_url, tmp_path, str(path), "--resume", "exp-part", "--json"))
    assert json.loads(again.stdout) == plain(conclusion(nats_url, "exp-part"))


def test_resume_refuses_another_spec_and_an_unknown_run(tmp_path: Path, nats_url: str) -> None:
    path = write(tmp_path, SPEC)
    ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-a", "--units", "1"))
    other = write(tmp_path, {**SPEC, "seed": 6}, "other.yaml")
    assert "the spec differs from the one the run started with" in error_line(
        run(nats_url, tmp_path, str(other), "--resume", "exp-a"))
    assert error_line(run(nats_url, tmp_path, str(path), "--resume", "exp-none")) == (
        "error: --resume exp-none: no such run on the log")


def test_a_two_by_two_factorial_reports_its_interaction(tmp_path: Path, nats_url: str) -> None:
    data = {**SPEC, "design": "factorial", "tasks": SPEC["tasks"][:2], "replications": 1,
            "falsified_if": 'diff_high(steps, "window=short", "window=long") > 0',
            "factors": [*SPEC["factors"], {"name": "trim", "levels": ["wide", "narrow"],
                                           "scope": {"kind": "processor_param", "target": "observation_trim.max_chars",
                                                     "levels": {"wide": 3000, "narrow": 200}}}]}
    ok(run(nats_url, tmp_path, str(write(tmp_path, data)), "--run-id", "exp-2x2"))
    concluded = conclusion(nats_url, "exp-2x2")
    assert concluded.units == 8
    arms = {s.level for s in concluded.levels}
    assert {"window=long,trim=wide", "window=short,trim=narrow", "window=short", "trim=narrow"} <= arms
    assert {(i.factors, i.variable) for i in concluded.interactions} == {
        (("window", "trim"), v) for v in SPEC["response_variables"]}
    assert {(e.factor, e.level) for e in concluded.effects} == {("window", "short"), ("trim", "narrow")}
    assert concluded.falsified != "undecided", concluded.detail


@pytest.mark.parametrize(("change", "said"), [
    ({"replications": 0}, "replications: is 0; at least 1"),
    ({"falsified_if": "mean(on) - mean(off) < 0.5 across all replications"}, "falsified_if: does not parse"),
])
def test_a_rejected_spec_is_one_line_and_nothing_is_written(tmp_path: Path, nats_url: str,
                                                            change: dict[str, Any], said: str) -> None:
    path = write(tmp_path, {**SPEC, **change})
    line = error_line(run(nats_url, tmp_path, str(path), "--run-id", "exp-bad"))
    assert line.startswith(f"error: {path}: ") and said in line
    assert records(nats_url, "exp-bad") == []


def test_a_procedure_level_plays_its_evolutions_product_and_an_artifact_level_the_same(
        tmp_path: Path, nats_url: str) -> None:
    data = {**SPEC, "tasks": SPEC["tasks"][:2], "replications": 1,
            "falsified_if": 'diff_high(passed, "evolved", "base") <= 0',
            "factors": [{"name": "procedure", "levels": ["base", "evolved", "again"],
                         "scope": {"kind": "procedure", "target": "evolve",
                                   "levels": {"base": None, "evolved": {"rounds": 1, "tasks": 2, "heldout_tasks": 1,
                                                                        "candidates": 1},
                                              "again": {"artifact_of": "evolved"}}}}]}
    ok(run(nats_url, tmp_path, str(write(tmp_path, data)), "--run-id", "exp-evo"))

    async def ledger() -> Any:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return await read_run_ledger(conn.log, "exp-evo-procedure-evolved")
    evolution = asyncio.run(ledger())
    assert evolution is not None and evolution.finished is not None
    assert evolution.opened.settings["rollout"]["max_steps"] == SPEC["controlled_variables"]["max_steps"]
    # signed with the data directory's key, as hx evolve's ledgers are
    assert evolution.opened.public_key == LedgerKey.of(tmp_path / "data").public_key
    said = ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path / "data"), "audit", "verify",
                 "exp-evo-procedure-evolved")).output
    assert re.search(r"signed: (\d+) of \1 events by key", said), said
    product = evolution.variants[evolution.root].current.digest
    rounds = {e.variant: e.harness_digest for e in (r.event for r in records(nats_url, "exp-evo"))
              if isinstance(e, RoundStarted)}
    assert rounds == {"base": starter_harness("textworld").digest, "evolved": product, "again": product}
    assert conclusion(nats_url, "exp-evo").units == 6


def test_a_forked_evolutions_units_play_the_variant_serving_their_cluster(
        nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evolution that forked serves mapreader from another variant: the experiment plays that one there."""
    base = starter_harness("textworld")
    root, fork = base.remove("loop_detector"), base.remove("history_window")
    spec = parse_spec({**SPEC, "tasks": ["twx:coin:dev:0", "twx:mapreader:dev:0"], "replications": 1,
                       "controlled_variables": {"model": "random:", "max_steps": 4},
                       "falsified_if": 'diff_high(passed, "evolved", "base") <= 0',
                       "factors": [{"name": "p", "levels": ["base", "evolved"],
                                    "scope": {"kind": "procedure", "target": "evolve",
                                              "levels": {"base": None, "evolved": {"rounds": 1}}}}]})

    async def made(*_: Any, **__: Any) -> dict[tuple[str, str, int], Product]:
        # the product an evolution makes is covered above; here only what the play phase does with one
        return {("p", "evolved", 0): Product(root, ModelConfig(main="random:"), {"twx:mapreader": fork})}

    monkeypatch.setattr(runner, "make_products", made)

    async def play() -> dict[tuple[int, str], str]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            assert await ExperimentRun(spec, conn, run_id="exp-fork").run() is not None
            return {(r.event.round, r.event.task_id): r.event.harness_digest
                    async for r in conn.log.read(TRACE.name, subjects=[f"{trace_filter('exp-fork')[:-6]}.>"])
                    if isinstance(r.event, AttemptStarted)}
    played = asyncio.run(play())
    assert played == {(0, "twx:coin:dev:0"): base.digest, (0, "twx:mapreader:dev:0"): base.digest,
                      (1, "twx:coin:dev:0"): root.digest, (1, "twx:mapreader:dev:0"): fork.digest}


def test_each_scope_changes_only_its_target() -> None:
    base = starter_harness("textworld")
    models = ModelConfig(main="random:")

    def arm(kind: str, target: str, levels: dict[str, Any], level: str, config: dict[str, Any] | None = None) -> Any:
        data = {**SPEC, "factors": [{"name": "f", "levels": list(levels),
                                     "scope": {"kind": kind, "target": target, "levels": levels,
                                               "config": config or {}}}],
                "controlled_variables": {}, "falsified_if": f'mean(passed, "{level}") < 0'}
        spec = parse_spec(data)
        [cell] = [c for c in design_cells(spec) if c.name == level]
        return arm_of(spec, cell, base, models)

    removed = arm("processor", "loop_detector", {"on": True, "off": False}, "off")
    assert "loop_detector" not in [p["type"] for p in removed.harness.to_dict()["processors"]]
    assert removed.models == models and removed.env == {}
    added = arm("processor", "loop_detector", {"off": None, "on": True}, "on",
                {"hooks": ["after_tool"], "params": {"warn_after": 2}})
    [detector] = [p for p in added.harness.to_dict()["processors"] if p["type"] == "loop_detector"]
    assert detector["params"]["warn_after"] == 2 and tuple(detector["hooks"]) == ("after_tool",)
    one_param = arm("processor_param", "loop_detector", {"a": {"warn_after": 3}, "b": {"warn_after": 5}}, "b")
    [detector] = [p for p in one_param.harness.to_dict()["processors"] if p["type"] == "loop_detector"]
    assert detector["params"] == {**detector["params"], "warn_after": 5, "interrupt_after": 12}
    model = arm("model", "main", {"a": "random:", "b": "random:b"}, "b")
    assert model.models.main == "random:b" and model.harness.digest == base.digest
    env = arm("env", "HX_EXPERIMENT_FLAG", {"off": None, "on": "1"}, "on")
    assert env.env == {"HX_EXPERIMENT_FLAG": "1"} and env.harness.digest == base.digest
    with pytest.raises(ExperimentError, match="no processor 'nope'"):
        arm("processor_param", "nope.x", {"a": 1, "b": 2}, "b")
    # a procedure level plays its product; an artifact level the product it names; a null level the base
    product = base.remove("loop_detector")
    spec = parse_spec({**SPEC, "falsified_if": 'mean(passed, "evolved") < 0', "controlled_variables": {},
                       "factors": [{"name": "p", "levels": ["base", "evolved", "again"],
                                    "scope": {"kind": "procedure", "target": "evolve",
                                              "levels": {"base": None, "evolved": {"rounds": 1},
                                                         "again": {"artifact_of": "evolved"}}}}]})
    other = base.remove("history_window")
    made = Product(product, models, {"twx:mapreader": other})
    products = {("p", "evolved", 0): made, ("p", "again", 0): made}
    digests = {c.name: arm_of(spec, c, base, models, products).harness.digest for c in design_cells(spec)}
    assert digests == {"base": base.digest, "evolved": product.digest, "again": product.digest}
    # a forked evolution's product: a unit plays the harness of the variant serving its task's cluster
    evolved = arm_of(spec, design_cells(spec)[1], base, models, products)
    assert evolved.harness_for("twx:mapreader:test:3").digest == other.digest
    assert evolved.harness_for("twx:coin:test:3").digest == product.digest
    assert arm_of(spec, design_cells(spec)[0], base, models, products).harness_for("twx:mapreader:dev:0") == base
    # a factor listed before the procedure changes the product too, and each routed harness alike
    crossed = parse_spec({**spec_to_dict(spec), "design": "factorial", "factors": [
        {"name": "d", "levels": ["on", "off"], "scope": {"kind": "processor", "target": "loop_detector",
                                                         "levels": {"on": True, "off": False}}},
        *spec_to_dict(spec)["factors"]]})
    [off] = [c for c in design_cells(crossed) if c.name == "d=off,p=evolved"]
    crossed_arm = arm_of(crossed, off, base, models, products)
    for harness in (crossed_arm.harness, crossed_arm.harness_for("twx:mapreader:dev:0")):
        assert "loop_detector" not in [p["type"] for p in harness.to_dict()["processors"]]
    assert crossed_arm.harness_for("twx:mapreader:dev:0").digest == other.remove("loop_detector").digest
    with pytest.raises(ExperimentError, match="not made yet"):
        arm_of(spec, design_cells(spec)[1], base, models, {})


@pytest.mark.parametrize(("levels", "said"), [
    ({"base": None, "co": {"budget": 4, "mode": "sideways"}}, "mode 'sideways' is not one of harness, model, both"),
    ({"base": None, "evolved": {"rounds": 1, "budget": 4}}, "unknown evolve option(s) budget"),
])
def test_a_procedure_the_runner_cannot_make_is_refused_before_anything_is_written(
        tmp_path: Path, nats_url: str, levels: dict[str, Any], said: str) -> None:
    target = "coevolve" if "co" in levels else "evolve"
    data = {**SPEC, "falsified_if": f'mean(passed, "{list(levels)[1]}") < 0',
            "factors": [{"name": "p", "levels": list(levels),
                         "scope": {"kind": "procedure", "target": target, "levels": levels}}]}
    assert said in error_line(run(nats_url, tmp_path, str(write(tmp_path, data)), "--run-id", "exp-proc"))
    assert records(nats_url, "exp-proc") == []


def test_a_killed_run_resumes_to_the_uninterrupted_conclusion(tmp_path: Path, nats_url: str) -> None:
    path = write(tmp_path, SPEC)
    env = {**os.environ, "HX_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "hx", "--nats-url", nats_url, "experiment", "run", str(path),
                             "--run-id", "exp-killed"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # each finished unit prints a line: kill the process after the third
            if line.strip().startswith("3/12 "):
                break
        else:
            raise AssertionError(f"the run ended before its third unit (exit {proc.wait()})")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not [r for r in records(nats_url, "exp-killed") if isinstance(r.event, ExperimentConcluded)]
    ok(run(nats_url, tmp_path, str(path), "--resume", "exp-killed"))
    # every unit finished exactly once: the units done before the kill were not played again
    assert len([r for r in records(nats_url, "exp-killed") if isinstance(r.event, AttemptFinished)]) == 12
    ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-unbroken"))
    assert same_result(conclusion(nats_url, "exp-killed"), conclusion(nats_url, "exp-unbroken"))


def test_model_replaces_the_controlled_model_and_is_part_of_the_spec(tmp_path: Path, nats_url: str) -> None:
    path = write(tmp_path, SPEC)
    ok(run(nats_url, tmp_path, str(path), "--run-id", "exp-model", "--units", "1", "--model", "random:other"))
    [exp] = [r.event for r in records(nats_url, "exp-model") if isinstance(r.event, ExperimentStarted)]
    assert exp.spec["controlled_variables"]["model"] == "random:other"
    [started] = [r.event for r in records(nats_url, "exp-model") if isinstance(r.event, AttemptStarted)]
    assert started.model == "random:other"
    assert "the spec differs" in error_line(run(nats_url, tmp_path, str(path), "--resume", "exp-model"))
    ok(run(nats_url, tmp_path, str(path), "--resume", "exp-model", "--units", "1", "--model", "random:other"))
