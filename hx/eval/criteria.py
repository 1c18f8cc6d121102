"""Criteria: pure functions of a finished attempt's output, ``output -> (passed, detail)``, registered by name.

A criterion kind is registered with ``@criterion(name, Params)``: ``Params`` is a msgspec Struct
of its parameters (checked when a suite is loaded, so a wrong parameter is an error naming the
suite task, never a failed attempt), and the decorated function builds the check from them. A
suite names criteria as ``{"name": ..., "params": {...}}``; ``build`` turns one into a ``Check``.

``judge`` runs a check: a check that raises is a failed criterion whose detail is the error,
never a crashed suite.

>>> check = build("steps_at_most", {"steps": 10}, where="suite task 'a'")
>>> judge(check, AttemptOutput("r", 0, "bench:game:dev:0", 0, steps=12))
(False, '12 steps (need <= 10)')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from hx.eval.errors import EvalError, UnknownCriterion
from projections.attempt_outputs import AttemptOutput

Check = Callable[[AttemptOutput], tuple[bool, str]]
ERROR_MAX = 500
"""Characters of a raising check's error kept in its detail."""
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
    if params is not None and not isinstance(params, Mapping):
        raise EvalError(f"{where}: criterion {name!r}: params must be a mapping of names to values, "
                        f"not {type(params).__name__}")
    try:
        value = msgspec.convert(dict(params or {}), kind.params)
        # A builder settles its parameters once (a regex compiled, a label list checked) and rejects bad ones here.
        return kind.make(value)
    except (msgspec.ValidationError, EvalError) as exc:
        raise EvalError(f"{where}: criterion {name!r}: {exc}") from None


def judge(check: Check, output: AttemptOutput) -> tuple[bool, str]:
    """Run one check; a check that raises fails with the error as its detail."""
    try:
        passed, detail = check(output)
    except Exception as exc:  # noqa: BLE001 - a broken criterion fails, it never crashes the suite
        error = str(exc)
        cut = error if len(error) <= ERROR_MAX else error[:ERROR_MAX - 3] + "..."
        return False, f"criterion raised {type(exc).__name__}: {cut}"
    return bool(passed), str(detail)


# --- helpers the built-in kinds share --------------------------------------------------------

REGEX_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}
"""The flag letters a pattern parameter takes: ignore case, ^/$ at every line, . matches newlines, verbose."""
SHOWN_MAX = 80
"""Characters of an output quoted in a detail."""


def compile_pattern(pattern: str, flags: str = "", *, param: str = "pattern") -> re.Pattern[str]:
    """``pattern`` compiled with the ``flags`` letters; a bad regex or flag is an ``EvalError`` naming ``param``."""
    value = 0
    for letter in flags:
        if letter not in REGEX_FLAGS:
            raise EvalError(f"flags {flags!r}: unknown flag {letter!r} (known: {''.join(REGEX_FLAGS)})")
        value |= REGEX_FLAGS[letter]
    try:
        return re.compile(pattern, value)
    except re.error as exc:
        raise EvalError(f"{param} {pattern!r} is not a regular expression: {exc}") from None


def shown(text: str, limit: int = SHOWN_MAX) -> str:
    """``text`` quoted for a detail, on one line, cut at ``limit`` characters."""
    head = text[:limit * 4]  # a long output is not flattened whole for a few words of detail
    flat = " ".join(head.split())
    return repr(flat if len(flat) <= limit and len(head) == len(text) else flat[:limit - 3] + "...")


def listed(items: Iterable[str], limit: int = 8) -> str:
    """Items quoted and comma-separated for a detail; past ``limit``, how many more."""
    items = list(items)
    head = ", ".join(shown(i, 40) for i in items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


# The built-in kinds register on import; they import this module's names, defined above.
from hx.eval import criteria_agent, criteria_documents  # noqa: E402,F401  (registration)
