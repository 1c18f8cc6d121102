"""The trainable policy's port: what a Flax model kind offers the provider and the learner.

A policy answers a logged request (messages and tools as the harness built them) with a
completion and the log-probability of every *unit* it produced, and scores a logged
completion under its current parameters, unit by unit. The units depend on the kind:

- ``scorer``: one unit per categorical decision. A tool call on a tool whose input has
  enumerated properties is factorised like ``random:`` does it: which tool (only when more
  than one is playable), then one value per enumerated property, in schema order.
- ``lm``: one unit per generated token.

The learner never sees a kind's internals: ``encode`` turns samples into a padded batch of
numpy arrays, and the kind's module maps that batch to per-unit log-probabilities and
entropies. Every batch holds ``mask`` (``[B, T]``, 1.0 where a unit exists); the learner
adds ``old_lp``, ``ref_lp`` (``[B, T]``) and ``adv`` (``[B]``).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import msgspec
import numpy as np
from flax import nnx

from hx.learner.errors import PolicyError, Unservable
from hx.learner.kinds import KINDS
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema

Batch = dict[str, np.ndarray]
"""Named arrays, all with the batch on axis 0; ``mask`` [B, T] marks the units that exist."""


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """One categorical choice of a factorised tool call."""

    tool: str
    prop: str
    """The enumerated property decided, or ``""`` for the choice of the tool itself."""
    options: tuple[str, ...]
    """The choices as text (non-string enum values JSON-encoded)."""


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """What a policy produced for one request: the answer and its per-unit log-probabilities."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    stop_reason: str = "tool_use"


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """One logged model turn as training data: the context, what was produced, its behaviour log-probs."""

    messages: tuple[Message, ...]
    tools: tuple[ToolSchema, ...]
    completion: Message
    """The assistant message as the model produced it (the logged response)."""
    logprobs: tuple[float, ...] = ()
    """Behaviour log-probability of each unit, as logged when the completion was produced."""
    advantage: float = 0.0


def enum_text(value: Any) -> str:
    """A choice as text: strings verbatim, anything else as JSON."""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def enumerated(tool: ToolSchema) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """A tool's enumerated properties, (name, allowed values) in schema order."""
    properties = tool.input_schema.get("properties")
    if not isinstance(properties, dict):
        return ()
    return tuple((name, tuple(prop["enum"])) for name, prop in properties.items()
                 if isinstance(prop, dict) and isinstance(prop.get("enum"), list) and prop["enum"])


def playable(tools: Sequence[ToolSchema]) -> tuple[ToolSchema, ...]:
    """The tools with at least one enumerated property."""
    return tuple(t for t in tools if enumerated(t))


def decisions_of(tools: Sequence[ToolSchema], call: ToolCall) -> list[tuple[Decision, int]]:
    """The decisions a logged tool call made, each with the index chosen; ``Unservable`` when it is not one."""
    options = playable(tools)
    names = [t.name for t in options]
    if call.name not in names:
        raise Unservable(f"tool call {call.name!r} is not one of the playable tools {names}")
    tool = options[names.index(call.name)]
    out: list[tuple[Decision, int]] = []
    if len(options) > 1:
        out.append((Decision(tool="", prop="", options=tuple(names)), names.index(call.name)))
    for prop, values in enumerated(tool):
        texts = tuple(enum_text(v) for v in values)
        chosen = enum_text(call.input.get(prop))
        if chosen not in texts:
            raise Unservable(f"tool call {call.name!r}: {prop}={chosen!r} is not one of its {len(texts)} choices")
        out.append((Decision(tool=tool.name, prop=prop, options=texts), texts.index(chosen)))
    return out


def policy_kind(kind: str) -> type[Policy]:
    """The policy class of a kind (an ``hx.policies`` entry point); ``PolicyError`` naming the known kinds otherwise."""
    if kind not in KINDS:
        raise PolicyError(f"unknown policy kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS.load(kind)


def bucket(n: int, minimum: int = 1) -> int:
    """The padded size for ``n``: the next power of two, at least ``minimum``, so shapes repeat across rounds."""
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


@functools.partial(jax.jit, static_argnums=0)
def _units(graph: nnx.GraphDef[Any], state: nnx.State[Any, Any], batch: Batch) -> tuple[jax.Array, jax.Array]:
    # jitted per bucketed batch shape; op by op, a first scoring pass takes seconds
    model = nnx.merge(graph, state)
    logp, entropy = model(batch)
    return logp, entropy


class Policy(ABC):
    """A trainable Flax NNX model kind behind one interface: act, score, encode."""

    kind: ClassVar[str]
    legacy: ClassVar[Mapping[str, Any]] = {}
    """Config keys added after the kind's first checkpoints, with the value those checkpoints were made under:
    a checkpoint whose ``config.json`` lacks one is rebuilt with it, so it serves exactly as it did."""

    def __init__(self, model: nnx.Module, config: Mapping[str, Any]) -> None:
        self.model = model
        self.config = dict(config)

    @classmethod
    @abstractmethod
    def build(cls, config: Mapping[str, Any], files: Mapping[str, bytes], *, seed: int = 0) -> Policy:
        """A freshly initialised policy of this kind from its config and side files (e.g. ``tokenizer.json``)."""

    def files(self) -> dict[str, bytes]:
        """Side files stored beside the weights in a checkpoint (a tokenizer); none by default."""
        return {}

    @abstractmethod
    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema], *, seed: int,
            temperature: float = 1.0, max_tokens: int = 32) -> Generation:
        """Sample an answer (seeded: the same request and seed give the same answer); ``Unservable`` if none."""

    @abstractmethod
    def row(self, sample: Sample) -> Any:
        """One sample's model inputs, unpadded; ``Unservable`` when its completion is not this policy's to score.

        Rows depend on the sample only, not on the parameters: the learner keeps them across
        passes, so a trajectory is encoded once however many rounds it stays in the window.
        """

    @abstractmethod
    def collate(self, rows: Sequence[Any]) -> Batch:
        """Rows as a batch with ``mask``, padded to bucketed shapes."""

    def encode(self, samples: Sequence[Sample]) -> Batch:
        """The model inputs of ``samples`` with ``mask``, padded to bucketed shapes; ``Unservable`` names a bad one."""
        rows = []
        for i, sample in enumerate(samples):
            try:
                rows.append(self.row(sample))
            except Unservable as exc:
                raise Unservable(f"sample {i}: {exc}") from None
        return self.collate(rows)

    def units(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Per-unit log-probabilities and entropies ``[B, T]`` of an encoded batch under the current parameters."""
        logp, entropy = _units(*nnx.split(self.model), batch)
        return np.asarray(logp), np.asarray(entropy)

    def score(self, samples: Sequence[Sample]) -> list[tuple[float, ...]]:
        """The log-probability of each unit of each sample's completion under the current parameters."""
        if not samples:
            return []
        batch = self.encode(samples)
        logp, _ = self.units(batch)
        mask = batch["mask"]
        return [tuple(float(x) for x in logp[i][mask[i] > 0]) for i in range(len(samples))]
