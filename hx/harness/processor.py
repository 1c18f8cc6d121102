"""The processor: the atomic unit of harness behaviour.

A processor consumes one hook event and yields zero or more events of the same type:
pass-through, transform, split (several), intercept (none) or interrupt (raise
``Interrupt``). Its declared fields are its parameters, serialised with the harness
config; anything else it keeps is private per-attempt state, because the run loop
builds every processor afresh from the config for each attempt.
"""

from __future__ import annotations

import importlib
import inspect
import types
import typing
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Union, get_args, get_origin

import msgspec

from hx.harness.errors import CompositionError
from hx.harness.libraries import load_libraries
from schemas.hooks import HOOK_NAMES, HOOK_OF, HookName, HookPayload

PRE = 0
NORMAL = 50
POST = 100
FINAL = 150
"""Observers and accountants that must see the event as every other processor, POST ones included, leaves it."""


_REGISTRY: dict[str, type[Processor]] = {}


class Processor(msgspec.Struct, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every processor; subclasses declare parameters as annotated fields.

    ``dict=True`` gives instances a ``__dict__`` for private per-attempt state, which is
    never serialised or compared.
    """

    name: ClassVar[str] = ""
    """Registry name (defaults to ``module:Class``)."""
    _singleton_group: ClassVar[str] = ""
    """Mutual-exclusion group; defaults to the registry name."""
    _order: ClassVar[int] = NORMAL
    _after: ClassVar[tuple[str, ...]] = ()
    """Singleton groups that must run before this one at a shared hook."""
    dimension: ClassVar[str] = ""
    """The paper's behavioural dimension, D1..D9."""
    addresses: ClassVar[tuple[str, ...]] = ()
    """Failure categories (``schemas.landscape.FAILURE_CATEGORIES``) this processor is meant to address; the
    offline evolver matches them to failing tasks."""
    limits: ClassVar[tuple[str, ...]] = ()
    """Numeric parameters that bound how long an attempt may go on before this processor ends it (larger is
    more lenient): the offline evolver relaxes a processor that interrupted failing attempts by doubling them."""
    calls_model: ClassVar[bool] = False
    """True when it calls a model itself (a judge): a replay that must make no model call cannot run it."""
    standalone: ClassVar[bool] = True
    """False when its default parameters do nothing useful on their own (a list to fill in, a model role to
    configure): the offline evolver, which attaches processors with their defaults, leaves it out."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not inspect.isabstract(cls) and "process" in cls.__dict__:
            register(cls)

    async def process(self, event: Any) -> AsyncIterator[Any]:
        """Consume one hook event and yield zero or more of the same type."""
        yield event

    @classmethod
    def type_name(cls) -> str:
        """The name this processor type is registered and serialised under."""
        return cls.__dict__.get("name") or f"{cls.__module__}:{cls.__qualname__}"

    @classmethod
    def group(cls) -> str:
        """The singleton group this processor occupies."""
        return cls._singleton_group or cls.type_name()

    @classmethod
    def accepted_hooks(cls) -> tuple[HookName, ...]:
        """The hooks whose event types ``process`` accepts, from its annotation."""
        return accepted_hooks(cls)

    def params(self) -> dict[str, Any]:
        """The declared parameters as JSON-compatible values."""
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result


def accepted_hooks(cls: type[Processor]) -> tuple[HookName, ...]:
    """Read the hook event types from the annotation of ``cls.process``'s event argument."""
    try:
        hints = typing.get_type_hints(cls.process)
    except (NameError, TypeError) as exc:
        raise CompositionError(f"processor {cls.type_name()!r}: cannot resolve the type of process(): {exc}") from None
    params = [p for p in inspect.signature(cls.process).parameters if p != "self"]
    if not params or params[0] not in hints:
        raise CompositionError(f"processor {cls.type_name()!r}: process() must annotate its event argument")
    ann = hints[params[0]]
    members = get_args(ann) if get_origin(ann) in (Union, types.UnionType) else (ann,)
    if any(m is Any or m is HookPayload for m in members):
        return HOOK_NAMES  # a generic processor (an observer) accepts every hook
    hooks = [HOOK_OF[m] for m in members if m in HOOK_OF]
    if len(hooks) != len(members):
        raise CompositionError(f"processor {cls.type_name()!r}: process() accepts {ann!r}, not hook event types")
    return tuple(hooks)


def register(cls: type[Processor]) -> type[Processor]:
    """Make a processor type known by its registry name."""
    name = cls.type_name()
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
        raise CompositionError(f"processor name {name!r} is used by {existing.__module__}.{existing.__qualname__} "
                               f"and {cls.__module__}.{cls.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def processor_type(name: str) -> type[Processor]:
    """Find a processor type by registry name or ``module:Class`` path (importing the module)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        load_libraries()  # the library's short names are known once it is imported
        cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    module, sep, qualname = name.partition(":")
    if not sep:
        raise CompositionError(f"unknown processor {name!r}; known: {', '.join(sorted(_REGISTRY)) or 'none'}")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise CompositionError(f"cannot load processor {name!r}: {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, Processor)):
        raise CompositionError(f"{name!r} is not a Processor subclass")
    return obj


def build(name: str, params: dict[str, Any]) -> Processor:
    """Instantiate a processor type from its name and parameters, validating them."""
    cls = processor_type(name)
    try:
        return msgspec.convert(params, cls)
    except msgspec.ValidationError as exc:
        raise CompositionError(f"processor {name!r}: bad parameters: {exc}") from None


def registered() -> dict[str, type[Processor]]:
    """Every registered processor type by name (the added processor libraries imported first)."""
    load_libraries()
    return dict(sorted(_REGISTRY.items()))
