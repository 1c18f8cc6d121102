"""Controlled experiments: the spec a researcher commits before the arms run, and what the runner concludes.

An ``ExperimentSpec`` names one factor (or, in a full factorial, several), each with its levels
and exactly one ``MutableScope``: the one thing its levels change. Everything else
(``controlled_variables``: model, harness, step budget, stop rule, options) is the same in
every arm. The runner plays every (task, level, replication) unit in a seeded random order,
each an attempt on the log under the experiment's run, and concludes per level and effect with
intervals (``hx.intervals``) and a falsification verdict.

The experiment's own events are run-level, on ``hx.trace.<experiment run>._._._``.
"""

from __future__ import annotations

from typing import Literal

from schemas.evaluation import Bounds
from schemas.event import Event, JsonObject, Payload

ScopeKind = Literal["processor_param", "processor", "model", "env", "procedure"]
Falsification = Literal["falsified", "not_falsified", "undecided"]
Design = Literal["crd", "factorial"]


class MutableScope(Payload, frozen=True, kw_only=True):
    """The one thing a factor's levels change, and the value it takes at each level."""

    kind: ScopeKind
    target: str
    """What changes: ``processor_param``: ``<processor name>.<parameter>``; ``processor``: a processor name (its
    config in ``config``), attached or not; ``model``: a model role (``main``); ``env``: an environment
    variable; ``procedure``: ``evolve`` or ``coevolve``, whose product (a harness, a policy) the level plays."""
    levels: JsonObject
    """Level name to the value the target takes at that level. A ``procedure`` level's value is the procedure's
    options (its budget) or null (none: the controlled harness and model); any level's value may be
    ``{"artifact_of": "<level>"}``, the product of that level's procedure."""
    config: JsonObject = {}
    """For ``processor``: the processor's config when attached."""


class Factor(Payload, frozen=True, kw_only=True):
    """A factor: its name, its levels (the first is the reference), and the scope they change."""

    name: str
    levels: tuple[str, ...]
    scope: MutableScope


class ExperimentSpec(Payload, frozen=True, kw_only=True):
    """A completely randomised experiment, committed before its arms run."""

    title: str
    hypothesis: str
    falsified_if: str
    """A machine-checkable expression over the response variables (``hx.experiment.spec``), e.g.
    ``diff_high(passed, "on", "off") <= 0``: true when the data refute the hypothesis."""
    factors: tuple[Factor, ...]
    """One factor; two or more make a full factorial, every combination of levels run."""
    tasks: tuple[str, ...]
    """Task ids (``twx:coin:dev:3``), each played in every cell ``replications`` times."""
    replications: int
    response_variables: tuple[str, ...]
    controlled_variables: JsonObject = {}
    """The same in every arm: model, harness (a file, relative to the spec), max_steps, timeout_s, ..."""
    seed: int = 42
    """Seeds the run order and the attempts."""
    design: Design = "crd"
    """``crd``: one factor, completely randomised; ``factorial``: two or more factors, every combination run
    (the one declared exception to one thing changed per spec)."""
    procedure_seeds: tuple[int, ...] = ()
    """Each procedure level is made once per seed (an independent evolution each); replication ``r`` of a unit
    plays the product of seed ``procedure_seeds[r % S]``, and every interval resamples tasks and seeds. Empty:
    one product per level, made with ``seed``."""
    comparisons: tuple[tuple[str, str], ...] = ()
    """More paired effects than each level against the first: ``[level, reference]`` pairs of one factor."""
    interactions: tuple[tuple[str, str, str, str], ...] = ()
    """2x2 contrasts over four levels of one factor, ``[a0b0, a1b0, a0b1, a1b1]``: (a1b1 - a0b1) - (a1b0 - a0b0)."""
    per_game: bool = False
    """Also conclude every effect per game (``<variable> <bench:game>``), beside the figure over all tasks."""
    claim: str = ""
    """The claim the spec judges, if any: its test-split tasks may be no other claim's, nor a spent range."""
    expected_wall_s: int = 0
    """The wall time the spec's author expects, in seconds (what a long run's progress is measured against)."""


class LevelSummary(Payload, frozen=True, kw_only=True):
    """One response variable at one level (or, in a factorial, one cell): its mean and interval."""

    variable: str
    level: str
    """The level's name; in a factorial, the cell, ``factor=level,factor=level``."""
    n: int
    """Units measured."""
    mean: Bounds


class EffectSummary(Payload, frozen=True, kw_only=True):
    """A level against the reference level on one response variable: the paired difference and its size."""

    variable: str
    factor: str
    level: str
    reference: str
    difference: Bounds
    """Level minus reference, paired over tasks, tasks and replications resampled."""
    effect_size: Bounds
    """The difference over the pooled spread of the units (a standardised mean difference)."""
    verdict: Literal["keep", "discard", "inconclusive"]


class InteractionSummary(Payload, frozen=True, kw_only=True):
    """In a 2-level x 2-level factorial: how much one factor's effect changes with the other's level."""

    variable: str
    factors: tuple[str, str]
    contrast: Bounds
    """(b1 - b0 at a1) - (b1 - b0 at a0), tasks and replications resampled."""


class ExperimentStarted(Event, frozen=True, kw_only=True):
    """An experiment's run began: its spec as committed and the seeded order its units run in."""

    TYPE = "experiment.started"
    LEVEL = "run"

    run_id: str
    spec: JsonObject
    spec_digest: str
    order: tuple[str, ...] = ()
    """Unit keys (``task|cell|replication``) in the order they run."""


class ExperimentConcluded(Event, frozen=True, kw_only=True):
    """What the experiment's data show: per level, per effect, per interaction, and the falsification verdict."""

    TYPE = "experiment.concluded"
    LEVEL = "run"

    run_id: str
    spec_digest: str
    units: int
    levels: tuple[LevelSummary, ...] = ()
    effects: tuple[EffectSummary, ...] = ()
    interactions: tuple[InteractionSummary, ...] = ()
    falsified: Falsification = "undecided"
    detail: str = ""
    """The falsified_if expression with its values filled in, or why it could not be decided."""
