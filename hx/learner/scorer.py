"""The ``scorer`` policy kind: a small Flax NNX model that scores a tool's enumerated choices in context.

Each decision of a factorised tool call (``hx.learner.policy``) is a softmax over its
options. An option's score combines three things, all generic (no game, task or answer
knowledge anywhere):

- the context the harness built, as hashed word embeddings pooled over three views: the
  latest observation (the last non-assistant message), the earlier conversation, and the
  decision's header (tool and property names);
- the option's own words, embedded the same way;
- three surface features of the option against the context: the share of its words in the
  latest observation, the share in the earlier conversation, and how often the conversation
  already shows the option chosen (a memory the harness exposes, so loops can be learnt away).

The context term is weighted by ``context_gain``, 0 by default: trained on a few tasks per game
it learns preferences tied to those tasks' rooms, which do not carry over to unseen tasks
(bench/results/2026-11-27-learner-figures.md), while the option's words and the surface features do. A larger gain
turns it on; checkpoints written before the setting existed load with their gain of 1.

Words are hashed (crc32) into a fixed vocabulary, so any text is servable and a checkpoint
needs no tokenizer file. Shapes are padded to buckets: a round of training and a game's
changing option lists reuse a handful of compiled programs. The model is small (~0.2M
parameters by default) and a training step on two CPU cores takes milliseconds.
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hx.learner.errors import PolicyError, Unservable
from hx.learner.policy import (
    Batch,
    Decision,
    Generation,
    Policy,
    Sample,
    bucket,
    decisions_of,
    enum_text,
    enumerated,
    playable,
)
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema

SIZES: dict[str, int] = {"vocab": 4096, "dim": 48, "hidden": 96, "obs_len": 64, "hist_len": 128, "head_len": 8,
                         "option_len": 8}
"""The scorer's sizes, each a positive integer."""
DEFAULTS: dict[str, int | float] = {**SIZES, "context_gain": 0.0}
"""The sizes and ``context_gain``, the weight of the context term in an option's score."""
FEATURES = 3
_WORD = re.compile(r"[a-z0-9]+")
_NEG = -1e9


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words of a text."""
    return _WORD.findall(text.lower())


def _ids(tokens: Sequence[str], vocab: int) -> list[int]:
    # id 0 is padding: hashed words land in 1 .. vocab-1
    return [1 + zlib.crc32(t.encode()) % (vocab - 1) for t in tokens]


def _pad(ids: Sequence[int], length: int, *, keep_last: bool = False) -> list[int]:
    ids = list(ids[-length:] if keep_last else ids[:length])
    return ids + [0] * (length - len(ids))


def render(message: Message) -> str:
    """A message as plain text: its content and any tool calls it made."""
    calls = " ".join(f"{c.name} {' '.join(enum_text(v) for v in c.input.values())}" for c in message.tool_calls)
    return f"{message.content} {calls}".strip()


_WORDS: dict[int, tuple[Message, list[str]]] = {}
_MAX_WORDS = 65536


def message_words(message: Message) -> list[str]:
    """The words of a message, cached by identity: the turns of an attempt share their messages."""
    hit = _WORDS.get(id(message))
    if hit is not None and hit[0] is message:
        return hit[1]
    if len(_WORDS) >= _MAX_WORDS:
        _WORDS.clear()
    found = words(render(message))
    _WORDS[id(message)] = (message, found)  # holding the message keeps its id from being reused
    return found


class Context:
    """The views of a request a decision is scored in: the latest observation, the earlier conversation, past picks."""

    def __init__(self, messages: Sequence[Message], hist_len: int = SIZES["hist_len"]) -> None:
        last = max((i for i, m in enumerate(messages) if m.role != "assistant"), default=-1)
        self.obs = message_words(messages[last]) if last >= 0 else []
        hist: list[list[str]] = []
        held = 0
        for m in reversed(messages[:max(last, 0)]):  # only the most recent words are kept
            if held >= hist_len:
                break
            if m.role != "system":
                hist.append(message_words(m))
                held += len(hist[-1])
        self.hist = [w for ws in reversed(hist) for w in ws][-hist_len:] if hist else []
        self.picked: Counter[str] = Counter(enum_text(v) for m in messages if m.role == "assistant"
                                            for c in m.tool_calls for v in c.input.values())
        self._obs, self._hist = set(self.obs), set(self.hist)

    def features(self, option: str) -> list[float]:
        """Surface features of one option against this context."""
        ws = words(option) or [option.lower()]
        return [sum(w in self._obs for w in ws) / len(ws), sum(w in self._hist for w in ws) / len(ws),
                float(np.log1p(self.picked[option]))]


class ChoiceScorer(nnx.Module):
    """Scores each option of each decision; returns per-decision log-probabilities and entropies."""

    def __init__(self, config: Mapping[str, Any], *, rngs: nnx.Rngs) -> None:
        dim, hidden = config["dim"], config["hidden"]
        self.embed = nnx.Embed(config["vocab"], dim, rngs=rngs)
        # The layers that feed a score start at zero: an untrained scorer is the uniform policy (the
        # random baseline), and every path still gets a gradient through the option embeddings.
        zeros = nnx.initializers.zeros_init()
        self.context = nnx.Linear(3 * dim, hidden, kernel_init=zeros, rngs=rngs)
        self.option = nnx.Linear(dim, hidden, rngs=rngs)
        self.prior = nnx.Linear(hidden, 1, kernel_init=zeros, rngs=rngs)
        self.surface = nnx.Linear(FEATURES, 1, kernel_init=zeros, rngs=rngs)
        # The context term's weight. Under Adam every parameter moves at about the learning rate, so a small
        # gain makes the context path learn that much slower than an option's own words and surface features:
        # what holds on any task is learnt first, preferences tied to one task's rooms need lasting evidence.
        self.scale = float(config["context_gain"]) / float(np.sqrt(hidden))

    def _pool(self, ids: jax.Array) -> jax.Array:
        # mean of the embeddings of the non-padding ids along the last axis
        mask = (ids > 0).astype(jnp.float32)[..., None]
        total = (self.embed(ids) * mask).sum(-2)
        return total / jnp.maximum(mask.sum(-2), 1.0)

    def logits(self, batch: Mapping[str, jax.Array]) -> jax.Array:
        """Option scores ``[B, T, K]``, padding options at a large negative value."""
        o = nnx.gelu(self.option(self._pool(batch["options"])))                     # [B, T, K, H]
        score = self.prior(o)[..., 0] + self.surface(batch["features"])[..., 0]
        if self.scale:  # a static float: a context gain of 0 compiles the context term away, it would add 0
            obs, hist = self._pool(batch["obs"]), self._pool(batch["hist"])       # [B, D]
            head = self._pool(batch["head"])                                        # [B, T, D]
            t = head.shape[1]
            ctx = jnp.concatenate([jnp.repeat(obs[:, None], t, 1), jnp.repeat(hist[:, None], t, 1), head], -1)
            c = nnx.gelu(self.context(ctx))                                         # [B, T, H]
            score = score + jnp.einsum("bth,btkh->btk", c, o) * self.scale
        return jnp.where(batch["option_mask"] > 0, score, _NEG)

    def __call__(self, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Log-probability of the chosen option and the entropy of each decision, ``[B, T]``."""
        logp_all = jax.nn.log_softmax(self.logits(batch), axis=-1)
        chosen = jnp.take_along_axis(logp_all, batch["chosen"][..., None], axis=-1)[..., 0]
        p = jnp.exp(logp_all) * (batch["option_mask"] > 0)
        entropy = -(p * jnp.where(batch["option_mask"] > 0, logp_all, 0.0)).sum(-1)
        mask = batch["mask"]
        return chosen * mask, entropy * mask


