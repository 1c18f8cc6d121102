"""Immutable JSON values: the dicts and lists inside hook payloads, frozen once when they enter one.

Hook payloads are frozen msgspec Structs, but a ``JsonObject`` field (a tool call's input, a
tool's input schema, a tool result's data, a task's meta) holds a plain dict, which a processor
could edit in place under an event already on its way to the log. ``freeze`` turns such a value
into a ``FrozenDict`` / ``FrozenList`` pair, deeply; the value types of ``schemas.messages`` call it
from ``__post_init__``, so a value is frozen once when it is made (built, replaced or decoded),
never again when a conversation carrying it moves on to the next step.

Both types are the builtin ``dict`` / ``list`` underneath: they compare equal to plain ones and
msgspec encodes them to the same bytes. Every mutator raises ``FrozenValueError`` (a ``TypeError``).

>>> value = freeze({"action": "look", "tags": ["a"]})
>>> value == {"action": "look", "tags": ["a"]}
True
>>> value["action"] = "take"
Traceback (most recent call last):
...
schemas.errors.FrozenValueError: hook payloads are immutable: FrozenDict.__setitem__('action') refused; \
build a new value with msgspec.structs.replace (a changed copy: {**value, key: new})
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, SupportsIndex

from schemas.errors import FrozenValueError

_FIX = "build a new value with msgspec.structs.replace"
_LEAVES = frozenset({str, int, float, bool, type(None)})
"""The immutable JSON values: nothing to freeze (a type test is cheaper than the call to ``freeze``)."""


def _refuse(value: FrozenDict | FrozenList, method: str, *args: object) -> NoReturn:
    shown = ", ".join(repr(a) for a in args)
    copy = "{**value, key: new}" if isinstance(value, dict) else "[*value, new]"
    raise FrozenValueError(value, f"hook payloads are immutable: {type(value).__name__}.{method}({shown}) refused; "
                                  f"{_FIX} (a changed copy: {copy})")


class FrozenDict(dict[str, Any]):
    """A JSON object that refuses every change; its values are frozen too. ``dict(value)`` is a mutable copy."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ``freeze`` builds these without calling here; this is for a FrozenDict made directly
        dict.__init__(self, *args, **kwargs)
        for key, value in dict.items(self):  # the builtin's own methods, which these overrides refuse
            frozen = freeze(value)
            if frozen is not value:
                dict.__setitem__(self, key, frozen)

    def __setitem__(self, key: str, value: Any) -> NoReturn:
        _refuse(self, "__setitem__", key)

    def __delitem__(self, key: str) -> NoReturn:
        _refuse(self, "__delitem__", key)

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self, "__ior__")

    def clear(self) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "clear")

    def pop(self, key: str, *default: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "pop", key)

    def popitem(self) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "popitem")

    def setdefault(self, key: str, default: Any = None) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "setdefault", key)

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "update")

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        # The default reduction of a dict subclass refills the new object item by item, which is refused.
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A JSON array that refuses every change; its items are frozen too. ``list(value)`` is a mutable copy."""

    __slots__ = ()

    def __init__(self, items: Iterable[Any] = ()) -> None:
        list.__init__(self, [freeze(v) for v in items])  # ``freeze`` builds these without calling here

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        _refuse(self, "__setitem__", index)

    def __delitem__(self, index: Any) -> NoReturn:
        _refuse(self, "__delitem__", index)

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self, "__iadd__")

    def __imul__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self, "__imul__")

    def append(self, item: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "append", item)

    def extend(self, items: Iterable[Any]) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "extend")

    def insert(self, index: SupportsIndex, item: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "insert", index, item)

    def pop(self, index: SupportsIndex = -1) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "pop", index)

    def remove(self, item: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "remove", item)

    def clear(self) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "clear")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "sort")

    def reverse(self) -> NoReturn:
        """Refused: a frozen value does not change."""
        _refuse(self, "reverse")

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return (FrozenList, (list(self),))


def _frozen_dict(items: dict[str, Any]) -> FrozenDict:
    """A FrozenDict holding ``items`` (already frozen), filled by the builtin in C."""
    out = dict.__new__(FrozenDict)
    dict.update(out, items)
    return out


def _frozen_list(items: list[Any]) -> FrozenList:
    """A FrozenList holding ``items`` (already frozen), filled by the builtin in C."""
    out = list.__new__(FrozenList)
    list.extend(out, items)
    return out


EMPTY = FrozenDict()
"""The empty frozen object, shared by every value whose JSON field is left at its default."""


class _Reading(threading.local):
    depth = 0
    """How many ``reading_log`` blocks this thread is in."""


READING = _Reading()
"""This thread's reading state (``READING.depth``: a value type's ``__post_init__`` tests it inline, the cheapest
test on the hot path of every read)."""


@contextmanager
def reading_log() -> Iterator[None]:
    """While decoding events read from the log: values are left as decoded, not frozen.

    A read decodes millions of tool schemas and inputs that no processor will see, and freezing
    them cost more than decoding (1.2 -> 4.3 us a hook record with a 30-value enum schema). A
    value read from the log that does become a hook payload again (a replay feeds logged tool
    calls, results and tasks to the run loop) is frozen where it enters one (``refrozen``).
    """
    depth = READING.depth
    READING.depth = depth + 1
    try:
        yield
    finally:
        READING.depth = depth


def freeze(value: Any) -> Any:
    """``value`` with every dict and list in it frozen; an already frozen value is returned as is (O(1)).

    A ``FrozenDict`` or ``FrozenList`` is frozen all the way down by construction, so freezing
    costs the size of the new data only.
    """
    kind = type(value)
    if kind in _LEAVES or kind is FrozenDict or kind is FrozenList:
        return value
    if isinstance(value, dict):
        if not value:
            return EMPTY
        # the common case, only strings and numbers inside, is checked and copied in C
        if _LEAVES.issuperset(map(type, value.values())):
            return _frozen_dict(value)
        return _frozen_dict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        if _LEAVES.issuperset(map(type, value)):
            return _frozen_list(value)
        return _frozen_list([freeze(v) for v in value])
    if kind is tuple:
        items = tuple(freeze(v) for v in value)
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
