"""The completely randomised design: every (task, cell, replication) unit, in a seeded random order.

A cell is one level of the factor (or, in a full factorial, one combination of levels).
Each unit is one attempt on the log: round = the cell's index, task = the task id,
attempt = the replication (a unit retried after an interruption gets attempt
``replication + k * replications``, a fresh subject, and the same agent seed).

>>> from hx.experiment.spec import parse_spec
>>> spec = parse_spec({"title": "t", "hypothesis": "h", "falsified_if": 'mean(passed, "on") < 0.5',
...     "factors": [{"name": "f", "levels": ["off", "on"], "scope": {"kind": "env", "target": "X",
...     "levels": {"off": "", "on": "1"}}}], "tasks": ["bench:game:dev:0"], "replications": 2,
...     "response_variables": ["passed"]})
>>> [u.key for u in units(spec)] == [u.key for u in units(spec)]
True
>>> len(units(spec))
4
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hx.experiment.spec import cell_name, cells
from schemas.experiment import ExperimentSpec


@dataclass(frozen=True)
class Cell:
    """One arm: its index (the round it plays in), its name and the level of each factor."""

    index: int
    name: str
    levels: tuple[tuple[str, str], ...]
    """(factor, level) in the spec's factor order."""

    def level(self, factor: str) -> str:
        """This cell's level of ``factor``."""
        return dict(self.levels)[factor]


@dataclass(frozen=True)
class Unit:
    """One attempt of the design: a task played in a cell, the n-th time."""

    task: str
    cell: Cell
    replication: int

    @property
    def key(self) -> str:
        """``task|cell|replication``, as ExperimentStarted's order lists it."""
        return f"{self.task}|{self.cell.name}|{self.replication}"


def design_cells(spec: ExperimentSpec) -> list[Cell]:
    """The spec's cells, the reference cell (every factor at its first level) first.

    With one factor a cell is named by its level (``on``); in a factorial, ``a=x,b=y``.
    """
    out = []
    for index, combo in enumerate(cells(spec)):
        name = cell_name(combo) if len(spec.factors) > 1 else next(iter(combo.values()))
        out.append(Cell(index, name, tuple(combo.items())))
    return out


def units(spec: ExperimentSpec) -> list[Unit]:
    """Every unit in run order: all (task, cell, replication) shuffled by ``random.Random(spec.seed)``."""
    every = [Unit(task, cell, rep) for task in spec.tasks for cell in design_cells(spec)
             for rep in range(spec.replications)]
    random.Random(spec.seed).shuffle(every)
    return every


def attempt_number(unit: Unit, tries: int, replications: int) -> int:
    """The attempt number of a unit's ``tries``-th try (0 first): a retry never reuses a subject."""
    return unit.replication + tries * replications


def replication_of(attempt: int, replications: int) -> int:
    """The replication an attempt number plays."""
    return attempt % replications
