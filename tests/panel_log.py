"""A concluded experiment written onto a real log by hand: what the panel reads, without playing the arms."""

from __future__ import annotations

from typing import Any

from hx.experiment.design import units
from hx.experiment.spec import parse_spec, spec_digest, spec_to_dict
from schemas.evaluation import Bounds
from schemas.experiment import EffectSummary, ExperimentConcluded, ExperimentSpec, ExperimentStarted
from schemas.lifecycle import AttemptFinished, AttemptStarted, RunStarted
from streams.log import EventLog
from streams.topology import trace_subject

HARNESS = "sha256:" + "c" * 64
SPEC: dict[str, Any] = {
    "title": "task notes on coin", "hypothesis": "task notes raise coin pass rate",
    "falsified_if": 'diff_high(passed, "on", "off") <= 0',
    "factors": [{"name": "notes", "levels": ["off", "on"],
                 "scope": {"kind": "env", "target": "HX_NOTES", "levels": {"off": "", "on": "1"}}}],
    "tasks": ["twx:coin:dev:0", "twx:coin:dev:1"], "replications": 3, "response_variables": ["passed"],
    "controlled_variables": {"model": "random:", "max_steps": 8},
}


async def write_experiment(log: EventLog, run_id: str, *, difference: Bounds | None = None,
                           spec_data: dict[str, Any] | None = None) -> ExperimentSpec:
    """RunStarted, ExperimentStarted, one finished attempt per unit (the ``on`` arm passing), the conclusion."""
    spec = parse_spec(spec_data or SPEC, where="test")
    digest = spec_digest(spec)
    order = units(spec)
    run_subject = trace_subject(run_id)
    await log.append(run_subject, RunStarted(run_id=run_id, kind="experiment", config={"spec_digest": digest}))
    await log.append(run_subject, ExperimentStarted(run_id=run_id, spec=spec_to_dict(spec), spec_digest=digest,
                                                    order=tuple(u.key for u in order)))
    for unit in order:
        at = trace_subject(run_id, unit.cell.index, unit.task, unit.replication)
        await log.append(at, AttemptStarted(run_id=run_id, round=unit.cell.index, task_id=unit.task,
                                            attempt=unit.replication, harness_digest=HARNESS, model="random:"))
        await log.append(at, AttemptFinished(run_id=run_id, round=unit.cell.index, task_id=unit.task,
                                             attempt=unit.replication, passed=unit.cell.index == 1, steps=5))
    difference = difference or Bounds(estimate=1.0, low=0.6, high=1.0, confidence=0.95, method="bootstrap")
    effect = EffectSummary(variable="passed", factor="notes", level="on", reference="off", difference=difference,
                           effect_size=difference, verdict="keep" if difference.low > 0 else "inconclusive")
    await log.append(run_subject, ExperimentConcluded(
        run_id=run_id, spec_digest=digest, units=len(order), effects=(effect,),
        falsified="not_falsified" if difference.high > 0 else "falsified",
        detail=f'diff_high(passed, "on", "off") <= 0: {difference.high} <= 0 is {difference.high <= 0}'))
    return spec
