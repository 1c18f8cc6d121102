"""What an experiment's units show: per level means, effects against the reference, interactions, falsification.

Every interval comes from ``hx.intervals``, seeded with the spec's seed, so the same units
give the same conclusion (a resumed run and an uninterrupted one agree to the digit):

- a level's (cell's) mean: Wilson for the 0/1 variables (``passed``, ``env_success``, ``pass_at_k``),
  else the two-stage bootstrap over tasks then replications; with several procedure seeds, a
  table of tasks x seeds (each seed's mean, or for ``pass_at_k`` its pass@k) and the crossed
  bootstrap over tasks and seeds (``hx.intervals.crossed_contrast``) for every figure;
- an effect: the level minus the factor's first (reference) level (and any other pair of a factor's levels
  the falsified_if compares, the first named minus the second), paired over tasks, tasks and
  replications resampled, with the keep rule's verdict on it, and the standardised effect size;
- in a 2 x 2 factorial, the interaction contrast (b1 - b0 at a1) - (b1 - b0 at a0); and each of the
  spec's ``comparisons`` and ``interactions`` over named levels of one factor;
- with ``per_game``, every level mean and effect also per game, as the variable ``<variable> <bench:game>``;
- the falsification verdict: ``falsified`` when falsified_if holds, ``not_falsified`` when it
  does not, ``undecided`` when a value it needs is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hx.errors import IntervalError
from hx.experiment.design import Cell, Unit
from hx.experiment.falsify import evaluate, parse
from hx.intervals import (
    Interval,
    contrast,
    crossed_contrast,
    keep_rule,
    paired_difference,
    pass_rate,
    standardised_difference,
    task_mean,
)
from projections.attempt_outputs import AttemptOutput
from schemas.evaluation import Bounds
from schemas.experiment import (
    EffectSummary,
    ExperimentConcluded,
    ExperimentSpec,
    Falsification,
    InteractionSummary,
    LevelSummary,
)

BINARY = frozenset({"passed", "env_success", "pass_at_k"})
"""Response variables that are 0/1 per unit: their means get Wilson intervals."""

Outcomes = dict[str, list[float]]
"""Task id to the values of its units (one per replication)."""


def bounds(interval: Interval) -> Bounds:
    """An ``hx.intervals.Interval`` as the event payload."""
    return Bounds(estimate=interval.estimate, low=interval.low, high=interval.high, confidence=interval.confidence,
                  method=interval.method)


def value(output: AttemptOutput, variable: str) -> float:
    """One response variable of one attempt as a number (a boolean as 0 or 1; ``pass_at_k`` is ``passed``, taken
    at its maximum over a product's k attempts by ``_arms``)."""
    return float(getattr(output, "passed" if variable == "pass_at_k" else variable))


def _seeded(spec: ExperimentSpec) -> bool:
    """Whether the units form a tasks x procedure-seeds table (several procedure seeds)."""
    return len(spec.procedure_seeds) > 1


def _mean(spec: ExperimentSpec, variable: str, outcomes: Outcomes) -> Bounds:
    if _seeded(spec):
        return bounds(crossed_contrast([outcomes], [1.0], seed=spec.seed))
    if variable in BINARY:
        values = [v for vs in outcomes.values() for v in vs]
        return bounds(pass_rate(int(sum(values)), len(values)))
    return bounds(task_mean(outcomes, seed=spec.seed))


def _difference(spec: ExperimentSpec, base: Outcomes, cand: Outcomes) -> tuple[Interval, Interval]:
    """(difference, standardised size) of candidate - base, paired: over tasks and seeds when seeded."""
    size = standardised_difference(base, cand, seed=spec.seed)
    if _seeded(spec):
        return crossed_contrast([base, cand], [-1.0, 1.0], seed=spec.seed), size
    return paired_difference(base, cand, seed=spec.seed), size


def _arms(spec: ExperimentSpec, outputs: Mapping[Unit, AttemptOutput]) -> dict[str, dict[str, Outcomes]]:
    """Arm name (a cell, or in a factorial ``factor=level``) -> variable -> task -> its values: one per replication,
    or with several procedure seeds one per seed (its replications' mean); ``pass_at_k`` one per product (1 when
    any of its k attempts passed).

    A factorial's marginal arm (``factor=level``) holds the units of several cells: its ``pass_at_k`` is each
    cell's pass@k, never the best of attempts from different cells (that would be pass@(k x cells)): one value
    per cell, or with procedure seeds per seed the mean over the cells of that seed's products.
    """
    seeds = max(1, len(spec.procedure_seeds))
    raw: dict[str, dict[str, dict[str, list[tuple[int, int, float]]]]] = {}

    def add(name: str, unit: Unit, output: AttemptOutput) -> None:
        arm = raw.setdefault(name, {v: {} for v in spec.response_variables})
        for variable in spec.response_variables:
            arm[variable].setdefault(unit.task, []).append(
                (unit.cell.index, unit.replication % seeds, value(output, variable)))

    # units in (task, cell, replication) order, whatever order they ran in: the bootstrap sees the same arrays
    for unit in sorted(outputs, key=lambda u: (u.task, u.cell.index, u.replication)):
        add(unit.cell.name, unit, outputs[unit])
        if len(spec.factors) > 1:
            for factor, level in unit.cell.levels:
                add(f"{factor}={level}", unit, outputs[unit])

    def fold(variable: str, values: list[tuple[int, int, float]]) -> list[float]:
        if variable != "pass_at_k":
            if seeds == 1:
                return [v for _, _, v in values]
            per = [[v for _, s, v in values if s == seed] for seed in range(seeds)]
            return [sum(vs) / len(vs) for vs in per if vs]
        products: dict[tuple[int, int], float] = {}  # (cell, seed) -> pass@k of that product
        for cell, seed, v in values:
            products[cell, seed] = max(products.get((cell, seed), 0.0), v)
        cells = sorted({cell for cell, _ in products})
        if seeds == 1:
            return [products[cell, 0] for cell in cells]
        per = [[products[cell, seed] for cell in cells if (cell, seed) in products] for seed in range(seeds)]
        return [sum(vs) / len(vs) for vs in per if vs]

    return {name: {variable: {task: fold(variable, values) for task, values in tasks.items()}
                   for variable, tasks in variables.items()} for name, variables in raw.items()}


def _games(spec: ExperimentSpec) -> list[str]:
    """The spec's games (``bench:game``) when it asks for figures per game (and has more than one), else none."""
    games = sorted({":".join(task.split(":")[:2]) for task in spec.tasks})
    return games if spec.per_game and len(games) > 1 else []


def _of_game(outcomes: Outcomes, game: str) -> Outcomes:
    return {task: values for task, values in outcomes.items() if task.startswith(f"{game}:")}


class Conclusion:
    """The summaries of an experiment, answering the falsified_if functions (``falsify.Results``)."""

    def __init__(self, spec: ExperimentSpec, levels: Sequence[LevelSummary], effects: Sequence[EffectSummary]) -> None:
        self.spec = spec
        self.levels = {(s.variable, s.level): s for s in levels}
        self.effects = {(s.variable, s.factor, s.level, s.reference): s for s in effects}

    def _arm(self, level: str) -> str:
        """A level as the arm name summaries use: plain in a one-factor spec, ``factor=level`` in a factorial."""
        if len(self.spec.factors) == 1:
            factor, sep, plain = level.partition("=")
            return plain if sep and factor == self.spec.factors[0].name else level
        if "=" in level:
            return level
        owners = [f.name for f in self.spec.factors if level in f.levels]
        return f"{owners[0]}={level}" if len(owners) == 1 else level

    def level_mean(self, variable: str, level: str) -> Bounds | None:
        """The mean of ``variable`` at a level or cell."""
        summary = self.levels.get((variable, self._arm(level)))
        return summary.mean if summary else None

    def effect(self, variable: str, level: str, reference: str) -> tuple[Bounds, Bounds] | None:
        """(difference, effect size) of ``level`` against ``reference`` when that comparison was made."""
        for factor in self.spec.factors:
            found = self.effects.get((variable, factor.name, _plain(self._arm(level)), _plain(self._arm(reference))))
            if found is not None and self._owns(factor.name, level) and self._owns(factor.name, reference):
                return found.difference, found.effect_size
        return None

    def _owns(self, factor: str, level: str) -> bool:
        arm = self._arm(level)
        return "=" not in arm or arm.split("=", 1)[0] == factor


def _plain(arm: str) -> str:
    return arm.split("=", 1)[1] if "=" in arm else arm


def _comparisons(spec: ExperimentSpec, factor: str, levels: Sequence[str]) -> list[tuple[str, str]]:
    """Each level against the factor's reference, then any other pair of its levels the falsified_if compares."""
    pairs = [(level, levels[0]) for level in levels[1:]]
    for level, reference in spec.comparisons:
        if level in levels and reference in levels and (level, reference) not in pairs:
            pairs.append((level, reference))
    for named in sorted(parse(spec.falsified_if).pairs):
        plain = tuple(name.removeprefix(f"{factor}=") for name in named)
        if all(name in levels for name in plain) and levels[0] not in plain and \
                plain not in pairs and plain[::-1] not in pairs:
            pairs.append((plain[0], plain[1]))
    return pairs


def conclude(spec: ExperimentSpec, cells: Sequence[Cell], outputs: Mapping[Unit, AttemptOutput], *, run_id: str,
             spec_digest: str) -> ExperimentConcluded:
    """Summarise the finished units of an experiment as its ``ExperimentConcluded``."""
    arms = _arms(spec, outputs)
    games = _games(spec)
    levels: list[LevelSummary] = []
    notes: list[str] = []
    for name, variables in arms.items():
        for variable, outcomes in variables.items():
            for label, part in [(variable, outcomes), *((f"{variable} {g}", _of_game(outcomes, g)) for g in games)]:
                try:
                    mean = _mean(spec, variable, part)
                except IntervalError as exc:  # e.g. a task short of a seed's units: named, the rest concluded
                    notes.append(f"{label} mean at {name}: {exc}")
                    continue
                levels.append(LevelSummary(variable=label, level=name, n=sum(map(len, part.values())), mean=mean))
    effects: list[EffectSummary] = []
    for factor in spec.factors:
        def arm(level: str, factor_name: str = factor.name) -> str:
            return level if len(spec.factors) == 1 else f"{factor_name}={level}"
        for level, reference in _comparisons(spec, factor.name, factor.levels):
            for variable in spec.response_variables:
                base, cand = arms.get(arm(reference), {}).get(variable), arms.get(arm(level), {}).get(variable)
                if not base or not cand:
                    notes.append(f"no units for {factor.name}={level if not cand else reference}")
                    continue
                parts = [(variable, base, cand), *((f"{variable} {g}", _of_game(base, g), _of_game(cand, g))
                                                   for g in games)]
                for label, b, c in parts:
                    try:
                        difference, size = _difference(spec, b, c)
                    except IntervalError as exc:
                        notes.append(f"{label} {level} vs {reference}: {exc}")
                        continue
                    effects.append(EffectSummary(variable=label, factor=factor.name, level=level,
                                                 reference=reference, difference=bounds(difference),
                                                 effect_size=bounds(size), verdict=keep_rule(difference).value))
    interactions = _interactions(spec, cells, arms, notes)
    verdict, detail = evaluate(parse(spec.falsified_if), Conclusion(spec, levels, effects))
    falsified: Falsification = "undecided" if verdict is None else "falsified" if verdict else "not_falsified"
    if notes:
        detail = f"{detail}; {'; '.join(notes)}"
    return ExperimentConcluded(run_id=run_id, spec_digest=spec_digest, units=len(outputs), levels=tuple(levels),
                               effects=tuple(effects), interactions=tuple(interactions), falsified=falsified,
                               detail=detail)


def _interactions(spec: ExperimentSpec, cells: Sequence[Cell], arms: Mapping[str, Mapping[str, Outcomes]],
                  notes: list[str]) -> list[InteractionSummary]:
    """A 2 x 2 factorial's interaction, and each of the spec's named ``interactions`` (a0b0, a1b0, a0b1, a1b1);
    one whose interval cannot be had is named in ``notes`` instead."""
    out: list[InteractionSummary] = []
    quads: list[tuple[tuple[str, str], list[str], list[float]]] = []
    if len(spec.factors) == 2 and all(len(f.levels) == 2 for f in spec.factors):
        a, b = spec.factors
        quads.append(((a.name, b.name), [c.name for c in cells], [1.0, -1.0, -1.0, 1.0]))  # a0b0, a0b1, a1b0, a1b1
    for quad in spec.interactions:
        owner = next(f.name for f in spec.factors if set(quad) <= set(f.levels))
        names = list(quad) if len(spec.factors) == 1 else [f"{owner}={level}" for level in quad]
        quads.append(((owner, ",".join(quad)), names, [1.0, -1.0, -1.0, 1.0]))
    for factors, names, weights in quads:
        for variable in spec.response_variables:
            tables = [arms.get(name, {}).get(variable) for name in names]
            if not all(tables):
                continue
            present = [t for t in tables if t]
            try:
                interaction = (crossed_contrast(present, weights, seed=spec.seed) if _seeded(spec)
                               else contrast(present, weights, seed=spec.seed))
            except IntervalError as exc:
                notes.append(f"{variable} interaction {' x '.join(factors)}: {exc}")
                continue
            out.append(InteractionSummary(variable=variable, factors=factors, contrast=bounds(interaction)))
    return out
