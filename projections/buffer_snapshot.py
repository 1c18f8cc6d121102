"""The replay buffer's state and its compact checkpoints: each message, conversation and tool list once.

In memory the turns of an attempt share their messages (resolved from the log's deltas);
a state encoded as it is writes each turn's whole context (a real run's buffer of ~60-turn
attempts took 64 MB, and decoding it lost the sharing). A ``BufferSnapshot`` holds every
distinct message, conversation (as spans of an earlier one plus new messages) and tool list
once, and turns refer to them by index: a snapshot costs what the run added.
"""

from __future__ import annotations

from typing import Any, cast

import msgspec

from projections.trajectories import ModelTurn, Partial, Trajectory, Turn
from schemas.messages import Message, ToolSchema
from schemas.model import ModelRequest, ModelResponse


class BufferState(msgspec.Struct, kw_only=True):
    """The replay buffer of one run."""

    rounds: list[int] = []
    """Finished rounds held, oldest first."""
    trajectories: dict[str, dict[str, Trajectory]] = {}
    """By round (as text: the canonical encoding sorts str keys only), then by ``task/attempt``;
    rounds held and rounds still running."""
    running: set[int] = set()
    """Admitted rounds started and not yet finished."""
    slots: dict[str, int] = {}
    """Trace round (as text) -> its window slot: the evolution round it belongs to, else the trace round itself."""
    attempts: dict[str, Partial] = {}
    """In-flight attempts of running rounds, by subject."""
    heldout_rounds: set[int] = set()
    heldout_tasks: set[str] = set()
    """Tasks any held-out round evaluated: never admitted, in any round."""
    evicted: int = 0
    """Trajectories evicted with their round."""
    dropped: int = 0
    """Attempts dropped: a conversation delta that cannot be resolved, unfinished when their round ended,
    or of a task a later held-out round evaluated."""


# --- checkpoints: each message, conversation and tool list once ------------------------------------------------

ENCODER = msgspec.msgpack.Encoder(order="sorted")
"""The snapshot encoder: map keys sorted, so a state always gives the same bytes."""
Span = tuple[int, int]
"""``[start, stop)`` of a context's base context."""


