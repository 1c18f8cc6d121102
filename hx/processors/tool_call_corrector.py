"""D4 ``tool_call_corrector``: repair near-miss tool inputs against the tool's input schema.

Failure addressed: invalid actions. LLM agents on text games and APIs often send an
input that is almost right: ``"Go North "`` where the schema's enum says
``"go north"``, ``"tak key"`` for ``"take key"``, ``"3"`` for an integer, ``Command``
for ``command``. The environment rejects the action and a step is lost (often many,
as the model repeats it). Before a tool runs, this processor, for each property of
the tool's JSON Schema:

- renames an unknown key to the property it nearly matches (case, ``-``/space for
  ``_``, or a close spelling), when that property is not already given;
- strips surrounding whitespace from strings;
- maps a string not in the property's ``enum`` to the enum value equal up to case and
  spacing, else to the closest by ``difflib`` ratio at or above ``enum_cutoff``;
- converts a string to the property's ``integer``, ``number`` or ``boolean`` type when
  it parses as one.

A call naming a tool not offered at this step (``BeforeTool.offered``) is renamed to
the offered tool it nearly names, by the same case and spacing rule and cutoff as enum
values (``Act`` or ``act `` for ``act``), before its input is corrected.

The schemas are learnt from the tools offered, at task_start and again at every
before_model (both passed through unchanged): a text game's ``act`` tool enumerates the
actions valid now, so its enum changes every step, and a correction against the first
step's enum would map a call onto an action that is no longer valid. Attach to
``["task_start", "before_model", "before_tool"]`` (task_start alone serves tools whose
schemas never change). A call to a tool nothing offered resembles, or with an input
nothing can repair, passes unchanged.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import msgspec

from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import selected
from schemas.hooks import BeforeModel, BeforeTool, TaskStart

_MISSING = object()


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _key_norm(text: str) -> str:
    return re.sub(r"[\s\-]+", "_", text.strip()).casefold()


def closest_enum(value: str, options: list[str], cutoff: float) -> str | None:
    """The enum value ``value`` nearly names, or ``None``."""
    norm = _norm(value)
    for option in options:
        if _norm(option) == norm:
            return option
    by_norm = {_norm(o): o for o in options}
    match = difflib.get_close_matches(norm, list(by_norm), n=1, cutoff=cutoff)
    return by_norm[match[0]] if match else None


def coerce(value: str, kind: str) -> Any:
    """``value`` converted to the JSON Schema ``kind``, or ``_MISSING`` when it does not parse."""
    text = value.strip()
    if kind == "integer" and re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if kind == "number" and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        number = float(text)
        return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
    if kind == "boolean" and text.casefold() in ("true", "false"):
        return text.casefold() == "true"
    return _MISSING


class ToolCallCorrector(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Repair tool inputs against the schemas of the tools offered at this step."""

    name: ClassVar[str] = "tool_call_corrector"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D4"
    addresses: ClassVar[tuple[str, ...]] = ("invalid_action",)

    enum_cutoff: float = 0.75
    """Smallest ``difflib`` similarity (0..1) at which a value is mapped to an enum value."""
    strip: bool = True
    """Strip surrounding whitespace from string values."""
    fix_keys: bool = True
    """Rename unknown keys that nearly match a schema property."""
    coerce_types: bool = True
    """Convert strings to the property's integer, number or boolean type."""
    fix_names: bool = True
    """Rename a call to a tool not offered at this step to the offered tool it nearly names."""
    tools: tuple[str, ...] = ()
    """Tool name globs to correct; empty means every tool."""

    def __post_init__(self) -> None:
        if not 0.0 < self.enum_cutoff <= 1.0:
            raise ValueError("enum_cutoff must be within (0, 1]")
        self._schemas: dict[str, dict[str, Any]] = {}

    def learn(self, event: TaskStart | BeforeModel) -> None:
        """Remember the input schema of each tool offered now."""
        self._schemas = {t.name: t.input_schema for t in event.tools}

    def _rename_keys(self, given: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
        out = dict(given)
        for key in list(given):
            if key in props:
                continue
            free = [p for p in props if p not in out]
            target = next((p for p in free if _key_norm(p) == _key_norm(key)), None)
            if target is None:
                close = difflib.get_close_matches(_key_norm(key), [_key_norm(p) for p in free], n=1, cutoff=0.8)
                target = next((p for p in free if close and _key_norm(p) == close[0]), None)
            if target is not None:
                out[target] = out.pop(key)
        return out

    def _value(self, value: Any, prop: Any) -> Any:
        if not isinstance(value, str) or not isinstance(prop, dict):
            return value.strip() if isinstance(value, str) and self.strip else value
        if self.strip:
            value = value.strip()
        enum = prop.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(o, str) for o in enum) and value not in enum:
            return closest_enum(value, enum, self.enum_cutoff) or value
        kind = prop.get("type")
        if self.coerce_types and isinstance(kind, str):
            coerced = coerce(value, kind)
            if coerced is not _MISSING:
                return coerced
        return value

    def correct(self, name: str, given: dict[str, Any]) -> dict[str, Any]:
        """The corrected input of a call to tool ``name`` (equal to ``given`` when nothing applies)."""
        schema = self._schemas.get(name)
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict):
            props = {}
        out = self._rename_keys(given, props) if self.fix_keys and props else dict(given)
        return {key: self._value(value, props.get(key)) for key, value in out.items()}

    async def process(self, event: TaskStart | BeforeModel | BeforeTool
                      ) -> AsyncIterator[TaskStart | BeforeModel | BeforeTool]:
        """Learn schemas at task_start and before_model; correct the call's tool name and input at before_tool."""
        if isinstance(event, TaskStart | BeforeModel):
            self.learn(event)
            yield event
            return
        name = event.call.name
        if self.fix_names and event.offered and name not in event.offered:
            name = closest_enum(name, list(event.offered), self.enum_cutoff) or name
        if not selected(name, self.tools):
            yield event
            return
        fixed = self.correct(name, event.call.input)
        if fixed == event.call.input and name == event.call.name:
            yield event
            return
        yield msgspec.structs.replace(event, call=msgspec.structs.replace(event.call, name=name, input=fixed))
