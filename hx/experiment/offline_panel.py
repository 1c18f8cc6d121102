"""The offline panel: the three personas as fixed rules over an experiment's design and data, no model needed.

It reads what the log holds (``panel.ExperimentRecord``): the spec and the seeded order of
``ExperimentStarted``, the intervals of ``ExperimentConcluded`` and the experiment's attempts.
Every threshold is a constant here and stated in docs/panel.md.

- Methodologist: falsifiable (a falsified_if, decided); replications per cell (>= 3 SOUND, 2
  MARGINAL, 1 UNSOUND); the logged order is the seeded shuffle; the arms ran the same model,
  harness and step cap beyond what the factor changes; no test-split task an earlier run played.
- Knowledge Auditor: the falsification verdict agrees with the intervals (an effect excluding 0
  in the claimed direction when the hypothesis stands, none when it is refuted); lost attempts
  (infra failures, interruptions) about equal between arms.
- Loop Optimizer: the main effect against its noise: ADVANCE when it clears 0 in the claimed
  direction and the auditor agrees (next: the next level, or the same contrast on fresh tasks);
  REVISE when more replications, sized from the observed spread, can resolve it; REDESIGN when
  they cannot, or the design is unsound (next: the design fixed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from hx.environments.errors import BenchmarkError
from hx.environments.registry import TaskId
from hx.experiment.design import units
from hx.experiment.errors import SpecRejected
from hx.experiment.falsify import parse
from hx.experiment.panel import (
    ExperimentRecord,
    claimed_direction,
    decide,
    excludes_zero,
    proposal_json,
    relevant_effects,
    tasks_on_test_split,
)
from hx.experiment.spec import check_spec
from schemas.experiment import EffectSummary, ExperimentSpec, Factor, MutableScope
from schemas.panel import PanelReviewed, PersonaVerdict

SOUND_REPLICATIONS = 3
MARGINAL_REPLICATIONS = 2
LOST_GAP = 0.10
"""Auditor: arms whose shares of lost attempts differ by more than this leave an alternative open."""
MAX_REPLICATIONS = 20
"""Optimizer: more replications than this to resolve an effect is REDESIGN, not REVISE."""
MARGIN = 1.2
"""Optimizer: replications are sized so the half-width shrinks to the effect over this margin."""
_RANK = {"SOUND": 0, "MARGINAL": 1, "UNSOUND": 2}
# scopes whose levels change the harness (its digest differs by design) or the model
_HARNESS_SCOPES = frozenset({"processor_param", "processor", "procedure"})
_MODEL_SCOPES = frozenset({"model", "procedure"})


def _grade(findings: list[tuple[str, str]]) -> PersonaVerdict:
    verdict = max((g for g, _ in findings), key=_RANK.__getitem__, default="SOUND")
    return PersonaVerdict(persona="methodologist", verdict=verdict, reasons=tuple(r for _, r in findings))


def _replications(record: ExperimentRecord) -> int:
    """Finished units per (task, cell) at the least-replicated cell; the spec's count without attempts."""
    if not record.attempts:
        return record.spec.replications
    counts: dict[tuple[str, int], int] = {}
    for out in record.attempts:
        if out.finished and out.status not in ("interrupted", "infra_failure"):
            counts[(out.task, out.round)] = counts.get((out.task, out.round), 0) + 1
    cells = len(record.started.order) // max(1, len(record.spec.tasks) * record.spec.replications)
    expected = len(record.spec.tasks) * max(1, cells)
    return min(counts.values()) if len(counts) >= expected else 0


