"""Criteria: pure functions of a finished attempt's output, ``output -> (passed, detail)``, registered by name.

A criterion kind is registered with ``@criterion(name, Params)``: ``Params`` is a msgspec Struct
of its parameters (checked when a suite is loaded, so a wrong parameter is an error naming the
suite task, never a failed attempt), and the decorated function builds the check from them. A
suite names criteria as ``{"name": ..., "params": {...}}``; ``build`` turns one into a ``Check``.

``judge`` runs a check: a check that raises is a failed criterion whose detail is the error,
never a crashed suite.

>>> check = build("steps_at_most", {"steps": 10}, where="suite task 'coin'")
>>> judge(check, AttemptOutput("r", 0, "twx:coin:dev:0", 0, steps=12))
(False, '12 steps (need <= 10)')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from hx.eval.errors import EvalError, UnknownCriterion
from projections.attempt_outputs import AttemptOutput

Check = Callable[[AttemptOutput], tuple[bool, str]]
P = TypeVar("P", bound=msgspec.Struct)
Builder = Callable[[P], Check]


class NoParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A criterion that takes no parameters."""


@dataclass(frozen=True)
class CriterionKind:
    """A registered criterion: its name, what it checks, its parameters' type and how a check is built."""

    name: str
    doc: str
    params: type[msgspec.Struct]
    make: Callable[[Any], Check]
    document: bool
    """True when it reads the output as a document (it needs a task whose output is one)."""


CRITERIA: dict[str, CriterionKind] = {}
"""Every criterion kind by name."""


def criterion(name: str, params: type[P], *, document: bool = False) -> Callable[[Builder[P]], Builder[P]]:
    """Register the decorated builder ``params -> Check`` as criterion ``name``; its docstring says what it checks."""
    def register(make: Builder[P]) -> Builder[P]:
        if name in CRITERIA:
            raise EvalError(f"criterion {name!r} is registered twice")
        doc = (make.__doc__ or "").strip().splitlines()[0] if make.__doc__ else ""
        CRITERIA[name] = CriterionKind(name, doc, params, make, document)
        return make
    return register


def build(name: str, params: Mapping[str, Any] | None = None, *, where: str) -> Check:
    """The check of criterion ``name`` with ``params``; an unknown name or bad parameter names ``where``."""
    kind = CRITERIA.get(name)
    if kind is None:
        known = ", ".join(sorted(CRITERIA))
        raise UnknownCriterion(f"{where}: unknown criterion {name!r}; known: {known}")
    try:
        value = msgspec.convert(dict(params or {}), kind.params)
    except msgspec.ValidationError as exc:
        raise EvalError(f"{where}: criterion {name!r}: {exc}") from None
    return kind.make(value)


def judge(check: Check, output: AttemptOutput) -> tuple[bool, str]:
    """Run one check; a check that raises fails with the error as its detail."""
    try:
        passed, detail = check(output)
    except Exception as exc:  # noqa: BLE001 - a broken criterion fails, it never crashes the suite
        return False, f"criterion raised {type(exc).__name__}: {exc}"
    return bool(passed), str(detail)


# --- the agent's verdict and effort ---------------------------------------------------------


@criterion("task_verdict", NoParams)
def task_verdict(_: NoParams) -> Check:
    """The task's own verifier passed the attempt."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.passed, f"verifier {'passed' if out.passed else 'failed'} ({out.status or 'unfinished'})"
    return check


class Steps(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A step count."""

    steps: int


@criterion("steps_at_most", Steps)
def steps_at_most(p: Steps) -> Check:
    """The attempt took at most ``steps`` steps."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        return out.steps <= p.steps, f"{out.steps} steps (need <= {p.steps})"
    return check


class Size(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A size in bytes or lines."""

    n: int


@criterion("min_bytes", Size, document=True)
def min_bytes(p: Size) -> Check:
    """The output text is at least ``n`` bytes of UTF-8."""
    def check(out: AttemptOutput) -> tuple[bool, str]:
        size = len(out.text.encode())
        return size >= p.n, f"{size} bytes (need >= {p.n})"
    return check
