"""The divergence report of ``hx replay`` names every field of every logged event: none is left out of the comparison.

A real round on the toy benchmark, read back as a replay reads it; then, for the first event
of each type in it and for each field of that event's body (nested fields, the first element
of a sequence, the first entry of a map, an absent optional value made present), the logged
copy gets that one field changed to another value of its type, and the comparison with the
unchanged events must name that event and that field's path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import msgspec.inspect as mi
from toybench import RANDOM, ToyBench, ids

from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from hx.replay.compare import EXTRA, MISSING, compare_attempt, type_name
from schemas.envelope import Record
from schemas.history import resolve
from schemas.lifecycle import AttemptStarted
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import TRACE, TraceAddress, trace_filter

RUN = "toy-compare"
Change = tuple[str, Any]
"""The path of the field changed, and the whole value with that field changed."""


def fits(value: Any, t: mi.Type) -> bool:
    """Whether ``value`` is of the member ``t`` of a union."""
    if isinstance(t, mi.StructType):
        return isinstance(value, t.cls)
    if isinstance(t, mi.NoneType):
        return value is None
    if isinstance(t, mi.LiteralType):
        return value in t.values
    kinds: dict[type[mi.Type], type | tuple[type, ...]] = {
        mi.StrType: str, mi.BoolType: bool, mi.FloatType: float, mi.DictType: dict, mi.ListType: list,
        mi.VarTupleType: tuple, mi.TupleType: tuple}
    if isinstance(t, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kinds.get(type(t), ()))


def sample(t: mi.Type) -> Any:
    """A value of type ``t`` (for a field that holds none, or an empty sequence or map)."""
    if isinstance(t, mi.Metadata):
        return sample(t.type)
    if isinstance(t, mi.UnionType):
        return sample(next(m for m in t.types if not isinstance(m, mi.NoneType)))
    if isinstance(t, mi.StructType):
        return t.cls(**{f.name: sample(f.type) for f in t.fields if f.required})
    simple: dict[type[mi.Type], Any] = {mi.StrType: "~", mi.IntType: 1, mi.FloatType: 1.5, mi.BoolType: True,
                                        mi.AnyType: "~", mi.NoneType: None, mi.DictType: {}, mi.ListType: [],
                                        mi.VarTupleType: ()}
    if isinstance(t, mi.LiteralType):
        return t.values[0]
    if isinstance(t, mi.TupleType):
        return tuple(sample(item) for item in t.item_types)
    return simple[type(t)]


def changes(value: Any, t: mi.Type, path: str = "") -> Iterator[Change]:
    """Every change of one field of ``value`` (of type ``t``) to another value of that field's type."""
    if isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.AnyType):  # a value of a dict[str, Any]: its own type says what else it could be
        if value is None:
            yield path, "~"
            return
        # a hook payload's JSON values are frozen dicts and lists (schemas.frozen): typed as what they are under it
        t = mi.type_info(dict if isinstance(value, dict) else list if isinstance(value, list) else type(value))
    if isinstance(t, mi.UnionType):
        if value is None:
            yield path, sample(t)
            return
        t = next(m for m in t.types if fits(value, m))
    if isinstance(t, mi.StructType):
        for f in t.fields:
            for sub, changed in changes(getattr(value, f.name), f.type, f"{path}.{f.name}" if path else f.name):
                yield sub, msgspec.structs.replace(value, **{f.name: changed})
    elif isinstance(t, mi.VarTupleType | mi.ListType):
        if not value:
            yield f"{path}[0]", type(value)([sample(t.item_type)])
        else:
            for sub, changed in changes(value[0], t.item_type, f"{path}[0]"):
                yield sub, type(value)([changed, *value[1:]])
    elif isinstance(t, mi.TupleType):
        for i, item in enumerate(t.item_types):
            for sub, changed in changes(value[i], item, f"{path}[{i}]"):
                yield sub, (*value[:i], changed, *value[i + 1:])
    elif isinstance(t, mi.DictType):
        if not value:
            yield f"{path}.~", {"~": sample(t.value_type)}
        else:
            key = next(iter(value))
            for sub, changed in changes(value[key], t.value_type, f"{path}.{key}"):
                yield sub, {**value, key: changed}
    elif isinstance(t, mi.LiteralType):
        yield from ((path, v) for v in t.values[:2] if v != value)
    elif isinstance(t, mi.BoolType):
        yield path, not value
    elif isinstance(t, mi.IntType):
        yield path, value + 1
    elif isinstance(t, mi.FloatType):
        yield path, value + 0.5
    elif isinstance(t, mi.StrType):
        yield path, value + "~"
    else:
        raise AssertionError(f"{path}: no change written for a field of type {t}")


async def recorded_attempts(nats_url: str) -> dict[str, list[Record]]:
    """One real round (five tasks, two attempts each) and its attempts' records, resolved as a replay reads them."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        rollout = Rollout([ToyBench()], RANDOM, starter_harness("textworld"), log=conn.log,
                          harness_source="starter:textworld", settings=RolloutSettings(attempts=2, max_steps=12))
        await rollout.rollout(RUN, [*ids("walk", 3), *ids("easy", 1), *ids("crashy", 1)])
        records = resolve([r async for r in conn.log.read(TRACE.name, subjects=[trace_filter(RUN, 0)])])
    attempts: dict[str, list[Record]] = {}
    for record in records:
        if TraceAddress.parse(record.subject).attempt is not None:
            attempts.setdefault(record.subject, []).append(record)
    return attempts


async def test_a_change_to_any_field_of_any_logged_event_is_named_by_the_divergence_report(nats_url: str) -> None:
    attempts = await recorded_attempts(nats_url)
    checked: dict[str, int] = {}
    for subject, records in attempts.items():
        replayed = [r.event for r in records]
        assert compare_attempt(subject, records, replayed) is None  # the same events: identical
        for i, record in enumerate(records):
            name = type_name(record.event)
            if name in checked:
                continue
            checked[name] = 0
            for path, changed in changes(record.event, mi.type_info(type(record.event))):
                assert changed != record.event, (name, path)
                logged = [*records[:i], msgspec.structs.replace(record, event=changed), *records[i + 1:]]
                found = compare_attempt(subject, logged, replayed)
                assert found is not None, f"{name}: a change of {path} is reported identical"
                assert (found.ordinal, found.seq, found.index) == (i, record.seq, record.index), (name, path)
                if type_name(changed) != name:  # a hook record's stage is part of the type a report names
                    assert path == "stage" and found.path in ("type", EXTRA, MISSING), (name, path, found)
                    assert found.event_type in (name, type_name(changed)), (name, found)
                else:
                    assert (found.event_type, found.path) == (name, path), (name, path, found.describe())
                    assert found.logged != found.replayed and path in found.describe()
                checked[name] += 1
    # the event types the loop writes for an attempt, each with every field it has
    assert {"attempt.started", "attempt.finished", "model.request", "model.response", "tool.invoked",
            "tool.returned", "verifier.score", "processor.triggered",
            "hook task_start (emitted)", "hook before_model (emitted)", "hook after_tool (emitted)"} <= set(checked)
    assert all(checked.values()), checked
    assert checked["attempt.started"] == len(AttemptStarted.__struct_fields__)  # run_id, round, task_id, ...
