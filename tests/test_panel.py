"""The experiment panel: the precedence cascade, and the offline panel's verdicts on hand-built experiments."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hx_cli import error_line, hx, ok
from panel_log import SPEC, write_experiment

from hx.experiment.design import design_cells, units
from hx.experiment.offline_panel import (
    MAX_REPLICATIONS,
    auditor,
    methodologist,
    offline_review,
    optimizer,
)
from hx.experiment.panel import ExperimentRecord, claimed_direction, decide
from hx.experiment.spec import check_spec, load_spec, parse_spec, spec_digest, spec_to_dict
from projections.attempt_outputs import AttemptOutput
from schemas.evaluation import Bounds
from schemas.experiment import EffectSummary, ExperimentConcluded, ExperimentSpec, ExperimentStarted, Falsification
from schemas.lifecycle import AttemptStarted, RunStarted
from schemas.panel import PanelReviewed
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

RUN = "exp-panel"
HARNESS = "sha256:" + "a" * 64


def spec(**changes: Any) -> ExperimentSpec:
    data: dict[str, Any] = {
        "title": "notes raise coin", "hypothesis": "task notes raise coin pass rate",
        "falsified_if": 'diff_high(passed, "on", "off") <= 0',
        "factors": [{"name": "notes", "levels": ["off", "on"],
                     "scope": {"kind": "env", "target": "HX_NOTES", "levels": {"off": "", "on": "1"}}}],
        "tasks": ["twx:coin:dev:0", "twx:coin:dev:1"], "replications": 3, "response_variables": ["passed"],
        "controlled_variables": {"max_steps": 20},
    }
    data.update(changes)
    return parse_spec(data, where="test")


def bounds(estimate: float, low: float, high: float) -> Bounds:
    return Bounds(estimate=estimate, low=low, high=high, confidence=0.95, method="bootstrap")


def attempts(s: ExperimentSpec, **per_cell: dict[str, Any]) -> list[AttemptOutput]:
    """One finished attempt per unit; ``per_cell[cell name]`` overrides fields of that cell's attempts."""
    out = []
    for unit in units(s):
        fields: dict[str, Any] = {"model": "random:", "harness_digest": HARNESS, "finished": True,
                                  "status": "completed"}
        fields.update(per_cell.get(unit.cell.name, {}))
        out.append(AttemptOutput(RUN, unit.cell.index, unit.task, unit.replication, **fields))
    return out


def record(s: ExperimentSpec, difference: Bounds, falsified: Falsification = "not_falsified", *,
           order: tuple[str, ...] | None = None, outputs: list[AttemptOutput] | None = None,
           reused: tuple[str, ...] = ()) -> ExperimentRecord:
    digest = spec_digest(s)
    started = ExperimentStarted(run_id=RUN, spec=spec_to_dict(s), spec_digest=digest,
                                order=order if order is not None else tuple(u.key for u in units(s)))
    effect = EffectSummary(variable="passed", factor=s.factors[0].name, level=s.factors[0].levels[1],
                           reference=s.factors[0].levels[0], difference=difference, effect_size=difference,
                           verdict="keep" if difference.low > 0 else "discard" if difference.high < 0 else
                           "inconclusive")
    concluded = ExperimentConcluded(run_id=RUN, spec_digest=digest, units=len(started.order), effects=(effect,),
                                    falsified=falsified, detail="diff_high(...) is " + falsified)
    return ExperimentRecord.of(RUN, s, started, concluded, outputs if outputs is not None else attempts(s), reused)


CLEAR = bounds(0.5, 0.2, 0.8)
NULL = bounds(0.05, -0.25, 0.35)


