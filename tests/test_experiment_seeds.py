"""Claims as experiments: procedure seeds, mixed products, named comparisons, pass@k per game, claimed test tasks.

End to end on a real nats-server with TextWorldExpress and the random agent (tiny evolutions);
the crossed bootstrap and the claim registry are checked on their own too.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hx_cli import error_line, ok
from test_experiment_run import SPEC, conclusion, records, run, write

from hx.experiment.claims import check_claim
from hx.experiment.errors import SpecRejected
from hx.experiment.spec import parse_spec, spec_digest
from hx.harnesses import starter_harness_text
from hx.intervals import crossed_contrast, task_mean
from projections.ledger_reader import read_run_ledger
from schemas.lifecycle import RoundStarted
from streams.config import NatsSettings
from streams.connection import connect

EVOLVE = {"rounds": 1, "tasks": 2, "heldout_tasks": 1, "candidates": 1}


def seeded(**more: Any) -> dict[str, Any]:
    """A procedure spec over coin and mapreader, made once per procedure seed."""
    return {**SPEC, "tasks": ["twx:coin:dev:40", "twx:mapreader:dev:40"], "replications": 2,
            "response_variables": ["pass_at_k", "steps"], "per_game": True,
            "falsified_if": 'diff_low(pass_at_k, "evolved", "base") <= 0',
            "factors": [{"name": "harness", "levels": ["base", "evolved", "mixed"],
                         "scope": {"kind": "procedure", "target": "evolve",
                                   "levels": {"base": None, "evolved": EVOLVE,
                                              "mixed": {"harness_of": "evolved", "policy_of": None}}}}],
            "comparisons": [["mixed", "evolved"]], "procedure_seeds": [3, 4], **more}


def test_each_procedure_seed_makes_its_own_product_and_the_figures_resample_seeds(tmp_path: Path,
                                                                                   nats_url: str) -> None:
    """Two seeds, two evolutions; each seed's units play that seed's product in rounds of their own; the mixed
    level plays the evolved harness; pass@k per game and the named comparison are concluded over tasks x seeds."""
    ok(run(nats_url, tmp_path, str(write(tmp_path, seeded())), "--run-id", "exp-seeds"))
    started = {e.variant: e for e in (r.event for r in records(nats_url, "exp-seeds")) if isinstance(e, RoundStarted)}
    assert sorted(started) == sorted(f"{c}@seed{s}" for c in ("base", "evolved", "mixed") for s in (3, 4))
    for s in (3, 4):
        assert started[f"mixed@seed{s}"].harness_digest == started[f"evolved@seed{s}"].harness_digest
        assert started[f"base@seed{s}"].attempts_per_task == 1  # k = replications / seeds
    assert {e.round for e in started.values()} == set(range(6))
    done = conclusion(nats_url, "exp-seeds")
    assert done.units == 2 * 3 * 2
    variables = {e.variable for e in done.effects}
    assert variables == {"pass_at_k", "steps", "pass_at_k twx:coin", "pass_at_k twx:mapreader", "steps twx:coin",
                         "steps twx:mapreader"}
    assert ("mixed", "evolved") in {(e.level, e.reference) for e in done.effects}
    assert all(e.difference.method == "crossed bootstrap tasks x 2 seeds" for e in done.effects)

    async def ledgers() -> list[Any]:
        async with connect(NatsSettings(url=nats_url)) as conn:
            return [await read_run_ledger(conn.log, f"exp-seeds-harness-evolved-s{s}") for s in (3, 4)]
    for seed, ledger in zip((3, 4), asyncio.run(ledgers()), strict=True):
        assert ledger is not None and ledger.finished is not None
        assert ledger.opened.settings["rollout"]["seed"] == seed


def test_the_crossed_interval_counts_the_seeds_luck() -> None:
    """When a seed's luck is shared by all its tasks, resampling tasks alone is too sure; the crossed one is not."""
    rng = np.random.default_rng(0)
    table = {f"t{i}": [float(rng.random() < p) for p in (0.1, 0.9, 0.5)] for i in range(60)}
    crossed = crossed_contrast([table], [1.0])
    tasks_only = task_mean(table)
    assert crossed.estimate == pytest.approx(tasks_only.estimate)
    assert crossed.high - crossed.low > 2 * (tasks_only.high - tasks_only.low)


