"""Edit operations applied to a harness: the ledger's typed edits (``schemas.edits``) through the builder algebra.

A candidate, a ship and a fork are tuples of operations (attach, replace, remove, reparam, and
add_rule / drop_rule on the rule interpreter's program)
applied in order to a variant's harness with ``HarnessConfig``'s own builder operations, so
every edit type-checks exactly as a hand-built harness does: an unknown processor, a wrong
hook, a duplicate group is a ``CompositionError`` naming the failing operation. What kind of
edit an operation is (its bucket, dimensions, risk) is the evolver's business
(``hx.aegis.operations``); applying and naming one is every reader's.

>>> from schemas.edits import Remove
>>> describe(Remove(group="history_window"))
'remove history_window'
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from hx.harness.processor import build
from schemas.edits import AddRule, AnyEditOp, Attach, DropRule, Remove, Replace
from schemas.event import JsonObject
from schemas.rules import Rule, sentence


def apply(base: HarnessConfig, operations: Sequence[AnyEditOp]) -> HarnessConfig:
    """The harness ``operations`` make of ``base`` (validated); ``CompositionError`` names the failing one."""
    config = base
    for i, op in enumerate(operations):
        try:
            config = _apply_one(config, op)
        except CompositionError as exc:
            raise CompositionError(f"operation {i + 1} ({describe(op)}): {exc}") from None
    return config.validate()


def _apply_one(config: HarnessConfig, op: AnyEditOp) -> HarnessConfig:
    if isinstance(op, Attach):
        return config.attach(op.hooks, build(op.processor, dict(op.params)))
    if isinstance(op, Replace):
        return config.replace(op.group, build(op.processor, dict(op.params)))
    if isinstance(op, Remove):
        return config.remove(op.group)
    if isinstance(op, AddRule | DropRule):
        return _edit_program(config, op)
    current = next((a for a in config.attachments if a.group() == op.group), None)
    if current is None:
        raise CompositionError(f"no processor in singleton group {op.group!r} to re-parameterise")
    params: JsonObject = {**current.params, **op.params}
    return config.replace(op.group, build(current.type, params))


def program_of(config: HarnessConfig, group: str) -> tuple[Rule, ...]:
    """The rules the harness's interpreter in ``group`` holds (empty when it has none)."""
    current = next((a for a in config.attachments if a.group() == group), None)
    if current is None:
        return ()
    rules = getattr(current.build(), "rules", ())
    return tuple(rules)


def _edit_program(config: HarnessConfig, op: AddRule | DropRule) -> HarnessConfig:
    rules = program_of(config, op.group)
    present = any(a.group() == op.group for a in config.attachments)
    if isinstance(op, AddRule):
        if op.rule in rules:
            raise CompositionError(f"the rule program already holds this rule: {sentence(op.rule)}")
        new = (*rules, op.rule)
    else:
        if op.rule not in rules:
            raise CompositionError(f"the rule program holds no such rule: {sentence(op.rule)}")
        new = tuple(r for r in rules if r != op.rule)
    if not new:
        return config.remove(op.group)
    params: JsonObject = {"rules": msgspec.to_builtins(new)}
    if present:
        current = next(a for a in config.attachments if a.group() == op.group)
        return config.replace(op.group, build(current.type, params))
    processor = build(op.group, params)
    return config.attach(type(processor).accepted_hooks(), processor)


def describe(op: AnyEditOp) -> str:
    """One line naming what an operation does."""
    if isinstance(op, Attach):
        return f"attach {op.processor} at {'+'.join(op.hooks)}"
    if isinstance(op, Replace):
        return f"replace {op.group} with {op.processor}"
    if isinstance(op, Remove):
        return f"remove {op.group}"
    if isinstance(op, AddRule):
        return f"add rule: {sentence(op.rule, op.support)}"
    if isinstance(op, DropRule):
        return f"drop rule: {sentence(op.rule)}"
    return f"re-parameterise {op.group} ({', '.join(sorted(op.params))})"