@functools.partial(jax.jit, static_argnums=0)
def _option_logits(graph: nnx.GraphDef[ChoiceScorer], state: nnx.State[Any, Any],
                   batch: dict[str, jax.Array]) -> jax.Array:
    # jax.jit over a split model: nnx.jit's graph bookkeeping costs more than this small forward pass
    model: ChoiceScorer = nnx.merge(graph, state)
    return model.logits(batch)


class ScorerPolicy(Policy):
    """The ``scorer`` kind: a ``ChoiceScorer`` and the encoding of requests into its arrays."""

    kind = "scorer"
    legacy = {"context_gain": 1.0}

    @classmethod
    def build(cls, config: Mapping[str, Any], files: Mapping[str, bytes], *, seed: int = 0) -> ScorerPolicy:
        """A freshly initialised scorer; unknown config keys are an error."""
        unknown = sorted(set(config) - {*DEFAULTS, "kind"})
        if unknown:
            raise PolicyError(f"scorer config: unknown key(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
        bad = [k for k in SIZES if k in config and not (isinstance(config[k], int) and config[k] > 0)]
        if bad:
            shown = ", ".join(f"{k}={config[k]!r}" for k in bad)
            raise PolicyError(f"scorer config: {shown} must be positive integers")
        gain = config.get("context_gain", DEFAULTS["context_gain"])
        if isinstance(gain, bool) or not isinstance(gain, int | float) or not 0 <= gain < math.inf:
            raise PolicyError(f"scorer config: context_gain={gain!r} must be a finite number >= 0")
        merged = {**SIZES, **{k: int(config[k]) for k in SIZES if k in config}, "context_gain": float(gain)}
        return cls(ChoiceScorer(merged, rngs=nnx.Rngs(seed)), {"kind": cls.kind, **merged})

    # --- encoding -----------------------------------------------------------------------------

    def _rows(self, ctx: Context, decisions: Sequence[tuple[Decision, int]]) -> dict[str, Any]:
        cfg = self.config
        v = cfg["vocab"]
        return {
            "obs": _pad(_ids(ctx.obs, v), cfg["obs_len"], keep_last=True),
            "hist": _pad(_ids(ctx.hist, v), cfg["hist_len"], keep_last=True),
            "head": [_pad(_ids(words(f"{d.tool} {d.prop}") or ["tool"], v), cfg["head_len"]) for d, _ in decisions],
            "options": [[_pad(_ids(words(o) or [o.lower()], v), cfg["option_len"]) for o in d.options]
                        for d, _ in decisions],
            "features": [[ctx.features(o) for o in d.options] for d, _ in decisions],
            "chosen": [c for _, c in decisions],
        }

    def _arrays(self, rows: Sequence[dict[str, Any]]) -> Batch:
        cfg = self.config
        b = bucket(len(rows), 1)
        t = bucket(max(len(r["chosen"]) for r in rows))
        k = bucket(max(len(opts) for r in rows for opts in r["options"]), 8)
        out: Batch = {
            "obs": np.zeros((b, cfg["obs_len"]), np.int32), "hist": np.zeros((b, cfg["hist_len"]), np.int32),
            "head": np.zeros((b, t, cfg["head_len"]), np.int32),
            "options": np.zeros((b, t, k, cfg["option_len"]), np.int32),
            "features": np.zeros((b, t, k, FEATURES), np.float32), "option_mask": np.zeros((b, t, k), np.float32),
            "chosen": np.zeros((b, t), np.int32), "mask": np.zeros((b, t), np.float32)}
        for i, r in enumerate(rows):
            out["obs"][i], out["hist"][i] = r["obs"], r["hist"]
            for j, opts in enumerate(r["options"]):
                out["head"][i, j] = r["head"][j]
                out["options"][i, j, :len(opts)] = opts
                out["features"][i, j, :len(opts)] = r["features"][j]
                out["option_mask"][i, j, :len(opts)] = 1.0
                out["chosen"][i, j] = r["chosen"][j]
                out["mask"][i, j] = 1.0
        return out

    def row(self, sample: Sample) -> dict[str, Any]:
        """The sample's decisions in its context; ``Unservable`` when the completion is no playable call."""
        calls = sample.completion.tool_calls
        if len(calls) != 1:
            raise Unservable(f"the scorer scores one tool call, the completion has {len(calls)}")
        return self._rows(Context(sample.messages, self.config["hist_len"]),
                          decisions_of(sample.tools, calls[0]))

    def collate(self, rows: Sequence[dict[str, Any]]) -> Batch:
        """Rows as padded arrays."""
        return self._arrays(rows)

    # --- acting -------------------------------------------------------------------------------

    def _distribution(self, ctx: Context, decision: Decision, temperature: float) -> np.ndarray:
        batch = self._arrays([self._rows(ctx, [(decision, 0)])])
        logits = np.asarray(_option_logits(*nnx.split(self.model), batch))
        scores = logits[0, 0, :len(decision.options)].astype(np.float64) / max(temperature, 1e-6)
        # np.max, not scores.max(): with numpy 2.5's stubs (3.12 and later) mypy matches no overload of
        # the method without an axis when it checks for 3.11, our python_version; the function is a
        # float64 scalar to mypy on numpy 2.4 and 2.5 alike.
        scores -= np.max(scores)
        out: np.ndarray = scores - np.log(np.exp(scores).sum())
        return out

    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema], *, seed: int,
            temperature: float = 1.0, max_tokens: int = 32) -> Generation:
        """Sample a tool, then a value per enumerated property; temperature 0 is greedy."""
        options = playable(tools)
        if not options:
            names = [t.name for t in tools] or "none"
            raise Unservable(f"no tool with enumerated inputs to choose from (tools offered: {names})")
        ctx, rng = Context(messages, self.config["hist_len"]), np.random.default_rng(seed)
        logprobs: list[TokenLogprob] = []

        def pick(decision: Decision) -> int:
            logp = self._distribution(ctx, decision, temperature or 1.0)
            index = int(np.argmax(logp)) if temperature == 0 else int(rng.choice(len(logp), p=np.exp(logp)))
            logprobs.append(TokenLogprob(token=decision.options[index], logprob=float(logp[index])))
            return index

        tool = options[0]
        if len(options) > 1:
            tool = options[pick(Decision(tool="", prop="", options=tuple(t.name for t in options)))]
        arguments: dict[str, Any] = {}
        for prop, values in enumerated(tool):
            arguments[prop] = values[pick(Decision(tool=tool.name, prop=prop,
                                                   options=tuple(enum_text(v) for v in values)))]
        return Generation(tool_calls=(ToolCall(id="call_0", name=tool.name, input=arguments),),
                          logprobs=tuple(logprobs), stop_reason="tool_use")