def confounds(record: ExperimentRecord) -> list[str]:
    """How the arms differ beyond the factor: model, harness digest, step cap."""
    kinds = {f.scope.kind for f in record.spec.factors}
    arms = record.arms
    out: list[str] = []

    def differ(what: str, per_arm: Mapping[int, frozenset[Any]]) -> None:
        shown = {cell: sorted(map(str, values)) for cell, values in per_arm.items() if values}
        if len({tuple(v) for v in shown.values()}) > 1 or any(len(v) > 1 for v in shown.values()):
            out.append(f"arms differ in {what} beyond the factor: " +
                       "; ".join(f"cell {c}: {', '.join(v)}" for c, v in sorted(shown.items())))

    if not kinds & _MODEL_SCOPES:
        differ("model", {c: a.models for c, a in arms.items()})
    if not kinds & _HARNESS_SCOPES:
        differ("harness digest", {c: a.harnesses for c, a in arms.items()})
    else:  # a harness-changing scope: each arm must still run one harness
        for cell, arm in sorted(arms.items()):
            if len(arm.harnesses) > 1:
                out.append(f"cell {cell} ran {len(arm.harnesses)} harnesses; an arm plays one")
    differ("step cap", {c: a.step_caps for c, a in arms.items()})
    return out


def methodologist(record: ExperimentRecord) -> PersonaVerdict:
    """SOUND / MARGINAL / UNSOUND from falsifiability, replications, randomisation, confounds, test reuse."""
    spec, findings = record.spec, []
    if not spec.falsified_if.strip():
        findings.append(("UNSOUND", "no falsified_if: nothing the data could refute"))
    elif record.concluded.falsified == "undecided":
        findings.append(("MARGINAL", f"falsified_if undecided: {record.concluded.detail}"))
    else:
        findings.append(("SOUND", f"falsifiable and decided ({record.concluded.falsified})"))
    reps = _replications(record)
    grade = ("SOUND" if reps >= SOUND_REPLICATIONS else "MARGINAL" if reps >= MARGINAL_REPLICATIONS
             else "UNSOUND")
    findings.append((grade, f"{reps} replication(s) per cell (>= {SOUND_REPLICATIONS} sound, "
                            f"{MARGINAL_REPLICATIONS} marginal)"))
    seeded = [u.key for u in units(spec)]
    logged = list(record.started.order)
    if logged != seeded:
        findings.append(("UNSOUND", "the logged run order is not the spec's seeded shuffle"
                         + (" (it is sorted)" if logged == sorted(logged) else "")))
    elif len(logged) > 2 and logged == sorted(logged):
        findings.append(("MARGINAL", "the seeded shuffle came out sorted: order and arm are not separated"))
    else:
        findings.append(("SOUND", f"{len(logged)} units in the seeded random order (seed {spec.seed})"))
    found = confounds(record)
    findings.extend(("UNSOUND", f) for f in found)
    if not found:
        findings.append(("SOUND", "arms alike beyond the factor (model, harness, step cap)"))
    if record.reused_test_tasks:
        findings.append(("UNSOUND", f"test task(s) {', '.join(record.reused_test_tasks)} already played by an "
                                    "earlier run: the test range is spent"))
    return _grade(findings)


def auditor(record: ExperimentRecord) -> PersonaVerdict:
    """VALID / INCONCLUSIVE / INVALID from whether the conclusion follows and alternatives are closed."""
    concluded, spec = record.concluded, record.spec
    reasons: list[str] = []
    if concluded.falsified == "undecided":
        return PersonaVerdict(persona="auditor", verdict="INCONCLUSIVE",
                              reasons=(f"no conclusion to follow: {concluded.detail}",))
    direction = claimed_direction(spec)
    effects = relevant_effects(spec, concluded)
    signs = [(e, excludes_zero(e.difference)) for e in effects]
    agreeing = [e for e, s in signs if s and (direction == 0 or s == direction)]
    opposing = [e for e, s in signs if s and direction and s == -direction]
    verdict = "VALID"
    if concluded.falsified == "not_falsified":
        if not agreeing:
            verdict = "INVALID"
            reasons.append("the hypothesis stands, but no effect's interval excludes 0 in the claimed direction: "
                           "falsified_if lets a null result through")
        else:
            reasons.append("the hypothesis stands and " + _shown(agreeing[0]) + " excludes 0 as claimed")
        if opposing:
            verdict = "INVALID"
            reasons.append(_shown(opposing[0]) + " excludes 0 against the claim")
    elif agreeing and direction:
        verdict = "INVALID"
        reasons.append("falsified, yet " + _shown(agreeing[0]) + " excludes 0 in the claimed direction")
    else:
        reasons.append(f"the refutation agrees with the intervals ({concluded.detail})")
    arms = record.arms
    shares = {c: a.lost / (a.units or 1) for c, a in arms.items()}
    if shares and max(shares.values()) - min(shares.values()) > LOST_GAP:
        if verdict == "VALID":
            verdict = "INCONCLUSIVE"
        reasons.append("lost attempts (infra failures, interruptions) differ between arms: " +
                       ", ".join(f"cell {c}: {arms[c].lost} of {arms[c].units}" for c in sorted(arms)) +
                       "; they, not the factor, may explain the difference")
    else:
        reasons.append("lost attempts about equal between arms")
    return PersonaVerdict(persona="auditor", verdict=verdict, reasons=tuple(reasons))


