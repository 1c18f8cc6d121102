"""What kind of edit an operation is: its bucket, behavioural dimensions and risk, read off the operations.

A candidate is a tuple of operations (``schemas.edits``) applied to its variant's harness by
``hx.harness.edits.apply``. The bucket (prompt, tools, config, processor), the behavioural
dimensions and a risk score are read off the operations, never claimed by the evolver.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from hx.harness.processor import processor_type
from schemas.edits import AddRule, AnyEditOp, Attach, Bucket, DropRule, Reparam, Replace

PROMPT_DIMENSION = "D2"
TOOL_DIMENSION = "D4"
RISK: dict[str, float] = {"attach": 0.1, "add_rule": 0.1, "reparam": 0.2, "drop_rule": 0.3, "replace": 0.4,
                          "remove": 0.5}
"""Risk of an operation kind; new code adds ``CODE_RISK``. A candidate's risk is its largest."""
CODE_RISK = 0.8
PROMPT_GROUPS = frozenset({"system_prompt_template", "task_notes"})
"""Singleton groups whose parameters are prompt text: editing them is a prompt edit."""


def _group_of(op: AnyEditOp) -> str:
    if isinstance(op, Attach):
        try:
            return processor_type(op.processor).group()
        except (CompositionError, ImportError):
            # Not (yet) importable: new code before the sandbox built it, or a name that never
            # existed (the build error says which). A processor's group defaults to its name.
            return op.processor
    return op.group


def bucket_of(op: AnyEditOp) -> Bucket:
    """The kind of edit: prompt text, the tool offer, a parameter change, or the processor set."""
    group = _group_of(op)
    if group in PROMPT_GROUPS:
        return "prompt"
    if isinstance(op, Reparam | AddRule | DropRule):
        return "config"  # a rule is data the interpreter reads: a change of its program, not new processor code
    kind = op.processor if isinstance(op, Attach | Replace) else None
    dimension = _dimension(kind) if kind else ""
    return "tools" if dimension == TOOL_DIMENSION and group.startswith("tool_") else "processor"


def buckets_of(operations: Iterable[AnyEditOp]) -> tuple[Bucket, ...]:
    """The buckets of a candidate's operations, each once, in order of first appearance."""
    return tuple(dict.fromkeys(bucket_of(op) for op in operations))


def dimensions_of(operations: Iterable[AnyEditOp], base: HarnessConfig) -> tuple[str, ...]:
    """The behavioural dimensions (D1..D9) the operations touch."""
    dims: list[str] = []
    for op in operations:
        if isinstance(op, Attach | Replace):
            dims.append(_dimension(op.processor))
        elif isinstance(op, AddRule | DropRule):
            dims.append(_dimension(op.group))  # the interpreter's, whether or not the harness holds it yet
        else:
            current = next((a for a in base.attachments if a.group() == op.group), None)
            if current is not None:
                dims.append(_dimension(current.type))
    return tuple(dict.fromkeys(d for d in dims if d))


def _dimension(processor: str) -> str:
    try:
        return processor_type(processor).dimension
    except (CompositionError, ImportError):
        return ""


def risk_of(operations: Iterable[AnyEditOp], *, new_code: bool = False) -> float:
    """The candidate's risk: its riskiest operation, or new code."""
    kinds = [RISK[str(type(op).__struct_config__.tag)] for op in operations]
    return max([*kinds, CODE_RISK if new_code else 0.0], default=0.0)


def strings_in(value: Any) -> list[str]:
    """Every string inside an operation's parameters (what the leakage scan reads)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings_in(k), *strings_in(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings_in(v)]
    return []