# --- the cascade ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("m", "a", "o", "decision"), [
    ("UNSOUND", "VALID", "ADVANCE", "REDESIGN"),  # the methodologist's veto beats agreement
    ("UNSOUND", "INVALID", "REVISE", "REDESIGN"),
    ("SOUND", "VALID", "ADVANCE", "KEEP"),
    ("MARGINAL", "VALID", "ADVANCE", "KEEP"),
    ("SOUND", "INCONCLUSIVE", "ADVANCE", "REVISE"),
    ("SOUND", "VALID", "REVISE", "REVISE"),
    ("SOUND", "VALID", "REDESIGN", "REDESIGN"),
    ("MARGINAL", "INVALID", "REDESIGN", "REDESIGN"),
    ("MARGINAL", "INCONCLUSIVE", "REVISE", "REVISE"),
])
def test_the_cascade(m: str, a: str, o: str, decision: str) -> None:
    assert decide(m, a, o) == decision


def test_the_claimed_direction_is_read_off_falsified_if() -> None:
    assert claimed_direction(spec()) == 1
    assert claimed_direction(spec(falsified_if='diff_low(passed, "on", "off") >= 0')) == -1
    assert claimed_direction(spec(falsified_if='mean(passed, "on") < 0.5')) == 1
    assert claimed_direction(spec(falsified_if='diff(passed, "on", "off") != 0')) == 0


# --- the offline panel --------------------------------------------------------------------------------

def test_a_sound_clear_experiment_is_kept_and_advances_to_fresh_tasks() -> None:
    s = spec()
    review = offline_review(record(s, CLEAR))
    assert [v.verdict for v in review.verdicts] == ["SOUND", "VALID", "ADVANCE"]
    assert review.decision == "KEEP" and review.reviewer == "offline"
    proposal = check_spec(msgspec.convert(review.proposal, ExperimentSpec), where="proposal")
    assert proposal.tasks == ("twx:coin:dev:2", "twx:coin:dev:3")  # the same contrast, tasks not yet played
    assert proposal.seed == s.seed + 1


def test_a_numeric_factor_advances_to_its_next_level() -> None:
    s = spec(factors=[{"name": "notes", "levels": ["4", "8"], "scope": {
        "kind": "processor_param", "target": "task_notes.max_notes", "levels": {"4": 4, "8": 8}}}],
        falsified_if='diff_high(passed, "8", "4") <= 0')
    review = offline_review(record(s, CLEAR))
    assert review.decision == "KEEP"
    proposal = check_spec(msgspec.convert(review.proposal, ExperimentSpec), where="proposal")
    (factor,) = proposal.factors
    assert factor.levels == ("8", "12") and factor.scope.levels == {"8": 8, "12": 12}
    assert proposal.falsified_if == 'diff_high(passed, "12", "8") <= 0'


def window_spec() -> ExperimentSpec:
    return spec(factors=[{"name": "window", "levels": ["24", "4"], "scope": {
        "kind": "processor_param", "target": "history_window.keep_last", "levels": {"24": 24, "4": 4}}}],
        falsified_if='diff_low(steps, "4", "24") >= 0', response_variables=["steps"])


def test_a_factor_that_lowers_its_variable_steps_on_without_going_below_zero() -> None:
    r = record(window_spec(), bounds(-3.0, -5.0, -1.0))
    r = ExperimentRecord.of(RUN, r.spec, r.started, msgspec.structs.replace(r.concluded, effects=(
        msgspec.structs.replace(r.concluded.effects[0], variable="steps"),)), r.attempts)
    review = offline_review(r)
    assert review.decision == "KEEP"
    proposal = check_spec(msgspec.convert(review.proposal, ExperimentSpec), where="proposal")
    # 4 - (24 - 4) would be negative: the window is halved instead, and steps are expected to fall further
    assert proposal.factors[0].levels == ("4", "2") and proposal.factors[0].scope.levels == {"4": 4, "2": 2}
    assert proposal.falsified_if == 'diff_low(steps, "2", "4") >= 0'