def _shown(e: EffectSummary) -> str:
    d = e.difference
    return f"{e.variable} {e.level} - {e.reference} = {d.estimate:.3f} [{d.low:.3f}, {d.high:.3f}]"


def main_effect(record: ExperimentRecord) -> EffectSummary | None:
    """The effect the optimizer weighs: the largest (in size) of those the falsified_if speaks of."""
    effects = relevant_effects(record.spec, record.concluded)
    return max(effects, key=lambda e: abs(e.difference.estimate), default=None)


def replications_needed(effect: EffectSummary, replications: int) -> int | None:
    """Replications that shrink the interval's half-width to the effect over MARGIN (None: no effect seen)."""
    half = (effect.difference.high - effect.difference.low) / 2
    size = abs(effect.difference.estimate)
    if size == 0:
        return None
    return max(replications + 1, math.ceil(replications * (MARGIN * half / size) ** 2))


def optimizer(record: ExperimentRecord, method: PersonaVerdict, audit: PersonaVerdict) -> tuple[PersonaVerdict,
                                                                                                  ExperimentSpec]:
    """ADVANCE / REVISE / REDESIGN from effect size against noise, and the next experiment's spec."""
    spec = record.spec
    if method.verdict == "UNSOUND":
        return _verdict("REDESIGN", "the design is unsound; the next spec fixes it"), fixed_design(record)
    effect = main_effect(record)
    if effect is None:
        return _verdict("REDESIGN", "no effect was measured"), fixed_design(record)
    sign = excludes_zero(effect.difference)
    direction = claimed_direction(spec)
    d = effect.difference
    noise = f"{_shown(effect)}: effect {abs(d.estimate):.3f} vs half-width {(d.high - d.low) / 2:.3f}"
    if sign and (direction in (0, sign)):
        if audit.verdict == "VALID":
            return _verdict("ADVANCE", noise + "; it clears 0 as claimed"), next_step(spec, effect, sign)
        reps = max(spec.replications, SOUND_REPLICATIONS)
        return (_verdict("REVISE", noise + f"; clear, but the auditor finds it {audit.verdict}: run again with "
                                           f"{reps} replications on a new seed"),
                _checked(msgspec.structs.replace(spec, replications=reps, seed=spec.seed + 1)))
    if sign:
        return (_verdict("REDESIGN", noise + "; it clears 0 against the claim: the hypothesis is refuted, "
                                             "try the next level the other way"),
                next_step(spec, effect, sign, level_wins=False))
    needed = replications_needed(effect, spec.replications)
    strict = _strict(spec, effect, direction or 1) if concluded_null(record) else spec
    tightened = "; falsified_if tightened: the hypothesis stands only if the interval clears 0" \
        if strict is not spec else ""
    if needed is None or needed > MAX_REPLICATIONS:
        why = ("no difference at all between the arms" if needed is None else
               f"resolving it needs more than {MAX_REPLICATIONS} replications")
        if spec.replications < MAX_REPLICATIONS:
            proposal = msgspec.structs.replace(strict, replications=MAX_REPLICATIONS)
            what = f"this one at {MAX_REPLICATIONS} replications, the most worth running"
        else:  # replications are spent: only more tasks can narrow the interval (and rerunning it would repeat it)
            proposal = msgspec.structs.replace(strict, tasks=spec.tasks + _fresh(spec.tasks), seed=spec.seed + 1,
                                               title=f"{spec.title} (twice the tasks)")
            what = f"twice the tasks, the new ones fresh, at {spec.replications} replications"
        return (_verdict("REDESIGN", f"{noise}; {why}: change the factor more or test another (proposed: "
                                     f"{what}){tightened}"),
                _checked(proposal))
    return (_verdict("REVISE", noise + f"; {needed} replications should resolve it (sized from the spread)"
                               + tightened),
            _checked(msgspec.structs.replace(strict, replications=needed)))


