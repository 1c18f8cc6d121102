"""``hx.experiment.analysis.conclude`` on hand-built units: a factorial's marginal pass@k, and intervals it cannot have.

Pure: the attempts' outputs are built here (as the ``attempt_outputs`` projection would fold them),
so each figure is known by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hx.experiment.analysis import conclude
from hx.experiment.design import Unit, design_cells, units
from hx.experiment.spec import parse_spec, spec_digest
from projections.attempt_outputs import AttemptOutput
from schemas.experiment import ExperimentConcluded, ExperimentSpec

RUN = "exp-analysis"
NOTES = {"name": "notes", "levels": ["off", "on"],
         "scope": {"kind": "env", "target": "HX_NOTES", "levels": {"off": "", "on": "1"}}}
TRIM = {"name": "trim", "levels": ["wide", "narrow"],
        "scope": {"kind": "env", "target": "HX_TRIM", "levels": {"wide": "", "narrow": "1"}}}
HARNESS = {"name": "harness", "levels": ["base", "evolved"],
           "scope": {"kind": "procedure", "target": "evolve", "levels": {"base": None, "evolved": {"rounds": 1}}}}
TASKS = ["twx:coin:dev:0", "twx:coin:dev:1", "twx:coin:dev:2"]


def factorial(second: dict[str, Any], **more: Any) -> ExperimentSpec:
    """A 2 x 2 factorial of ``notes`` and ``second`` over three coin tasks, pass@k its response."""
    return parse_spec({"title": "t", "hypothesis": "notes raise pass@k", "design": "factorial",
                       "falsified_if": 'diff_high(pass_at_k, "notes=on", "notes=off") <= 0',
                       "factors": [NOTES, second], "tasks": TASKS, "replications": 2,
                       "response_variables": ["pass_at_k"], "controlled_variables": {"max_steps": 20}, **more},
                      where="test")


def concluded(spec: ExperimentSpec, passed: Callable[[Unit], bool],
              keep: Callable[[Unit], bool] = lambda u: True) -> ExperimentConcluded:
    """``conclude`` over one finished attempt per kept unit, passed as ``passed`` says."""
    outputs = {u: AttemptOutput(RUN, u.cell.index, u.task, u.replication, finished=True, status="completed",
                                passed=passed(u)) for u in units(spec) if keep(u)}
    return conclude(spec, design_cells(spec), outputs, run_id=RUN, spec_digest=spec_digest(spec))


def pass_at_k(done: ExperimentConcluded, level: str) -> float:
    """The concluded pass@k mean at a level (a cell or a factorial's ``factor=level``)."""
    return next(s.mean.estimate for s in done.levels if s.variable == "pass_at_k" and s.level == level)


def test_a_marginal_arms_pass_at_k_is_each_cells_pass_at_k_averaged() -> None:
    """notes=off solves every task in one trim cell (one attempt of two) and none in the other: its pass@2 is 0.5,
    not the best of four attempts across both cells (pass@4: 1.0)."""
    spec = factorial(TRIM)

    def passed(u: Unit) -> bool:
        notes, trim = u.cell.level("notes"), u.cell.level("trim")
        return (trim == "wide" and u.replication == 0) if notes == "off" else u.replication == 1

    done = concluded(spec, passed)
    assert pass_at_k(done, "notes=off,trim=wide") == 1.0 and pass_at_k(done, "notes=off,trim=narrow") == 0.0
    assert pass_at_k(done, "notes=off") == pytest.approx(0.5)
    assert pass_at_k(done, "notes=on") == 1.0 and pass_at_k(done, "trim=wide") == 1.0
    assert pass_at_k(done, "trim=narrow") == pytest.approx(0.5)
    effect = next(e for e in done.effects if e.factor == "notes")
    assert effect.difference.estimate == pytest.approx(0.5)


def test_with_procedure_seeds_a_marginal_arms_pass_at_k_is_per_seed_the_mean_over_its_cells() -> None:
    """Seeds 3, 4 (replication r plays seed r % 2, k = 2): notes=off passes under seed 3 in the base cell only and
    under seed 4 in the evolved cell only: each cell 0.5 (one seed of two), the marginal arm 0.5 each seed, not 1."""
    spec = factorial(HARNESS, replications=4, procedure_seeds=[3, 4])

    def passed(u: Unit) -> bool:
        if u.cell.level("notes") == "on":
            return True
        return u.replication == (0 if u.cell.level("harness") == "base" else 1)

    done = concluded(spec, passed)
    assert pass_at_k(done, "notes=off,harness=base") == pytest.approx(0.5)
    assert pass_at_k(done, "notes=off") == pytest.approx(0.5)
    assert pass_at_k(done, "notes=on") == 1.0 and pass_at_k(done, "harness=base") == pytest.approx(0.75)


def test_a_seeded_mean_or_interaction_without_its_interval_is_a_note_not_a_crash() -> None:
    """A task short of one seed's units in one cell: that cell's mean, its marginal arms' means and the interaction
    have no crossed interval; they are named in the detail, and every other figure is concluded."""
    spec = factorial(HARNESS, replications=4, procedure_seeds=[3, 4])
    short = "notes=on,harness=evolved"
    done = concluded(spec, lambda u: u.replication % 2 == 0,
                     keep=lambda u: not (u.cell.name == short and u.task == TASKS[0] and u.replication % 2 == 1))
    levels = {s.level for s in done.levels}
    assert short not in levels and "notes=off,harness=base" in levels and "notes=off" in levels
    assert f"pass_at_k mean at {short}: every arm needs one value per task and seed" in done.detail
    assert "pass_at_k interaction notes x harness: every arm needs one value per task and seed" in done.detail
    assert done.interactions == ()
