"""HarnessConfig: the harness as an immutable, comparable, serialisable value.

A config is a list of attachments (processor type, parameters, hooks) in attach order,
plus the slots its processors share. Builder operations return new configs. Each
hook's pipeline is resolved by ``_order``, then ``_after``, then attach order; the
content ``digest`` is taken over the resolved pipelines, so two configs that run the
same processors in the same order are equal and name the same harness version.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import tomli_w
import yaml

from hx.harness.errors import CompositionError
from hx.harness.ordering import check_dependencies, resolve_order
from hx.harness.processor import Processor, build, processor_type
from schemas.harness import HarnessSpec, ProcessorSpec, Slots
from schemas.hooks import HOOK_NAMES, HookName

__all__ = ["Attachment", "Format", "HarnessConfig", "Slots"]

Format = Literal["json", "yaml", "toml"]


class Attachment(ProcessorSpec, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One processor in a harness (its type, its parameters, the hooks it serves), with its class at hand."""

    def cls(self) -> builtins.type[Processor]:
        """The processor class."""
        return processor_type(self.type)

    def group(self) -> str:
        """The singleton group it occupies."""
        return self.cls().group()

    def build(self) -> Processor:
        """A fresh processor instance from these parameters."""
        return build(self.type, self.params)


def _hooks(hook: str | Iterable[str], owner: str = "") -> tuple[HookName, ...]:
    """The hook names in canonical (run) order, so attach order of hooks never changes the digest."""
    names = (hook,) if isinstance(hook, str) else tuple(hook)
    who = f"processor {owner!r}: " if owner else ""
    for name in names:
        if name not in HOOK_NAMES:
            raise CompositionError(f"{who}unknown hook {name!r}; hooks are: {', '.join(HOOK_NAMES)}")
    if not names:
        raise CompositionError(f"{who}attach needs at least one hook")
    return tuple(h for h in HOOK_NAMES if h in names)


def _attachment(hooks: tuple[HookName, ...], processor: Processor) -> Attachment:
    cls = type(processor)
    accepted = cls.accepted_hooks()
    for hook in hooks:
        if hook not in accepted:
            raise CompositionError(
                f"processor {cls.type_name()!r} cannot attach to {hook!r}: its process() accepts "
                f"{', '.join(accepted)} events")
    return Attachment(type=cls.type_name(), hooks=hooks, params=processor.params())


# The order a harness is read in (type first), as it was written before the schema's fields went into name
# order: TOML files and the LLM evolver's prompt (YAML unsorted) show it; JSON, YAML files and digests sort keys.
_PROCESSOR_KEYS = ("type", "hooks", "params")
_SLOT_KEYS = ("tools", "tracer", "workspace", "sandbox", "plugins")


def _in_order(data: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {**{k: data[k] for k in keys if k in data}, **data}  # a key not listed keeps its place after them


_FORMATS: dict[str, Format] = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}
"""The config format each file suffix names."""