class TurnRef(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A ``Turn`` in a snapshot: messages, tools, completion and model names as indices into its tables."""

    step: int
    role: str
    model: int
    model_version: int
    messages: int
    tools: int
    params: dict[str, Any]
    completion: int
    logprobs: tuple[float, ...]
    on_policy: bool


class RequestRef(msgspec.Struct, frozen=True, array_like=True):
    """A ``ModelRequest`` in a snapshot: the request without messages and tools, and their indices."""

    request: ModelRequest
    messages: int
    tools: int


class PartialRef(msgspec.Struct, frozen=True, array_like=True):
    """A ``Partial`` in a snapshot: the partial without conversation, requests and turns, and those."""

    partial: Partial
    conversation: int
    requests: dict[str, RequestRef]
    turns: tuple[tuple[RequestRef | None, ModelResponse], ...]


class BufferSnapshot(msgspec.Struct, kw_only=True):
    """A ``BufferState`` as checkpointed: tables of distinct values, and the state referring to them."""

    messages: list[Message]
    """Every distinct message (by encoded value)."""
    contexts: list[tuple[int, tuple[int | Span, ...]]]
    """Every distinct conversation as ``(base, parts)``: a part is a message index, or a span of the
    earlier context ``base``, the one referred to just before (for a turn, its attempt's previous
    turn): an attempt's growing or sliding conversation costs what each turn adds."""
    tools: list[tuple[ToolSchema, ...]]
    """Every distinct tool list."""
    names: list[str]
    """Every distinct model name of the turns."""
    state: BufferState
    """The state without its trajectories and attempts."""
    trajectories: dict[str, dict[str, tuple[Trajectory, tuple[TurnRef, ...]]]]
    """Each trajectory without its turns, and its turns."""
    attempts: dict[str, PartialRef]


class _Tables:
    """The tables of a snapshot being written: values interned by identity, then by value."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.contexts: list[tuple[int, tuple[int | Span, ...]]] = []
        self.tools: list[tuple[ToolSchema, ...]] = []
        self.names: dict[str, int] = {}
        # Each table's index, by id (of objects the state holds while the snapshot is written: their
        # ids are stable) and by value. One per table: () is both a context and a tool list.
        self._message_of: dict[int | bytes, int] = {}
        self._context_of: dict[int | tuple[int, ...], int] = {}
        self._tools_of: dict[int | bytes, int] = {}
        self._indices: list[tuple[int, ...]] = []
        """The message indices of each context."""
        self._last = -1
        """The context referred to last: the base of the next new one."""

    @staticmethod
    def _intern(index: dict[Any, int], table: list[Any], value: Any, key: bytes | tuple[int, ...]) -> int:
        i = index.setdefault(key, len(table))
        if i == len(table):
            table.append(value)
        return i

    def message(self, m: Message) -> int:
        """The index of ``m``."""
        i = self._message_of.get(id(m))
        if i is None:
            # By encoded value, not hash: a message with a tool call is unhashable, and values that
            # compare equal but encode apart (1 and 1.0) must stay apart for the state digest.
            i = self._message_of[id(m)] = self._intern(self._message_of, self.messages, m, ENCODER.encode(m))
        return i

    def tool_list(self, tools: tuple[ToolSchema, ...]) -> int:
        """The index of a tool list."""
        i = self._tools_of.get(id(tools))
        if i is None:
            i = self._tools_of[id(tools)] = self._intern(self._tools_of, self.tools, tools, ENCODER.encode(tools))
        return i

    def context(self, messages: tuple[Message, ...]) -> int:
        """The index of a conversation."""
        i = self._context_of.get(id(messages))
        if i is None:
            known = tuple(map(self._message_of.get, map(id, messages)))  # at C speed: most messages are known
            indices = cast("tuple[int, ...]", known) if None not in known else tuple(map(self.message, messages))
            i = self._context_of.get(indices)
            if i is None:
                self._indices.append(indices)
                i = self._intern(self._context_of, self.contexts, (self._last, self._parts(indices)), indices)
            self._context_of[id(messages)] = i
        self._last = i
        return i

    def _parts(self, indices: tuple[int, ...]) -> tuple[int | Span, ...]:
        base = self._indices[self._last] if self._last >= 0 else ()
        n = len(base)
        if n and indices[:n] == base:  # the base plus messages: the common case
            return ((0, n), *indices[n:])
        where: dict[int, int] = {}
        for k, m in enumerate(base):
            where.setdefault(m, k)
        parts: list[int | Span] = []
        start = j = -1  # the open span of base, if start >= 0
        for m in (*indices, -1):  # -1 closes the last span
            if start >= 0 and j < n and base[j] == m:
                j += 1
                continue
            if start >= 0:
                parts.append((start, j) if j - start > 1 else base[start])
            start = where.get(m, -1)
            j = start + 1
            if start < 0 and m >= 0:
                parts.append(m)
        return tuple(parts)

    def turn(self, t: Turn) -> TurnRef:
        """``t`` with its references."""
        names = self.names
        return TurnRef(**(msgspec.structs.asdict(t) | {  # every field of Turn, or TurnRef() raises
            "messages": self.context(t.messages), "tools": self.tool_list(t.tools),
            "completion": self.message(t.completion), "model": names.setdefault(t.model, len(names)),
            "model_version": names.setdefault(t.model_version, len(names))}))

    def request(self, r: ModelRequest | None) -> RequestRef | None:
        """``r`` with its references."""
        if r is None:
            return None
        return RequestRef(msgspec.structs.replace(r, messages=(), tools=()), self.context(r.messages),
                          self.tool_list(r.tools))


def snapshot(state: BufferState) -> BufferSnapshot:
    """``state`` as a ``BufferSnapshot`` (walked in key order: equal states give equal snapshots)."""
    tables = _Tables()
    trajectories = {r: {k: (msgspec.structs.replace(t, turns=()), tuple(map(tables.turn, t.turns)))
                        for k, t in sorted(by_key.items())}
                    for r, by_key in sorted(state.trajectories.items())}
    attempts = {}
    for subject, p in sorted(state.attempts.items()):
        turns = tuple((tables.request(t.request), t.response) for t in p.turns)
        requests = {k: cast("RequestRef", tables.request(r)) for k, r in sorted(p.requests.items())}
        attempts[subject] = PartialRef(msgspec.structs.replace(p, conversation=(), requests={}, turns=[]),
                                       tables.context(p.conversation), requests, turns)
    return BufferSnapshot(messages=tables.messages, contexts=tables.contexts, tools=tables.tools,
                          names=list(tables.names), state=msgspec.structs.replace(state, trajectories={}, attempts={}),
                          trajectories=trajectories, attempts=attempts)


def restore(snap: BufferSnapshot) -> BufferState:
    """The ``BufferState`` of ``snap``: each message built once, shared by every context holding it.

    Indices are bounds-checked only as far as indexing does: the runner trusts a decoded state
    only when its digest is the checkpoint's.
    """
    messages, tools, names = snap.messages, snap.tools, snap.names
    contexts: list[tuple[Message, ...]] = []

    def turn(r: TurnRef) -> Turn:
        return Turn(**(msgspec.structs.asdict(r) | {
            "messages": contexts[r.messages], "tools": tools[r.tools], "completion": messages[r.completion],
            "model": names[r.model], "model_version": names[r.model_version]}))

    def request(r: RequestRef | None) -> ModelRequest | None:
        return None if r is None else msgspec.structs.replace(r.request, messages=contexts[r.messages],
                                                              tools=tools[r.tools])

    try:
        for base, parts in snap.contexts:
            out: list[Message] = []
            for part in parts:
                if isinstance(part, int):
                    out.append(messages[part])
                elif 0 <= base < len(contexts) and 0 <= part[0] < part[1] <= len(contexts[base]):
                    out.extend(contexts[base][part[0]:part[1]])
                else:
                    raise IndexError(f"span {part} of context {base} lies outside it")
            contexts.append(tuple(out))
        state = snap.state
        state.trajectories = {r: {k: msgspec.structs.replace(t, turns=tuple(map(turn, refs)))
                                  for k, (t, refs) in by_key.items()} for r, by_key in snap.trajectories.items()}
        state.attempts = {s: msgspec.structs.replace(
            p.partial, conversation=contexts[p.conversation], requests={k: request(r) for k, r in p.requests.items()},
            turns=[ModelTurn(request(q), resp) for q, resp in p.turns]) for s, p in snap.attempts.items()}
    except IndexError as exc:  # inconsistent tables: as unreadable as torn msgpack
        raise msgspec.DecodeError(f"inconsistent replay buffer snapshot: {exc}") from None
    return state