def test_an_effect_against_the_claim_steps_the_other_way_from_the_reference() -> None:
    r = record(window_spec(), bounds(3.0, 1.0, 5.0), "falsified")
    r = ExperimentRecord.of(RUN, r.spec, r.started, msgspec.structs.replace(r.concluded, effects=(
        msgspec.structs.replace(r.concluded.effects[0], variable="steps"),)), r.attempts)
    review = offline_review(r)
    assert [v.verdict for v in review.verdicts] == ["SOUND", "VALID", "REDESIGN"]
    proposal = check_spec(msgspec.convert(review.proposal, ExperimentSpec), where="proposal")
    assert proposal.factors[0].levels == ("24", "44")  # the reference won: one step beyond it, steps down claimed
    assert proposal.falsified_if == 'diff_low(steps, "44", "24") >= 0'


@pytest.mark.parametrize(("reps", "verdict"), [(3, "SOUND"), (2, "MARGINAL"), (1, "UNSOUND")])
def test_replications_per_cell(reps: int, verdict: str) -> None:
    assert methodologist(record(spec(replications=reps), CLEAR)).verdict == verdict


def test_an_order_that_is_not_the_seeded_shuffle_is_unsound() -> None:
    s = spec()
    sorted_order = tuple(sorted(u.key for u in units(s)))
    m = methodologist(record(s, CLEAR, order=sorted_order))
    assert m.verdict == "UNSOUND"
    assert "the logged run order is not the spec's seeded shuffle (it is sorted)" in m.reasons


def test_an_undecided_falsification_is_marginal_and_inconclusive() -> None:
    r = record(spec(), CLEAR, "undecided")
    assert methodologist(r).verdict == "MARGINAL"
    assert auditor(r).verdict == "INCONCLUSIVE"


@pytest.mark.parametrize(("field", "value", "what"), [
    ("model", "openai:other", "model"), ("harness_digest", "sha256:" + "b" * 64, "harness digest")])
def test_arms_that_differ_beyond_the_factor_are_unsound(field: str, value: str, what: str) -> None:
    s = spec()
    r = record(s, CLEAR, outputs=attempts(s, on={field: value}))
    m = methodologist(r)
    assert m.verdict == "UNSOUND"
    assert any(reason.startswith(f"arms differ in {what} beyond the factor") for reason in m.reasons)
    review = offline_review(r)
    assert review.decision == "REDESIGN"
    if field == "model":  # the fixed design pins the reference arm's model
        assert review.proposal["controlled_variables"]["model"] == "random:"


def test_arms_with_different_step_caps_are_unsound_and_the_fix_pins_the_cap() -> None:
    s = spec()
    r = record(s, CLEAR, outputs=attempts(s, off={"status": "budget_exhausted", "steps": 20},
                                          on={"status": "budget_exhausted", "steps": 30}))
    assert methodologist(r).verdict == "UNSOUND"
    assert offline_review(r).proposal["controlled_variables"]["max_steps"] == 20


def test_a_harness_scope_may_change_the_digest_between_arms() -> None:
    s = spec(factors=[{"name": "notes", "levels": ["off", "on"], "scope": {
        "kind": "processor", "target": "task_notes", "levels": {"off": None, "on": {}}}}])
    r = record(s, CLEAR, outputs=attempts(s, on={"harness_digest": "sha256:" + "b" * 64}))
    assert methodologist(r).verdict == "SOUND"


def test_a_test_range_used_before_is_unsound_and_the_fix_moves_to_dev() -> None:
    s = spec(tasks=["twx:coin:test:0", "twx:coin:dev:1"])
    r = record(s, CLEAR, reused=("twx:coin:test:0",))
    m = methodologist(r)
    assert m.verdict == "UNSOUND" and any("test range is spent" in reason for reason in m.reasons)
    assert list(offline_review(r).proposal["tasks"]) == ["twx:coin:dev:0", "twx:coin:dev:1"]
    assert methodologist(record(s, CLEAR)).verdict == "SOUND"  # a test task played for the first time


def test_the_auditor_finds_a_kept_hypothesis_without_evidence_invalid() -> None:
    r = record(spec(falsified_if='diff_high(passed, "on", "off") <= -1'), NULL)
    a = auditor(r)
    assert a.verdict == "INVALID" and "falsified_if lets a null result through" in a.reasons[0]