@pytest.mark.parametrize(("change", "said"), [
    ({"replications": 3}, "replications: 3 is not a multiple of the 2 procedure seeds"),
    ({"procedure_seeds": [1, 1]}, "procedure_seeds: a seed is listed twice"),
    ({"comparisons": [["mixed", "gone"]]}, "comparisons[0]: 'mixed', 'gone' are not levels of one factor"),
])
def test_a_seeded_spec_that_does_not_fit_is_one_line(change: dict[str, Any], said: str) -> None:
    """Seeds that do not divide the replications, twice-listed seeds, unknown compared levels: rejected."""
    with pytest.raises(SpecRejected, match="^spec: " + said.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(seeded(**change))


def test_a_mixed_level_names_levels_that_run_a_procedure() -> None:
    """harness_of must name another procedure level; policy_of needs a coevolve procedure."""
    spec = seeded()
    spec["factors"][0]["scope"]["levels"]["mixed"] = {"harness_of": "base"}
    with pytest.raises(SpecRejected, match=r"mixed\.harness_of: names 'base', not another level that runs"):
        parse_spec(spec)
    spec["factors"][0]["scope"]["levels"]["mixed"] = {"policy_of": "evolved"}
    with pytest.raises(SpecRejected, match="only a coevolve procedure makes a policy"):
        parse_spec(spec)


def test_an_older_spec_digests_as_it_did() -> None:
    """The fields added for claims are left out of the digest at their defaults (a resumed older run still fits)."""
    plain = parse_spec(SPEC)
    assert spec_digest(plain) == spec_digest(parse_spec({**SPEC, "claim": "", "procedure_seeds": []}))
    assert spec_digest(plain) != spec_digest(parse_spec({**SPEC, "claim": "x"}))


def claim(tasks: list[str], name: str) -> dict[str, Any]:
    """A claim spec over ``tasks``."""
    return {**SPEC, "claim": name, "tasks": tasks}


def test_a_claim_may_not_reuse_another_claims_test_tasks(tmp_path: Path, nats_url: str) -> None:
    """Test tasks judge one claim once: another claim's, or a spent range, is one line; a copy of itself is fine."""
    registry = tmp_path / "specs"
    registry.mkdir()
    write(registry, claim(["twx:coin:test:200", "twx:coin:test:201"], "first"), "first.yaml")
    (registry / "spent-test-ranges.yaml").write_text(yaml.safe_dump(
        [{"tasks": "twx:coin:test:0-199", "by": "figures before pre-registration"}]))
    second = write(registry, claim(["twx:coin:test:201", "twx:coin:test:202"], "second"), "second.yaml")
    line = error_line(run(nats_url, tmp_path, str(second), "--run-id", "exp-claim"))
    assert line == (f"error: {second}: tasks: twx:coin:test:201 already used by claim 'first' (first.yaml); a test "
                    "task judges one claim once")
    assert records(nats_url, "exp-claim") == []
    spent = parse_spec(claim(["twx:coin:test:150", "twx:coin:test:300"], "third"))
    with pytest.raises(SpecRejected, match=r"twx:coin:test:150 already used by figures before pre-registration"):
        check_claim(spent, None, registry)
    # the first claim's own file, and a copy of it elsewhere (a bench's data directory), are no conflict
    second.unlink()  # (the rejected second claim is no committed spec)
    first = claim(["twx:coin:test:200", "twx:coin:test:201"], "first")
    check_claim(parse_spec(first), registry / "first.yaml", registry)
    copy = write(tmp_path, first, "copy.yaml")
    check_claim(parse_spec(first), copy, registry)
    # a spec that claims nothing, or plays no test task, is not checked
    check_claim(parse_spec({**SPEC, "tasks": ["twx:coin:test:201"]}), None, registry)


def test_only_the_same_spec_shares_a_claims_test_tasks(tmp_path: Path) -> None:
    """A registry spec is exempt from the check only when its spec digest is this spec's: another spec under the
    same claim name is another claim; two different registry specs under one claim name are an error naming both."""
    registry = tmp_path / "specs"
    registry.mkdir()
    first = claim(["twx:coin:test:200", "twx:coin:test:201"], "first")
    write(registry, first, "first.yaml")
    edited = write(tmp_path, {**first, "seed": 6, "tasks": ["twx:coin:test:201", "twx:coin:test:202"]}, "edited.yaml")
    with pytest.raises(SpecRejected, match=r"^" + re.escape(
            f"{edited}: tasks: twx:coin:test:201 already used by claim 'first' (first.yaml under this claim's name, "
            "a different spec); a test task judges one claim once") + "$"):
        check_claim(parse_spec({**first, "seed": 6, "tasks": ["twx:coin:test:201", "twx:coin:test:202"]}), edited,
                    registry)
    write(registry, {**first, "seed": 6}, "second.yaml")
    with pytest.raises(SpecRejected, match=r"^" + re.escape(
            f"{registry}: claim 'first' is registered by two different specs, first.yaml and second.yaml; a claim "
            "is one spec") + "$"):
        check_claim(parse_spec(first), registry / "first.yaml", registry)


def test_a_copy_naming_the_controlled_harness_by_its_absolute_path_is_the_same_claim(tmp_path: Path) -> None:
    """A bench's copy of a claim names the harness file by its absolute path: the same file, the same claim; a
    copy naming another harness file is another spec."""
    registry = tmp_path / "specs"
    (tmp_path / "harnesses").mkdir()
    registry.mkdir()
    for name in ("textworld.yaml", "other.yaml"):
        (tmp_path / "harnesses" / name).write_text(starter_harness_text("textworld"))
    first = {**claim(["twx:coin:test:200"], "first"),
             "controlled_variables": {"model": "random:", "harness": "../harnesses/textworld.yaml"}}
    write(registry, first, "first.yaml")
    data = tmp_path / "data"
    data.mkdir()
    same = {**first, "controlled_variables": {"model": "random:",
                                              "harness": str(tmp_path / "harnesses" / "textworld.yaml")}}
    check_claim(parse_spec(same), write(data, same, "spec.yaml"), registry)
    elsewhere = str(tmp_path / "harnesses" / "other.yaml")
    other = {**first, "controlled_variables": {"model": "random:", "harness": elsewhere}}
    with pytest.raises(SpecRejected, match="under this claim's name, a different spec"):
        check_claim(parse_spec(other), write(data, other, "other.yaml"), registry)