def concluded_null(record: ExperimentRecord) -> bool:
    """The hypothesis was left standing though no effect it names clears 0: its falsified_if lets a null through."""
    if record.concluded.falsified != "not_falsified":
        return False
    return not any(excludes_zero(e.difference) for e in relevant_effects(record.spec, record.concluded))


def _strict(spec: ExperimentSpec, effect: EffectSummary, direction: int) -> ExperimentSpec:
    """The spec with a falsified_if that refutes unless the effect's interval clears 0 the claimed way."""
    if len(spec.factors) != 1:
        return spec
    args = f'{effect.variable}, "{effect.level}", "{effect.reference}"'
    falsified_if = f"diff_low({args}) <= 0" if direction > 0 else f"diff_high({args}) >= 0"
    return msgspec.structs.replace(spec, falsified_if=falsified_if)


def _verdict(verdict: str, reason: str) -> PersonaVerdict:
    return PersonaVerdict(persona="optimizer", verdict=verdict, reasons=(reason,))


def _checked(spec: ExperimentSpec) -> ExperimentSpec:
    seeds = max(1, len(spec.procedure_seeds))  # each procedure seed's product plays every task equally often
    spec = msgspec.structs.replace(spec, replications=-(-spec.replications // seeds) * seeds)
    return check_spec(spec, where="proposal")


def fixed_design(record: ExperimentRecord) -> ExperimentSpec:
    """The spec with what made it unsound fixed: replications, a fresh (dev) range, the confounded variables pinned."""
    spec = record.spec
    controlled = dict(spec.controlled_variables)
    kinds = {f.scope.kind for f in spec.factors}
    reference = record.arms.get(0)
    if reference is not None:
        if not kinds & _MODEL_SCOPES and len(reference.models) == 1 and "model" not in controlled:
            controlled["model"] = next(iter(reference.models))
        caps = sorted(c for a in record.arms.values() for c in a.step_caps)
        if caps and len(set(caps)) > 1:
            controlled["max_steps"] = caps[0]
    tasks = tuple(_dev(t) if t in tasks_on_test_split(spec) else t for t in spec.tasks)
    return _checked(msgspec.structs.replace(spec, replications=max(spec.replications, SOUND_REPLICATIONS),
                                            tasks=tuple(dict.fromkeys(tasks)), controlled_variables=controlled))


def _dev(task: str) -> str:
    tid = TaskId.parse(task)
    return str(TaskId(tid.benchmark, tid.game, "dev", tid.seed))


def _number(value: Any) -> float | None:
    """A level value as a number (a one-key mapping's value for a processor_param), or None."""
    if isinstance(value, Mapping) and len(value) == 1:
        value = next(iter(value.values()))
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _like(template: Any, number: float) -> Any:
    """``number`` in the form of ``template`` (int, float, numeric string, one-key mapping)."""
    if isinstance(template, Mapping):
        (key, inner), = template.items()
        return {key: _like(inner, number)}
    if isinstance(template, int) and not isinstance(template, bool):
        return math.floor(number)
    whole = number.is_integer() and not (isinstance(template, float) or (isinstance(template, str) and
                                                                         "." in template))
    shown: Any = int(number) if whole else round(number, 6)
    return str(shown) if isinstance(template, str) else shown


def next_step(spec: ExperimentSpec, effect: EffectSummary, sign: int, *, level_wins: bool = True) -> ExperimentSpec:
    """After a clear effect: one step further along a numeric factor, else the same contrast on fresh tasks.

    ``sign`` is the side of 0 the difference (level - reference) lies on; the winner (the level, or
    with ``level_wins`` False the reference) is kept and compared with the value one step beyond it,
    expected to move the variable further the winner's way. A step that would take a non-negative
    factor below 0 halves the winner's value instead.
    """
    factor = next((f for f in spec.factors if f.name == effect.factor), None)
    if factor is not None and len(spec.factors) == 1:
        kept, other = (effect.level, effect.reference) if level_wins else (effect.reference, effect.level)
        expect = sign if level_wins else -sign
        a, b = _number(factor.scope.levels.get(kept)), _number(factor.scope.levels.get(other))
        if a is not None and b is not None and a != b:
            beyond = a + (a - b)
            if beyond < 0 <= min(a, b):
                beyond = a / 2
            value = _like(factor.scope.levels[kept], beyond)
            name = str(_number(value) if not isinstance(value, str) else value)
            name = name[:-2] if name.endswith(".0") else name
            if name not in (kept, other) and _number(value) != a:
                return _next_level(spec, factor, kept, name, value, effect.variable, expect)
    return _checked(msgspec.structs.replace(spec, tasks=_fresh(spec.tasks), seed=spec.seed + 1,
                                            title=f"{spec.title} (fresh tasks)"))


def _next_level(spec: ExperimentSpec, factor: Factor, kept: str, name: str, value: Any, variable: str,
                sign: int) -> ExperimentSpec:
    scope = MutableScope(kind=factor.scope.kind, target=factor.scope.target, config=factor.scope.config,
                         levels={kept: factor.scope.levels[kept], name: value})
    falsified_if = (f'diff_high({variable}, "{name}", "{kept}") <= 0' if sign > 0 else
                    f'diff_low({variable}, "{name}", "{kept}") >= 0')
    parse(falsified_if)
    return _checked(msgspec.structs.replace(
        spec, title=f"{spec.title}: {factor.name} {kept} -> {name}",
        hypothesis=f"{factor.name} at {name} moves {variable} further {'up' if sign > 0 else 'down'} than at {kept}",
        falsified_if=falsified_if, factors=(Factor(name=factor.name, levels=(kept, name), scope=scope),)))


def _fresh(tasks: tuple[str, ...]) -> tuple[str, ...]:
    """The same games at task seeds not yet played (each seed shifted by the number of tasks)."""
    out = []
    for text in tasks:
        try:
            tid = TaskId.parse(text)
        except BenchmarkError:
            out.append(text)  # BENCH:GAME with tasks_per_game: the new seed draws other tasks
            continue
        out.append(str(TaskId(tid.benchmark, tid.game, tid.split, tid.seed + len(tasks))))
    return tuple(out)


def offline_review(record: ExperimentRecord) -> PanelReviewed:
    """The deterministic panel's review of one experiment."""
    method = methodologist(record)
    audit = auditor(record)
    try:
        optimize, proposal = optimizer(record, method, audit)
    except SpecRejected as exc:  # a rule produced a spec the runner refuses: say so, keep the fixed design
        optimize = _verdict("REDESIGN", f"the next spec was refused ({exc}); the design fixed instead")
        proposal = fixed_design(record)
    return PanelReviewed(run_id=record.run_id, spec_digest=record.concluded.spec_digest, reviewer="offline",
                         review=record.reviews, verdicts=(method, audit, optimize),
                         decision=decide(method.verdict, audit.verdict, optimize.verdict),
                         proposal=proposal_json(proposal))


__all__ = [
    "LOST_GAP", "MARGINAL_REPLICATIONS", "MAX_REPLICATIONS", "SOUND_REPLICATIONS", "auditor", "concluded_null",
    "confounds",
    "fixed_design", "main_effect", "methodologist", "next_step", "offline_review", "optimizer",
    "replications_needed",
]