def test_a_null_let_through_is_revised_with_a_falsified_if_that_needs_the_interval_to_clear_0() -> None:
    r = record(spec(), NULL)  # diff_high(...) <= 0 is False at 0.35: "not falsified" on no evidence
    review = offline_review(r)
    assert [v.verdict for v in review.verdicts] == ["SOUND", "INVALID", "REDESIGN"]
    assert review.proposal["falsified_if"] == 'diff_low(passed, "on", "off") <= 0'
    assert review.verdicts[2].reasons[0].endswith("falsified_if tightened: the hypothesis stands only if the "
                                                  "interval clears 0")
    noisy = offline_review(record(spec(), bounds(0.2, -0.05, 0.45)))
    assert noisy.verdicts[2].verdict == "REVISE" and noisy.proposal["replications"] == 7
    assert noisy.proposal["falsified_if"] == 'diff_low(passed, "on", "off") <= 0'
    down = spec(falsified_if='diff_low(passed, "on", "off") >= 0')
    assert offline_review(record(down, NULL)).proposal["falsified_if"] == 'diff_high(passed, "on", "off") >= 0'


def test_the_auditor_finds_a_refutation_against_the_intervals_invalid() -> None:
    assert auditor(record(spec(), CLEAR, "falsified")).verdict == "INVALID"
    assert auditor(record(spec(), NULL, "falsified")).verdict == "VALID"


def test_unequal_lost_attempts_leave_an_alternative_open() -> None:
    s = spec()
    outs = attempts(s) + [AttemptOutput(RUN, 1, "twx:coin:dev:0", 3 + k, finished=True, status="infra_failure",
                                        model="random:", harness_digest=HARNESS) for k in range(3)]
    a = auditor(record(s, CLEAR, outputs=outs))
    assert a.verdict == "INCONCLUSIVE" and any("lost attempts" in reason and "cell 1: 3 of 9" in reason
                                               for reason in a.reasons)
    review = offline_review(record(s, CLEAR, outputs=outs))
    assert [v.verdict for v in review.verdicts] == ["SOUND", "INCONCLUSIVE", "REVISE"]
    assert review.decision == "REVISE"


def test_a_noisy_effect_revises_with_replications_sized_from_the_spread() -> None:
    s = spec()
    r = record(s, bounds(0.2, -0.05, 0.45), "falsified")
    m, a = methodologist(r), auditor(r)
    o, proposal = optimizer(r, m, a)
    # half-width 0.25 against an effect of 0.2: 3 * (1.2 * 0.25 / 0.2) ** 2 = 6.75 -> 7
    assert (o.verdict, proposal.replications) == ("REVISE", 7)
    assert offline_review(r).decision == "REVISE"


def test_a_proposal_keeps_replications_a_multiple_of_the_procedure_seeds() -> None:
    evolve = [{"name": "notes", "levels": ["off", "on"],
               "scope": {"kind": "procedure", "target": "evolve", "levels": {"off": None, "on": {"rounds": 1}}}}]
    s = spec(replications=4, procedure_seeds=[1, 2], factors=evolve)
    r = record(s, bounds(0.2, -0.05, 0.45), "falsified")
    o, proposal = optimizer(r, methodologist(r), auditor(r))
    # 4 * (1.2 * 0.25 / 0.2) ** 2 = 9, up to the next multiple of the 2 seeds
    assert (o.verdict, proposal.replications, proposal.procedure_seeds) == ("REVISE", 10, (1, 2))


def test_an_effect_lost_in_noise_redesigns() -> None:
    r = record(spec(), NULL, "falsified")
    o, proposal = optimizer(r, methodologist(r), auditor(r))
    assert o.verdict == "REDESIGN" and proposal.replications == MAX_REPLICATIONS
    assert offline_review(r).decision == "REDESIGN"