class HarnessConfig:
    """The hook-indexed processor pipeline plus slots; an immutable value."""

    __slots__ = ("_attachments", "_digest", "_slots")

    def __init__(self, attachments: Sequence[Attachment] = (), slots: Slots | None = None) -> None:
        self._attachments = tuple(attachments)
        self._slots = slots or Slots()
        self._digest: str | None = None
        groups: dict[str, str] = {}
        for att in self._attachments:
            group = att.group()
            if group in groups:
                raise CompositionError(
                    f"processor {att.type!r} joins singleton group {group!r}, already held by {groups[group]!r}; "
                    f"use replace({group!r}, ...)")
            groups[group] = att.type

    # --- builder algebra ------------------------------------------------------------

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The attachments in attach order."""
        return self._attachments

    @property
    def slots(self) -> Slots:
        """The shared slot resources."""
        return self._slots

    def attach(self, hook: str | Iterable[str], processor: Processor) -> HarnessConfig:
        """A new config with ``processor`` attached at ``hook`` (or several hooks, one instance)."""
        hooks = _hooks(hook, type(processor).type_name())
        return HarnessConfig((*self._attachments, _attachment(hooks, processor)), self._slots)

    def replace(self, group: str, processor: Processor) -> HarnessConfig:
        """A new config with the processor of ``group`` replaced, at the same hooks."""
        index = self._index(group)
        old = self._attachments[index]
        new_cls = type(processor)
        if new_cls.group() != group:
            raise CompositionError(f"replace({group!r}): processor {new_cls.type_name()!r} belongs to group "
                                   f"{new_cls.group()!r}, not {group!r}")
        missing = [h for h in old.hooks if h not in new_cls.accepted_hooks()]
        if missing:
            raise CompositionError(
                f"replace({group!r}): processor {new_cls.type_name()!r} targets {', '.join(new_cls.accepted_hooks())}"
                f" but the group occupies {', '.join(old.hooks)}")
        atts = list(self._attachments)
        atts[index] = _attachment(old.hooks, processor)
        return HarnessConfig(atts, self._slots)

    def remove(self, group: str) -> HarnessConfig:
        """A new config without the processor of ``group``."""
        index = self._index(group)
        return HarnessConfig(self._attachments[:index] + self._attachments[index + 1:], self._slots)

    def with_slots(self, **changes: Any) -> HarnessConfig:
        """A new config with some slots changed."""
        return HarnessConfig(self._attachments, msgspec.structs.replace(self._slots, **changes))

    def _index(self, group: str) -> int:
        for i, att in enumerate(self._attachments):
            if att.group() == group:
                return i
        raise CompositionError(f"no processor in singleton group {group!r}; groups: "
                               f"{', '.join(a.group() for a in self._attachments) or 'none'}")

    def groups(self) -> tuple[str, ...]:
        """The singleton groups present, in attach order."""
        return tuple(att.group() for att in self._attachments)

    # --- resolution -----------------------------------------------------------------

    def validate(self) -> HarnessConfig:
        """Check the whole composition (dependencies present, no cycles, orders consistent)."""
        check_dependencies(self._attachments)
        for hook in HOOK_NAMES:
            resolve_order(hook, self._attachments)
        return self

    def pipeline(self, hook: HookName) -> tuple[Attachment, ...]:
        """The attachments of ``hook`` in execution order."""
        return resolve_order(_hooks(hook)[0], self._attachments)

    def at(self, hook: str) -> tuple[Processor, ...]:
        """Fresh processor instances of ``hook`` in execution order."""
        return tuple(att.build() for att in self.pipeline(_hooks(hook)[0]))

    def instantiate(self) -> dict[HookName, tuple[Processor, ...]]:
        """Fresh processors for one attempt, per hook; a multi-hook processor is one shared instance."""
        instances = {id(att): att.build() for att in self._attachments}
        return {hook: tuple(instances[id(att)] for att in resolve_order(hook, self._attachments))
                for hook in HOOK_NAMES}

    # --- value semantics ------------------------------------------------------------

    def canonical(self) -> dict[str, Any]:
        """The resolved form the digest is taken over: pipelines per hook and slots."""
        pipelines = {hook: [msgspec.to_builtins(a) for a in resolve_order(hook, self._attachments)]
                     for hook in HOOK_NAMES}
        return {"pipelines": {h: p for h, p in pipelines.items() if p}, "slots": msgspec.to_builtins(self._slots)}

    @property
    def digest(self) -> str:
        """Content digest naming this harness version on the log (``sha256:`` + hex)."""
        if self._digest is None:
            text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
            self._digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HarnessConfig) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        procs = ", ".join(f"{'+'.join(a.hooks)}:{a.type}" for a in self._attachments)
        return f"HarnessConfig([{procs}], digest={self.digest[:19]})"

    # --- serialisation --------------------------------------------------------------

    def spec(self) -> HarnessSpec:
        """The harness as data, as ledger events carry it: processors in attach order, and slots."""
        return HarnessSpec(processors=self._attachments, slots=self._slots)

    @classmethod
    def from_spec(cls, spec: HarnessSpec, *, where: str = "harness config") -> HarnessConfig:
        """Build and validate a config from a recorded ``HarnessSpec``, naming ``where`` in errors."""
        return cls.from_dict(msgspec.to_builtins(spec), where=where)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: processors in attach order, and slots (``spec()`` as builtins, keys in reading order)."""
        return {"processors": [_in_order(msgspec.to_builtins(a), _PROCESSOR_KEYS) for a in self._attachments],
                "slots": _in_order(msgspec.to_builtins(self._slots), _SLOT_KEYS)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "harness config") -> HarnessConfig:
        """Build and validate a config from plain data, naming ``where`` in errors."""
        if not isinstance(data, Mapping):
            raise CompositionError(f"{where}: expected a mapping with 'processors' and 'slots'")
        unknown = set(data) - {"processors", "slots"}
        if unknown:
            raise CompositionError(f"{where}: unknown keys {sorted(unknown)}")
        try:
            atts = msgspec.convert(data.get("processors", []), list[Attachment])
            slots = msgspec.convert(data.get("slots", {}), Slots)
        except msgspec.ValidationError as exc:
            raise CompositionError(f"{where}: {exc}") from None
        try:
            rebuilt = HarnessConfig(slots=slots)
            for att in atts:  # rebuilt through attach, so every rule is checked again
                rebuilt = rebuilt.attach(att.hooks, att.build())
            return rebuilt.validate()
        except CompositionError as exc:
            raise CompositionError(f"{where}: {exc}") from None

    def dumps(self, fmt: Format = "yaml") -> str:
        """Serialise as JSON, YAML or TOML."""
        data = self.to_dict()
        if fmt == "json":
            return json.dumps(data, indent=2, sort_keys=True) + "\n"
        if fmt == "yaml":
            return str(yaml.safe_dump(data, sort_keys=True))
        if fmt == "toml":
            return tomli_w.dumps(data)
        raise CompositionError(f"unknown config format {fmt!r}; use json, yaml or toml")

    @classmethod
    def loads(cls, text: str, fmt: Format = "yaml", *, where: str = "harness config") -> HarnessConfig:
        """Parse a config from JSON, YAML or TOML text."""
        try:
            if fmt == "json":
                data = json.loads(text)
            elif fmt == "yaml":
                data = yaml.safe_load(text) or {}
            elif fmt == "toml":
                data = tomllib.loads(text)
            else:
                raise CompositionError(f"unknown config format {fmt!r}; use json, yaml or toml")
        except (ValueError, yaml.YAMLError) as exc:
            raise CompositionError(f"{where}: not valid {fmt}: {exc}") from None
        return cls.from_dict(data, where=where)

    @classmethod
    def load(cls, path: str | Path) -> HarnessConfig:
        """Read a config file; the format follows the suffix (.json, .yaml/.yml, .toml)."""
        p = Path(path)
        fmt = _FORMATS.get(p.suffix.lower())
        if fmt is None:
            raise CompositionError(f"{p}: unknown config suffix {p.suffix!r}; use .json, .yaml or .toml")
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise CompositionError(f"cannot read harness config {p}: {exc.strerror}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CompositionError(f"{p}: not a harness file: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                                   f"offset {exc.start})") from None
        return cls.loads(text, fmt, where=str(p))

    def save(self, path: str | Path) -> Path:
        """Write the config to ``path`` in the format its suffix names."""
        p = Path(path)
        p.write_text(self.dumps(_FORMATS.get(p.suffix.lower(), "yaml")))
        return p
