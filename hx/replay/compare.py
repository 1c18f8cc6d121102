"""Comparing event bodies: a replayed attempt against the logged one, down to the first differing field.

Both sides are compared as resolved events (conversations in full, ``history`` cleared):
the logged records through ``schemas.history.resolve``, the replayed events as the run
loop emitted them, before its tracer packs them into deltas. Wall time lives in a
header, never in a body, so equal behaviour means equal bodies. Two things differ by
construction and are mapped back before comparing (``Aliases``): the model spec a replay
or fork calls through (``replay:X`` stands for ``X``), a fork's own run id, and the
digest of a harness given on purpose instead of the logged one. And an attempt logged before
``AttemptFinished.usage`` existed holds zeros there while its replay sums the recorded
responses' usage: against such a log the replayed total is compared as zeros too
(``as_logged``).

>>> from schemas.messages import ToolCall
>>> first_difference(ToolCall(id="c", name="act", input={"action": "look"}),
...                  ToolCall(id="c", name="act", input={"action": "take coin"}))
('input.action', 'look', 'take coin')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas.envelope import Record
from schemas.event import Event
from schemas.hooks import HOOK_OF, AfterModel, HookRecord
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import Usage
from schemas.model import ModelError, ModelRequest, ModelResponse

EXTRA = "(an event the log does not have)"
MISSING = "(an event the replay did not produce)"
MAX_SHOWN = 200
"""Characters of a value a divergence report shows (long conversations are cut)."""


@dataclass(frozen=True)
class Aliases:
    """Strings a replay writes that stand for what the log holds: model specs and run ids."""

    models: Mapping[str, str] = field(default_factory=dict)
    """Spec the replay called -> spec the log names (``replay:random:`` -> ``random:``)."""
    run_ids: Mapping[str, str] = field(default_factory=dict)
    """Run id the replay wrote under -> the logged run id (a fork's id -> its source)."""
    digests: Mapping[str, str] = field(default_factory=dict)
    """Harness digest the replay ran -> the logged one (a replay under ``--harness``: compared apart from that)."""

    def model(self, spec: str) -> str:
        """The logged spec a replayed spec stands for."""
        return self.models.get(spec, spec)

    def apply(self, event: Event) -> Event:
        """``event`` with its model specs and run id mapped back to the logged ones."""
        replace = msgspec.structs.replace
        if isinstance(event, ModelRequest | ModelResponse | ModelError):
            return replace(event, model=self.model(event.model))
        if isinstance(event, HookRecord) and isinstance(event.event, AfterModel):
            return replace(event, event=replace(event.event, model=self.model(event.event.model)))
        if isinstance(event, AttemptStarted):
            return replace(event, model=self.model(event.model), run_id=self.run_ids.get(event.run_id, event.run_id),
                           harness_digest=self.digests.get(event.harness_digest, event.harness_digest))
        if isinstance(event, AttemptFinished):
            return replace(event, run_id=self.run_ids.get(event.run_id, event.run_id))
        return event


@dataclass(frozen=True)
class Divergence:
    """Where a replayed attempt first differs from the logged one."""

    subject: str
    """The logged attempt's trace subject."""
    ordinal: int
    """Index of the event in the attempt (0: ``attempt.started``)."""
    seq: int | None
    """Stream sequence of the logged event (None: the log has no event there)."""
    index: int | None
    """Index of the logged event in its frame."""
    event_type: str
    """The logged event's type (the replayed one's when the log has none)."""
    path: str
    """Field path inside the body, e.g. ``event.tool_calls[0].input.action``; ``type`` when the types differ."""
    logged: Any
    replayed: Any
    step: int | None = None
    """The step the event belongs to, when it has one."""

    def describe(self) -> str:
        """A few lines a person reads: where, what, and the two values."""
        where = (f"seq {self.seq} index {self.index}" if self.seq is not None
                 else f"after the logged attempt's last event (event #{self.ordinal})")
        step = f", step {self.step}" if self.step is not None else ""
        return (f"first divergence at {where} on {self.subject} (event #{self.ordinal}{step})\n"
                f"  event:    {self.event_type}\n"
                f"  field:    {self.path or '(the whole body)'}\n"
                f"  logged:   {shown(self.logged)}\n"
                f"  replayed: {shown(self.replayed)}")


def shown(value: Any) -> str:
    """A value as a report shows it: JSON-like, cut at ``MAX_SHOWN`` characters."""
    if isinstance(value, msgspec.Struct | tuple | list | dict):
        text = msgspec.json.encode(value).decode()
    else:
        text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + f"... ({len(text)} characters)"


def type_name(event: Event) -> str:
    """An event's type as reports name it: a hook record says which hook and stage."""
    if isinstance(event, HookRecord):
        return f"hook {HOOK_OF[type(event.event)]} ({event.stage})"
    return type(event).TYPE


def _kind(value: Any) -> type:
    """A value's type for comparing, a frozen dict or list (a live value) the same as a plain one (read back)."""
    kind = type(value)
    return dict if issubclass(kind, dict) else list if issubclass(kind, list) else kind


def first_difference(logged: Any, replayed: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The path of the first field where two values differ, with both values; None when they are equal."""
    if logged == replayed:
        return None
    if _kind(logged) is not _kind(replayed):
        return path, logged, replayed
    if isinstance(logged, msgspec.Struct):
        for name in logged.__struct_fields__:
            found = first_difference(getattr(logged, name), getattr(replayed, name), f"{path}.{name}" if path else name)
            if found is not None:
                return found
        return path, logged, replayed  # pragma: no cover - unequal structs differ in some field
    if isinstance(logged, tuple | list):
        for i, (a, b) in enumerate(zip(logged, replayed, strict=False)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        shorter = min(len(logged), len(replayed))
        return (f"{path}[{shorter}]", logged[shorter] if shorter < len(logged) else "(absent)",
                replayed[shorter] if shorter < len(replayed) else "(absent)")
    if isinstance(logged, dict):
        for key in [*logged, *(k for k in replayed if k not in logged)]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in logged or key not in replayed:
                return sub, logged.get(key, "(absent)"), replayed.get(key, "(absent)")
            found = first_difference(logged[key], replayed[key], sub)
            if found is not None:
                return found
        return path, logged, replayed  # pragma: no cover - equal keys and values are equal dicts
    return path, logged, replayed


def as_logged(logged: Event, replayed: Event) -> Event:
    """``replayed`` with its usage total zeroed when the logged attempt predates the total (its ``usage`` all zeros).

    hx wrote ``AttemptFinished`` without ``usage`` before issue 38; such an event reads back with zeros,
    while the replay re-sums the recorded responses' usage. A total the log never held is no divergence.
    """
    if (isinstance(logged, AttemptFinished) and isinstance(replayed, AttemptFinished)
            and logged.usage == Usage() and replayed.usage != Usage()):
        return msgspec.structs.replace(replayed, usage=Usage())
    return replayed


def without_failed_tries(records: Sequence[Record]) -> list[Record]:
    """The logged records less each failed model try (its request and ``model.error``); try indexes set to 0.

    A replay feeds the try that succeeded on the first call, so it never repeats a
    retry or a fallback: those are the provider's weather, not the harness's behaviour.
    """
    if not any(isinstance(r.event, ModelError) for r in records):
        return list(records)
    failed = {(r.event.step, r.event.role, r.event.try_index) for r in records if isinstance(r.event, ModelError)}
    out: list[Record] = []
    for r in records:
        event = r.event
        if isinstance(event, ModelError):
            continue
        if isinstance(event, ModelRequest | ModelResponse):
            if isinstance(event, ModelRequest) and (event.step, event.role, event.try_index) in failed:
                continue
            if event.try_index:
                r = msgspec.structs.replace(r, event=msgspec.structs.replace(event, try_index=0))
        out.append(r)
    return out


def compare_attempt(subject: str, logged: Sequence[Record], replayed: Sequence[Event],
                    aliases: Aliases | None = None) -> Divergence | None:
    """The first divergence of a replayed attempt from its logged (resolved) records; None when identical."""
    aliases = aliases or Aliases()
    records = without_failed_tries(logged)
    for i in range(max(len(records), len(replayed))):
        record = records[i] if i < len(records) else None
        event = aliases.apply(replayed[i]) if i < len(replayed) else None
        if record is not None and event is not None:
            event = as_logged(record.event, event)
        if record is not None and event is not None and record.event == event:
            continue
        step = getattr(record.event if record is not None else event, "step", None)
        if record is None:
            assert event is not None
            return Divergence(subject, i, None, None, type_name(event), EXTRA, "(the logged attempt ended)",
                              event, step)
        if event is None:
            return Divergence(subject, i, record.seq, record.index, type_name(record.event), MISSING,
                              record.event, "(the replayed attempt ended)", step)
        if type_name(record.event) != type_name(event):
            # one event more or less on one side: the types line up again right after it
            if i + 1 < len(replayed) and type_name(replayed[i + 1]) == type_name(record.event):
                return Divergence(subject, i, record.seq, record.index, type_name(event), EXTRA,
                                  "(no such event)", event, step)
            if i + 1 < len(records) and type_name(records[i + 1].event) == type_name(event):
                return Divergence(subject, i, record.seq, record.index, type_name(record.event), MISSING,
                                  record.event, "(no such event)", step)
            return Divergence(subject, i, record.seq, record.index, type_name(record.event), "type",
                              type_name(record.event), type_name(event), step)
        found = first_difference(record.event, event)
        assert found is not None
        path, a, b = found
        return Divergence(subject, i, record.seq, record.index, type_name(record.event), path, a, b, step)
    return None