def test_at_the_replication_cap_the_proposal_adds_fresh_tasks_instead_of_repeating_the_experiment() -> None:
    s = spec(replications=MAX_REPLICATIONS)
    o, proposal = optimizer(r := record(s, bounds(0.135, 0.0, 0.275), "falsified"), methodologist(r), auditor(r))
    assert o.verdict == "REDESIGN" and "twice the tasks" in o.reasons[0]
    assert proposal.replications == MAX_REPLICATIONS and proposal.seed == s.seed + 1
    assert proposal.tasks[:len(s.tasks)] == s.tasks and len(set(proposal.tasks)) == 2 * len(s.tasks)
    assert proposal != s


def test_an_effect_against_the_claim_redesigns() -> None:
    r = record(spec(), bounds(-0.5, -0.8, -0.2), "falsified")
    assert [v.verdict for v in offline_review(r).verdicts] == ["SOUND", "VALID", "REDESIGN"]


def test_every_proposal_is_a_spec_the_runner_accepts() -> None:
    s = spec()
    cases = [record(s, CLEAR), record(s, NULL, "falsified"), record(spec(replications=1), CLEAR),
             record(s, CLEAR, "undecided"), record(s, bounds(0.2, -0.05, 0.45), "falsified")]
    for r in cases:
        proposal = offline_review(r).proposal
        parse_spec(proposal, where="proposal")  # the loader hx experiment run uses
        assert len(design_cells(msgspec.convert(proposal, ExperimentSpec))) == 2


# --- hx experiment review on a real log -----------------------------------------------------------------

def logged(nats_url: str, run_id: str, types: list[str]) -> list[Any]:
    async def read() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [r.event async for r in conn.log.read(subjects=[trace_subject(run_id)], types=types)]
    return asyncio.run(read())


def on_log(nats_url: str, run_id: str, **changes: Any) -> None:
    async def write() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            await write_experiment(conn.log, run_id, **changes)
    asyncio.run(write())


def test_a_real_experiment_reviewed_offline_and_its_proposal_run_as_is(tmp_path: Path, nats_url: str) -> None:
    data = {
        "title": "history window", "hypothesis": "a 4-step history window lowers the random agent's steps",
        "falsified_if": 'diff_low(steps, "short", "long") >= 0',
        "factors": [{"name": "window", "levels": ["long", "short"], "scope": {
            "kind": "processor_param", "target": "history_window.keep_last", "levels": {"long": 24, "short": 4}}}],
        "tasks": ["twx:coin:dev:0", "twx:coin:dev:1"], "replications": 3, "response_variables": ["steps"],
        "controlled_variables": {"model": "random:", "max_steps": 6}, "seed": 5}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    base = ("--nats-url", nats_url, "--data-dir", str(tmp_path / "data"), "experiment")
    ok(hx(*base, "run", str(tmp_path / "spec.yaml"), "--run-id", "exp-real", "--concurrency", "2"))
    result = ok(hx(*base, "review", "exp-real", "--out", str(tmp_path / "next.yaml")))
    lines = result.stdout.splitlines()
    assert lines[0] == "panel review 0 of exp-real (offline)"
    assert "  Methodologist: SOUND" in lines and lines[-1] == f"proposal written to {tmp_path / 'next.yaml'}: " \
        f"hx experiment run {tmp_path / 'next.yaml'}"
    [reviewed] = logged(nats_url, "exp-real", [PanelReviewed.TYPE])
    assert f"decision: {reviewed.decision}" in lines
    # the random agent's steps do not depend on the window, so no effect clears 0 and the panel does not KEEP
    assert reviewed.decision in ("REVISE", "REDESIGN")
    written = yaml.safe_load((tmp_path / "next.yaml").read_text())
    assert written == reviewed.proposal
    ok(hx(*base, "run", str(tmp_path / "next.yaml"), "--run-id", "exp-next", "--units", "1"))
    # a second review is review 1, appended next to the first
    again = json.loads(ok(hx(*base, "review", "exp-real", "--json")).stdout)
    assert again["review"] == 1 and again["decision"] == reviewed.decision
    assert len(logged(nats_url, "exp-real", [PanelReviewed.TYPE])) == 2


