"""Load an experiment spec (YAML, TOML or JSON) and reject one that changes more than one thing.

A spec is an ``ExperimentSpec`` (schemas/experiment.py, JSON Schema in
``schemas/json/experiment-spec.json``). The seed's shape, a top-level ``factor`` and
``mutable_scope`` (with ``type``/``var``), is accepted and normalised to ``factors``.
Every rejection is one ``SpecRejected`` line naming the file and the field.

>>> spec = parse_spec({"title": "t", "hypothesis": "h", "falsified_if": 'diff_high(passed, "on", "off") <= 0',
...     "factor": {"name": "pk", "levels": ["off", "on"]}, "tasks": ["bench:game:dev:0"], "replications": 2,
...     "response_variables": ["passed"],
...     "mutable_scope": {"type": "env", "var": "HX_PK", "levels": {"off": "", "on": "1"}}}, where="x.json")
>>> spec.factors[0].scope.kind, spec.factors[0].scope.target
('env', 'HX_PK')
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from hx.experiment.errors import FalsifyUnparsed, SpecRejected
from hx.experiment.falsify import Expression, parse
from schemas.documents import read_document
from schemas.experiment import ExperimentSpec, Factor, MutableScope
from schemas.jsonschema import document_schema

# Numeric AttemptOutput fields an experiment can measure (booleans count as 0/1).
RESPONSE_VARIABLES: tuple[str, ...] = (
    "passed", "score", "steps", "actions", "tool_errors", "invalid_actions", "longest_repeat", "env_success",
    "pass_at_k",
)
"""``pass_at_k`` is derived: a task's k attempts under one product (k = replications / procedure seeds) count 1
when any passed (the paper's pass@2 with k = 2)."""
_LATER_FIELDS = {"procedure_seeds": [], "comparisons": [], "interactions": [], "per_game": False, "claim": "",
                 "expected_wall_s": 0}
"""Spec fields added later: left out of the digest at their defaults, so an older run's spec digests as it did."""

# The seed's mutable_scope spelled its fields differently.
_SEED_SCOPE_KEYS = {"type": "kind", "var": "target"}


def mixed_of(value: Any) -> tuple[str | None, str | None] | None:
    """(harness level, policy level) of a level ``{"harness_of": L1, "policy_of": L2}`` (null: the controlled one),
    or None for any other value."""
    if isinstance(value, Mapping) and value and set(value) <= {"harness_of", "policy_of"} and all(
            v is None or isinstance(v, str) for v in value.values()):
        return value.get("harness_of"), value.get("policy_of")
    return None


def artifact_of(value: Any) -> str | None:
    """The level whose product a level value plays (``{"artifact_of": L}``), or None."""
    if isinstance(value, Mapping) and set(value) == {"artifact_of"} and isinstance(value["artifact_of"], str):
        return value["artifact_of"]
    return None


def cell_name(levels: Mapping[str, str]) -> str:
    """A factorial cell's name, ``factor=level,factor=level`` in the spec's factor order."""
    return ",".join(f"{factor}={level}" for factor, level in levels.items())


def cells(spec: ExperimentSpec) -> list[dict[str, str]]:
    """Every combination of levels (one factor: its levels), the reference combination first."""
    return [dict(zip((f.name for f in spec.factors), combo, strict=True))
            for combo in itertools.product(*(f.levels for f in spec.factors))]


def level_names(spec: ExperimentSpec) -> frozenset[str]:
    """Every name a falsified_if may use as a level: plain levels, ``factor=level`` and (factorial) cells."""
    names: set[str] = set()
    for factor in spec.factors:
        names.update(factor.levels)
        names.update(f"{factor.name}={level}" for level in factor.levels)
    if len(spec.factors) > 1:
        names.update(cell_name(c) for c in cells(spec))
    return frozenset(names)


def spec_digest(spec: ExperimentSpec) -> str:
    """Content digest of a spec (``sha256:`` + hex over its canonical JSON)."""
    data = {k: v for k, v in msgspec.to_builtins(spec).items() if _LATER_FIELDS.get(k, object()) != v}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of ExperimentSpec as published in ``schemas/json/experiment-spec.json``."""
    return document_schema("experiment-spec", ExperimentSpec)


def _normalise(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The seed's ``factor`` + ``mutable_scope`` shape as ``factors``; other shapes unchanged."""
    out = dict(data)
    if "factor" not in out and "mutable_scope" not in out:
        return out
    if "factors" in out:
        raise SpecRejected(f"{where}: factors: give either factors or factor + mutable_scope, not both")
    factor = out.pop("factor", None)
    scope = out.pop("mutable_scope", None)
    if not isinstance(factor, Mapping):
        raise SpecRejected(f"{where}: factor: missing or not a mapping (the seed's shape needs factor and "
                           "mutable_scope)")
    if not isinstance(scope, Mapping):
        raise SpecRejected(f"{where}: mutable_scope: missing or not a mapping (exactly one scope per factor)")
    scope = {_SEED_SCOPE_KEYS.get(key, key): value for key, value in scope.items()}
    out["factors"] = [{**factor, "scope": scope}]
    return out


def _reject(where: str, field: str, why: str) -> SpecRejected:
    return SpecRejected(f"{where}: {field}: {why}")


def _check_scope(spec: ExperimentSpec, index: int, where: str) -> None:
    """One factor: its scope changes one thing, its levels match, artifacts name a procedure level."""
    factor = spec.factors[index]
    scope = factor.scope
    at = f"factors[{index}]"
    if len(factor.levels) < 2:
        raise _reject(where, f"{at}.levels", f"factor {factor.name!r} has {len(factor.levels)} level(s); "
                      "an experiment needs at least 2")
    if len(set(factor.levels)) != len(factor.levels):
        raise _reject(where, f"{at}.levels", f"factor {factor.name!r} names a level twice")
    if set(scope.levels) != set(factor.levels):
        missing = sorted(set(factor.levels) - set(scope.levels))
        extra = sorted(set(scope.levels) - set(factor.levels))
        raise _reject(where, f"{at}.scope.levels", f"do not match the factor's levels (missing: {missing}, "
                      f"not a level of {factor.name!r}: {extra})")
    if not scope.target:
        raise _reject(where, f"{at}.scope.target", "is empty")
    if scope.kind == "procedure" and scope.target not in ("evolve", "coevolve"):
        raise _reject(where, f"{at}.scope.target", f"a procedure is evolve or coevolve, not {scope.target!r}")
    if scope.kind == "processor_param" and "." not in scope.target and not all(
            isinstance(v, Mapping) or v is None for v in scope.levels.values()):
        raise _reject(where, f"{at}.scope.target", f"{scope.target!r} is not <processor>.<parameter>, so each "
                      "level must be {parameter: value}")
    values: dict[str, Any] = {}
    for level, value in scope.levels.items():
        mixed = mixed_of(value)
        if mixed is not None:
            _check_mixed(scope, level, mixed, where, at)
            continue
        source = artifact_of(value)
        if source is None:
            values[level] = value
            continue
        if scope.kind != "procedure":
            raise _reject(where, f"{at}.scope.levels.{level}", "artifact_of needs a procedure scope (only a "
                          "procedure has a product)")
        if source == level:
            raise _reject(where, f"{at}.scope.levels.{level}", "artifact_of names the level itself")
        if source not in scope.levels:
            raise _reject(where, f"{at}.scope.levels.{level}", f"artifact_of names unknown level {source!r}")
        if scope.levels[source] is None or artifact_of(scope.levels[source]) is not None:
            raise _reject(where, f"{at}.scope.levels.{level}", f"artifact_of names level {source!r}, which runs "
                          "no procedure of its own")
    mappings = {level: value for level, value in values.items() if isinstance(value, Mapping)}
    if scope.kind == "processor_param":
        for level, value in mappings.items():
            if len(value) > 1:
                raise _reject(where, f"{at}.scope.levels.{level}", f"sets {len(value)} parameters "
                              f"({', '.join(sorted(value))}); a processor_param scope changes one")
    if len({frozenset(v) for v in mappings.values()}) > 1:
        shown = "; ".join(f"{lv}: {sorted(v)}" for lv, v in mappings.items())
        raise _reject(where, f"{at}.scope.levels", f"the levels' values differ in keys ({shown}); every arm "
                      "must set the same things, only their values may differ")
    changed = {scope.target, scope.target.rsplit(".", 1)[-1]}
    changed.update(key for value in mappings.values() for key in value)
    if scope.kind == "model":
        changed.update({"model", f"model.{scope.target}"})
    controlled = set(spec.controlled_variables)
    env = spec.controlled_variables.get("env")
    if scope.kind == "env" and isinstance(env, Mapping):
        controlled.update(env)
    both = sorted(changed & controlled)
    if both:
        raise _reject(where, f"{at}.scope", f"factor {factor.name!r} also changes controlled variable(s) "
                      f"{', '.join(both)}; a controlled variable is the same in every arm")


def _check_mixed(scope: MutableScope, level: str, mixed: tuple[str | None, str | None], where: str, at: str) -> None:
    """A level playing one level's harness with another's policy names procedure levels of its own factor."""
    if scope.kind != "procedure":
        raise _reject(where, f"{at}.scope.levels.{level}", "harness_of/policy_of need a procedure scope (only a "
                      "procedure has a product)")
    for key, source in zip(("harness_of", "policy_of"), mixed, strict=True):
        if source is None:
            continue
        value = scope.levels.get(source)
        if source == level or source not in scope.levels or value is None or not isinstance(value, Mapping) or \
                artifact_of(value) is not None or mixed_of(value) is not None:
            raise _reject(where, f"{at}.scope.levels.{level}.{key}", f"names {source!r}, not another level that "
                          "runs a procedure of its own")
    if mixed[1] is not None and scope.target != "coevolve":
        raise _reject(where, f"{at}.scope.levels.{level}.policy_of", "only a coevolve procedure makes a policy")


def _check_pairs(spec: ExperimentSpec, where: str) -> None:
    """``comparisons`` and ``interactions`` name levels of one factor; ``procedure_seeds`` fit the replications."""
    def factor_with(levels: tuple[str, ...], field: str) -> None:
        if len(set(levels)) != len(levels):
            raise _reject(where, field, f"names a level twice ({', '.join(levels)})")
        if not any(set(levels) <= set(f.levels) for f in spec.factors):
            raise _reject(where, field, f"{', '.join(map(repr, levels))} are not levels of one factor")

    for i, pair in enumerate(spec.comparisons):
        factor_with(tuple(pair), f"comparisons[{i}]")
    for i, quad in enumerate(spec.interactions):
        factor_with(tuple(quad), f"interactions[{i}]")
    seeds = spec.procedure_seeds
    if seeds:
        if len(set(seeds)) != len(seeds):
            raise _reject(where, "procedure_seeds", "a seed is listed twice")
        if not any(f.scope.kind == "procedure" for f in spec.factors):
            raise _reject(where, "procedure_seeds", "no procedure factor to make once per seed")
        if spec.replications % len(seeds):
            raise _reject(where, "replications", f"{spec.replications} is not a multiple of the "
                          f"{len(seeds)} procedure seeds (replication r plays seed r mod {len(seeds)})")
    if spec.expected_wall_s < 0:
        raise _reject(where, "expected_wall_s", "is negative")


def _check_falsify(spec: ExperimentSpec, where: str) -> Expression:
    """The falsified_if parses and names only the spec's response variables and levels."""
    try:
        expression = parse(spec.falsified_if)
    except FalsifyUnparsed as exc:
        raise FalsifyUnparsed(f"{where}: falsified_if: does not parse: {exc}") from exc
    unknown = sorted(expression.variables - set(spec.response_variables))
    if unknown:
        raise _reject(where, "falsified_if", f"names {', '.join(unknown)}, not a response variable of this spec")
    known = level_names(spec)
    unknown = sorted(expression.levels - known)
    if unknown:
        raise _reject(where, "falsified_if", f"names level(s) {', '.join(map(repr, unknown))} the spec "
                      "does not have")
    if len(spec.factors) > 1:
        ambiguous = sorted(name for name in expression.levels
                           if sum(name in f.levels for f in spec.factors) > 1)
        if ambiguous:
            raise _reject(where, "falsified_if", f"level {ambiguous[0]!r} belongs to more than one factor; "
                          "write it as factor=level")
    def owner(name: str) -> str:
        factor, sep, _ = name.partition("=")
        if sep:
            return "," if "," in name else factor  # a cell belongs to no one factor
        return next(f.name for f in spec.factors if name in f.levels)

    for level, reference in expression.pairs:
        if level == reference:
            raise _reject(where, "falsified_if", f"compares level {level!r} with itself")
        if owner(level) != owner(reference) or owner(level) == ",":
            raise _reject(where, "falsified_if", f"diff/effect compare two levels of one factor, not {level!r} "
                          f"and {reference!r}")
    return expression


def check_spec(spec: ExperimentSpec, where: str = "spec") -> ExperimentSpec:
    """Validate a spec already decoded; raises SpecRejected (``<where>: <field>: <why>``) or returns it."""
    for name in ("title", "hypothesis"):
        if not str(getattr(spec, name)).strip():
            raise _reject(where, name, "is empty")
    if not spec.factors:
        raise _reject(where, "factors", "no factor; an experiment changes exactly one thing")
    if len(spec.factors) > 1 and spec.design != "factorial":
        raise _reject(where, "factors", f"{len(spec.factors)} factors change {len(spec.factors)} things; "
                      "declare design: factorial to run every combination, or split into one spec per factor")
    if spec.design == "factorial" and len(spec.factors) < 2:
        raise _reject(where, "design", "factorial needs two or more factors")
    names = [f.name for f in spec.factors]
    if len(set(names)) != len(names):
        raise _reject(where, "factors", "two factors share a name")
    scopes = [(f.scope.kind, f.scope.target) for f in spec.factors]
    if len(set(scopes)) != len(scopes):
        raise _reject(where, "factors", "two factors change the same scope")
    for index in range(len(spec.factors)):
        _check_scope(spec, index, where)
    if spec.replications < 1:
        raise _reject(where, "replications", f"is {spec.replications}; at least 1")
    if not spec.tasks:
        raise _reject(where, "tasks", "no task")
    if len(set(spec.tasks)) != len(spec.tasks):
        raise _reject(where, "tasks", "a task is listed twice")
    if not spec.response_variables:
        raise _reject(where, "response_variables", "none; name at least one of " + ", ".join(RESPONSE_VARIABLES))
    unknown = [v for v in spec.response_variables if v not in RESPONSE_VARIABLES]
    if unknown:
        raise _reject(where, "response_variables", f"unknown {', '.join(unknown)} (known: "
                      f"{', '.join(RESPONSE_VARIABLES)})")
    _check_pairs(spec, where)
    _check_falsify(spec, where)
    return spec


def parse_spec(data: Mapping[str, Any], where: str = "spec") -> ExperimentSpec:
    """A spec from its decoded mapping (either shape), validated."""
    if not isinstance(data, Mapping):
        raise SpecRejected(f"{where}: the spec must be a mapping, not {type(data).__name__}")
    try:
        spec = msgspec.convert(_normalise(data, where), ExperimentSpec)
    except msgspec.ValidationError as exc:
        raise SpecRejected(f"{where}: {exc}") from exc
    return check_spec(spec, where)


def read_spec_file(path: Path) -> Any:
    """The decoded content of a YAML, TOML or JSON spec file."""
    return read_document(path, "spec", SpecRejected)


def load_spec(path: str | Path) -> ExperimentSpec:
    """Load and validate a spec file; raises SpecRejected naming the file and the field."""
    path = Path(path)
    return parse_spec(read_spec_file(path), where=str(path))


def spec_to_dict(spec: ExperimentSpec) -> dict[str, Any]:
    """A spec as plain data (what ExperimentStarted carries and a spec file holds)."""
    data: dict[str, Any] = msgspec.to_builtins(spec)
    return data


def factor_of(spec: ExperimentSpec, name: str) -> Factor:
    """The factor with this name."""
    for factor in spec.factors:
        if factor.name == name:
            return factor
    raise SpecRejected(f"spec: factors: no factor {name!r}")


__all__ = [
    "RESPONSE_VARIABLES", "ExperimentSpec", "Factor", "MutableScope", "artifact_of", "cell_name", "cells",
    "check_spec", "factor_of", "level_names", "load_spec", "mixed_of", "parse_spec", "read_spec_file", "spec_digest",
    "spec_schema", "spec_to_dict",
]
