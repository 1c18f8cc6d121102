"""The falsified_if language: a small, safe expression over an experiment's conclusion.

Parsed with ``ast`` against a whitelist and walked by hand; never ``eval``. It has numbers,
strings (level names), comparisons, ``and``/``or``/``not``, ``+ - * /`` and these functions:

- ``mean(var, level)``, ``low(var, level)``, ``high(var, level)``: a level's (or cell's) mean and interval;
- ``diff(var, level, ref)``, ``diff_low(...)``, ``diff_high(...)``: the paired difference level - ref;
- ``effect(var, level, ref)``: the standardised effect size of level against ref.

A response variable may be written bare (``passed``) or quoted; a level is always quoted.

>>> expr = parse('diff_high(passed, "on", "off") <= 0')
>>> sorted(expr.variables), sorted(expr.levels)
(['passed'], ['off', 'on'])
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from hx.experiment.errors import FalsifyUnparsed
from schemas.evaluation import Bounds

# name -> number of arguments (variable first, then levels)
FUNCTIONS: dict[str, int] = {
    "mean": 2, "low": 2, "high": 2,
    "diff": 3, "diff_low": 3, "diff_high": 3, "effect": 3,
}

_COMPARE: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Eq: operator.eq, ast.NotEq: operator.ne,
}
_ARITH: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}


class _Undecidable(Exception):
    """A value the expression needs is not in the conclusion (or a division by zero)."""


class Results(Protocol):
    """What an expression is evaluated against: level means and level-vs-reference effects."""

    def level_mean(self, variable: str, level: str) -> Bounds | None:
        """The mean of ``variable`` at ``level`` (a level or a cell), or None when not measured."""
        ...

    def effect(self, variable: str, level: str, reference: str) -> tuple[Bounds, Bounds] | None:
        """(difference, effect size) of ``level`` minus ``reference``, or None when not measured."""
        ...


@dataclass(frozen=True)
class Expression:
    """A parsed falsified_if: its tree, and the response variables and levels it names."""

    source: str
    tree: ast.expr
    variables: frozenset[str] = field(default_factory=frozenset)
    levels: frozenset[str] = field(default_factory=frozenset)
    pairs: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    """(level, ref) pairs the diff/effect functions compare."""


def _argument(node: ast.expr, what: str, *, bare: bool) -> str:
    """A function argument as a string: a string literal, or (for a variable) a bare name."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if bare and isinstance(node, ast.Name):
        return node.id
    raise FalsifyUnparsed(f"{what} must be {'a name or ' if bare else ''}a quoted string, "
                            f"not {ast.unparse(node)!r}")


def _check(node: ast.AST, variables: set[str], levels: set[str], pairs: set[tuple[str, str]]) -> None:
    """Walk the tree, rejecting anything outside the whitelist and collecting names."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, variables, levels, pairs)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        _check(node.operand, variables, levels, pairs)
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        _check(node.left, variables, levels, pairs)
        _check(node.right, variables, levels, pairs)
    elif isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        for part in (node.left, *node.comparators):
            _check(part, variables, levels, pairs)
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return
    elif isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if name not in FUNCTIONS:
            raise FalsifyUnparsed(f"unknown function {name!r} (known: {', '.join(FUNCTIONS)})")
        if node.keywords or len(node.args) != FUNCTIONS[name]:
            raise FalsifyUnparsed(f"{name}() takes {FUNCTIONS[name]} positional arguments")
        variables.add(_argument(node.args[0], f"{name}()'s response variable", bare=True))
        named = [_argument(arg, f"{name}()'s level", bare=False) for arg in node.args[1:]]
        levels.update(named)
        if len(named) == 2:
            pairs.add((named[0], named[1]))
    elif isinstance(node, ast.Name):
        raise FalsifyUnparsed(f"unknown name {node.id!r} (a response variable goes inside a function)")
    else:
        raise FalsifyUnparsed(f"{ast.unparse(node)!r} is not allowed")


def parse(source: str) -> Expression:
    """Parse a falsified_if; raises FalsifyUnparsed naming what is outside the language."""
    if not source.strip():
        raise FalsifyUnparsed("it is empty")
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FalsifyUnparsed(f"syntax error: {exc.msg}") from exc
    variables: set[str] = set()
    levels: set[str] = set()
    pairs: set[tuple[str, str]] = set()
    _check(tree, variables, levels, pairs)
    if not isinstance(tree, (ast.Compare, ast.BoolOp)) and not (
            isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not)):
        raise FalsifyUnparsed("it must be a comparison (true when the data refute the hypothesis)")
    return Expression(source.strip(), tree, frozenset(variables), frozenset(levels), frozenset(pairs))


def _call(node: ast.Call, results: Results) -> float:
    """The value of one function call over the results."""
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    variable = _argument(node.args[0], "variable", bare=True)
    named = [_argument(arg, "level", bare=False) for arg in node.args[1:]]
    if len(named) == 1:
        mean = results.level_mean(variable, named[0])
        if mean is None:
            raise _Undecidable(f"no {variable} at level {named[0]!r}")
        return {"mean": mean.estimate, "low": mean.low, "high": mean.high}[name]
    level, reference = named
    found = results.effect(variable, level, reference)
    sign = 1.0
    if found is None:
        # the reverse comparison is the same data with the sign (and the interval's ends) swapped
        found = results.effect(variable, reference, level)
        sign = -1.0
    if found is None:
        raise _Undecidable(f"no effect of {level!r} against {reference!r} on {variable}")
    difference, size = found
    if name == "effect":
        return sign * size.estimate
    if name == "diff":
        return sign * difference.estimate
    if name == "diff_low":
        return difference.low if sign > 0 else -difference.high
    return difference.high if sign > 0 else -difference.low


def _value(node: ast.expr, results: Results, filled: Mapping[int, float]) -> float | bool:
    """Evaluate a checked tree; ``filled`` maps call nodes to their values."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.Call):
        return filled[id(node)]
    if isinstance(node, ast.BoolOp):
        values = [bool(_value(v, results, filled)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        operand = _value(node.operand, results, filled)
        if isinstance(node.op, ast.Not):
            return not operand
        return -float(operand) if isinstance(node.op, ast.USub) else float(operand)
    if isinstance(node, ast.BinOp):
        left, right = float(_value(node.left, results, filled)), float(_value(node.right, results, filled))
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Undecidable("division by zero")
        return _ARITH[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        parts = [float(_value(p, results, filled)) for p in (node.left, *node.comparators)]
        return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, parts, parts[1:], strict=False))
    raise _Undecidable(f"{ast.unparse(node)!r} cannot be evaluated")  # unreachable after parse()


class _Fill(ast.NodeTransformer):
    """Replace each function call with its value, for the detail line."""

    def __init__(self, filled: Mapping[int, float]) -> None:
        self.filled = filled

    def visit_Call(self, node: ast.Call) -> ast.AST:
        """The call's value as a constant, rounded for reading."""
        return ast.Constant(round(self.filled[id(node)], 4))


def evaluate(expression: Expression, results: Results) -> tuple[bool | None, str]:
    """(True/False, the expression with its values) or (None, why it cannot be decided)."""
    # a fresh tree each time: the filled values are keyed by node identity and the tree is rewritten below
    tree = ast.parse(expression.source, mode="eval")
    filled: dict[int, float] = {}
    try:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                filled[id(node)] = _call(node, results)
        verdict = bool(_value(tree.body, results, filled))
    except _Undecidable as exc:
        return None, f"{expression.source}: undecided, {exc}"
    shown = ast.unparse(_Fill(filled).visit(tree))
    return verdict, f"{expression.source}: {shown} is {verdict}"