def test_review_json_and_a_json_proposal_file(tmp_path: Path, nats_url: str) -> None:
    on_log(nats_url, "exp-hand")
    out = tmp_path / "next.json"
    result = ok(hx("--nats-url", nats_url, "experiment", "review", "exp-hand", "--json", "--out", str(out)))
    shown = json.loads(result.stdout)
    assert shown["decision"] == "KEEP" and [v["verdict"] for v in shown["verdicts"]] == ["SOUND", "VALID", "ADVANCE"]
    assert json.loads(out.read_text()) == shown["proposal"]
    load_spec(out)  # what hx experiment run loads


@pytest.mark.parametrize(("args", "message"), [
    (("exp-none",), "error: RUN exp-none: no such run on the log"),
    (("exp-rollout",), "error: RUN exp-rollout: a rollout run, not an experiment"),
    (("exp-open",), "error: RUN exp-open: not concluded yet; finish it with hx experiment run SPEC --resume exp-open"),
    (("exp-hand", "--out", "next.txt"), "error: --out next.txt: write .json, .yaml or .yml (a format hx "
                                        "experiment run reads)"),
    (("exp-hand", "--model", "nosuch:model"), "error: --model: "),
    (("exp-hand", "--out", "missing/next.yaml"), "error: --out missing/next.yaml: cannot write"),
])
def test_review_refuses_with_one_line_and_writes_nothing(tmp_path: Path, nats_url: str,
                                                         args: tuple[str, ...], message: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    on_log(nats_url, "exp-hand")

    async def write() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            await conn.log.append(trace_subject("exp-rollout"), RunStarted(run_id="exp-rollout", kind="rollout"))
            await conn.log.append(trace_subject("exp-open"), RunStarted(run_id="exp-open", kind="experiment"))
            await conn.log.append(trace_subject("exp-open"), ExperimentStarted(
                run_id="exp-open", spec=spec_to_dict(spec()), spec_digest=spec_digest(spec())))
    asyncio.run(write())
    line = error_line(hx("--nats-url", nats_url, "experiment", "review", *args))
    assert line.startswith(message)
    assert logged(nats_url, args[0], [PanelReviewed.TYPE]) == []
    assert [p.name for p in tmp_path.iterdir()] == ["nats"]  # the server's store, nothing of ours


def test_a_test_task_an_earlier_run_played_is_found_on_the_log(tmp_path: Path, nats_url: str) -> None:
    data: dict[str, Any] = {**SPEC, "tasks": ["twx:coin:test:7", "twx:coin:dev:1"]}

    async def write() -> None:
        async with connect(NatsSettings(url=nats_url)) as conn:
            for run_id in ("run-before", "run-other"):  # one played the test task, one a dev task
                task = "twx:coin:test:7" if run_id == "run-before" else "twx:coin:dev:1"
                await conn.log.append(trace_subject(run_id, 0, task, 0), AttemptStarted(
                    run_id=run_id, round=0, task_id=task, attempt=0))
            await write_experiment(conn.log, "exp-reuse", spec_data=data)
            await write_experiment(conn.log, "exp-fresh", spec_data={**data, "tasks": ["twx:coin:test:8"]})
    asyncio.run(write())
    reused = json.loads(ok(hx("--nats-url", nats_url, "experiment", "review", "exp-reuse", "--json")).stdout)
    methodologist_verdict = reused["verdicts"][0]
    assert methodologist_verdict["verdict"] == "UNSOUND" and reused["decision"] == "REDESIGN"
    assert ("test task(s) twx:coin:test:7 already played by an earlier run: the test range is spent"
            in methodologist_verdict["reasons"])
    assert reused["proposal"]["tasks"] == ["twx:coin:dev:7", "twx:coin:dev:1"]
    fresh = json.loads(ok(hx("--nats-url", nats_url, "experiment", "review", "exp-fresh", "--json")).stdout)
    assert fresh["verdicts"][0]["verdict"] == "SOUND"
