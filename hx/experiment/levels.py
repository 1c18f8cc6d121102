"""A cell's arm: the controlled harness, models and environment with each factor's level applied through its scope.

- ``processor_param``: the named processor's parameter takes the level's value (null: the processor's default);
- ``processor``: the processor is attached with the scope's ``config`` (a true level) or removed (false/null);
- ``model``: the role's model spec is the level's value;
- ``env``: the environment variable is the level's value (null: unset) while the unit's attempt runs;
- ``procedure``: the level's product (a harness, for ``coevolve`` also a policy), made before the play phase.

An evolution that forked ends with several variants, each serving some task clusters (``benchmark:game``): its
product is the root's harness and, per cluster the root does not serve, the serving variant's (``Product.routes``).
A unit plays the harness its task's cluster routes to (``Arm.harness_for``), as the evolution's own held-out
evaluation does; the other scopes apply to each of them alike.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hx.experiment.design import Cell
from hx.experiment.errors import ExperimentError
from hx.gate.rule import cluster_of
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from hx.runtime.models import ModelConfig
from schemas.experiment import ExperimentSpec, MutableScope


@dataclass(frozen=True)
class Product:
    """What a procedure level produced: its harness (the root variant's), models, and the other variants' routes."""

    harness: HarnessConfig
    models: ModelConfig
    routes: Mapping[str, HarnessConfig] = field(default_factory=dict)
    """Task cluster -> the harness of the variant serving it, where that is not the root."""


Products = Mapping[tuple[str, str, int], Product]
"""(factor, level, procedure seed index) -> what a procedure level produced."""


@dataclass(frozen=True)
class Arm:
    """What one cell plays with."""

    harness: HarnessConfig
    models: ModelConfig
    env: dict[str, str | None] = field(default_factory=dict)
    routes: Mapping[str, HarnessConfig] = field(default_factory=dict)
    """Task cluster -> the harness its units play, where not ``harness`` (a forked evolution's variants)."""

    def harness_for(self, task: str) -> HarnessConfig:
        """The harness a unit of ``task`` plays: its cluster's route, else the arm's harness."""
        return self.routes.get(cluster_of(task), self.harness)


def _processor_param(data: dict[str, Any], scope: MutableScope, value: Any, where: str) -> None:
    name, _, param = scope.target.partition(".")
    if not param:  # target names the processor; the level names its one parameter
        if value is None:
            return
        ((param, value),) = dict(value).items()
    found = [p for p in data["processors"] if p.get("type") == name]
    if not found:
        raise ExperimentError(f"{where}: the controlled harness has no processor {name!r} "
                              f"(it has: {', '.join(p.get('type', '?') for p in data['processors'])})")
    for processor in found:
        params = dict(processor.get("params") or {})
        if value is None:
            params.pop(param, None)
        else:
            params[param] = value
        processor["params"] = params


def _processor(data: dict[str, Any], scope: MutableScope, value: Any) -> None:
    data["processors"] = [p for p in data["processors"] if p.get("type") != scope.target]
    if value not in (None, False, "", 0, "off"):
        data["processors"].append({"type": scope.target, **copy.deepcopy(dict(scope.config))})


def _model(models: ModelConfig, role: str, value: Any) -> ModelConfig:
    spec = str(value)
    if role in ("main", "judge", "evaluator"):
        return msgspec.structs.replace(models, **{role: spec})
    return msgspec.structs.replace(models, roles={**models.roles, role: spec})


def arm_of(spec: ExperimentSpec, cell: Cell, base: HarnessConfig, models: ModelConfig,
           products: Products | None = None, seed_index: int = 0) -> Arm:
    """The harness, models and environment of one cell (with the products of one procedure seed)."""
    data = base.to_dict()
    routes: dict[str, dict[str, Any]] = {}
    env: dict[str, str | None] = {}
    harness_changed = False
    # a procedure's product replaces the harness: apply it first, so the other factors change the product
    for factor in sorted(spec.factors, key=lambda f: f.scope.kind != "procedure"):
        level = cell.level(factor.name)
        scope = factor.scope
        value = scope.levels[level]
        where = f"factor {factor.name!r} level {level!r}"
        if scope.kind == "processor_param":
            for each in (data, *routes.values()):
                _processor_param(each, scope, value, where)
            harness_changed = True
        elif scope.kind == "processor":
            for each in (data, *routes.values()):
                _processor(each, scope, value)
            harness_changed = True
        elif scope.kind == "model":
            models = _model(models, scope.target, value)
        elif scope.kind == "env":
            env[scope.target] = None if value is None else str(value)
        elif value is not None:  # a procedure level with options (or an artifact): play its product
            product = (products or {}).get((factor.name, level, seed_index))
            if product is None:
                raise ExperimentError(f"{where}: its {scope.target} product is not made yet")
            models = product.models
            data = product.harness.to_dict()
            routes = {cluster: h.to_dict() for cluster, h in product.routes.items()}
    harness = base
    if harness_changed or data != base.to_dict():
        harness = _built(data, f"cell {cell.name!r}'s harness")
    built = {cluster: _built(d, f"cell {cell.name!r}'s harness for {cluster}") for cluster, d in routes.items()}
    return Arm(harness=harness, models=models, env=env, routes=built)


def _built(data: dict[str, Any], where: str) -> HarnessConfig:
    try:
        return HarnessConfig.from_dict(data, where=where)
    except CompositionError as exc:
        raise ExperimentError(str(exc)) from exc
