"""The ``lm`` policy kind: a small causal LM that answers token by token, constrained to the enumerated choices.

The request is rendered to text (``render``) and tokenised; the most recent tokens are kept
so that the prompt plus the room the completion may need fits ``ctx``. The room depends only
on the tools (constrained) or on the ``gen`` setting (free), so ``act`` and ``encode`` cut
the prompt at the same place.

Constrained decoding, when a tool offers enumerated properties, factorises a call as
``random:`` and the scorer do (which tool when more than one is playable, then one value per
enumerated property). Each decision appends a header (``<decide>tool`` or
``<decide>TOOL.PROP``), then decodes one option token by token along a trie of the options'
token sequences (`` option<eos>`` each): the tokens off the trie are masked and the rest
renormalised, so every logged log-prob is a log-softmax over the allowed tokens. A forced
token (one allowed) costs no forward pass and has log-prob 0.

Free decoding, when nothing is playable, samples up to ``min(max_tokens, gen)`` tokens over
the whole vocabulary. Sampled token sequences need not be the tokenizer's own encoding of
the text they spell, and a logged message keeps only the text: so the log-probs ``act``
reports are those of the text's canonical tokens (one extra forward pass), which is what
``encode`` rebuilds. ``<eos>`` is a unit when the turn ended (logged count = tokens + 1).

Sampling is seeded (``numpy.random.default_rng(seed)``) and logs log-probs at the sampling
temperature; ``score`` and training see temperature 1. Temperature 0 decodes greedily and
logs the temperature-1 log-probs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import msgspec
import numpy as np
from flax import nnx
from tokenizers import Tokenizer

from hx.learner.errors import PolicyError, Unservable
from hx.learner.lm import LM_DEFAULTS, CausalLM
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
from hx.learner.tokenizer import (
    BOS,
    DECIDE,
    EOS,
    ROLES,
    SPECIAL_TOKENS,
    TOOLS,
    default_tokenizer,
    load_tokenizer,
    tokenizer_bytes,
)
from schemas.messages import Message, TokenLogprob, ToolCall, ToolSchema

DEFAULTS: dict[str, Any] = LM_DEFAULTS | {"gen": 32}
"""The model's settings plus ``gen``: the room kept for a free-text completion."""

Graph = nnx.GraphDef[Any]
State = nnx.State[Any, Any]
_MIN_LEN = 16
_MAX_CACHED = 512


def render(messages: Sequence[Message], tools: Sequence[ToolSchema]) -> str:
    """The prompt text: each message after its role marker, tool calls as text, the tool names, then the turn."""
    parts = [BOS]
    for m in messages:
        text = f"{m.name}: {m.content}" if m.role == "tool" and m.name else m.content
        for call in m.tool_calls:
            text += f"\n{call.name} {msgspec.json.encode(call.input).decode()}"
        parts.append(ROLES[m.role] + text + EOS)
    parts.append(TOOLS + " ".join(t.name for t in tools) + EOS)
    parts.append(ROLES["assistant"])
    return "".join(parts)


class Choice:
    """One decision made tokenisable: its header tokens and the trie of its options' token sequences."""

    def __init__(self, decision: Decision, tok: Tokenizer, eos: int) -> None:
        label = decision.prop and f"{decision.tool}.{decision.prop}"
        self.header = tuple(tok.encode(DECIDE + (label or "tool")).ids)
        self.index: dict[tuple[int, ...], int] = {}
        """Full token sequence to the first option spelling it (duplicate enum texts share one)."""
        nodes: dict[tuple[int, ...], set[int]] = {}
        for i, text in enumerate(decision.options):
            seq = (*tok.encode(" " + text).ids, eos)
            self.index.setdefault(seq, i)
            for k in range(len(seq)):
                nodes.setdefault(seq[:k], set()).add(seq[k])
        if any(seq in nodes for seq in self.index):
            raise Unservable(f"options of {label or 'the tool choice'} are ambiguous: one spells a prefix of another")
        self.children = {prefix: tuple(sorted(ids)) for prefix, ids in nodes.items()}
        """Token prefix to the tokens allowed next."""
        self.depth = max(len(seq) for seq in self.index)


class Plan(msgspec.Struct, frozen=True):
    """How a tool set is decided: the playable tools, their decisions, and the completion's room in tokens."""

    tools: tuple[ToolSchema, ...]
    choice: Decision | None
    decisions: dict[str, tuple[Decision, ...]]
    room: int


@functools.partial(jax.jit, static_argnums=0)
def _next_logits(graph: Graph, state: State, tokens: jax.Array, at: jax.Array) -> jax.Array:
    model: CausalLM = nnx.merge(graph, state)
    return model.next_logits(tokens, at)


@functools.partial(jax.jit, static_argnums=0)
def _all_logits(graph: Graph, state: State, tokens: jax.Array) -> jax.Array:
    model: CausalLM = nnx.merge(graph, state)
    return model.logits(tokens)[0]


def _padded(seq: Sequence[int]) -> np.ndarray:
    out = np.zeros((1, bucket(len(seq), _MIN_LEN)), np.int32)
    out[0, :len(seq)] = seq
    return out


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max()
    return z - np.log(np.exp(z).sum())  # type: ignore[no-any-return]


class LMPolicy(Policy):
    """A causal LM policy: one unit per generated token; see the module docstring for decoding."""

    kind = "lm"

    def __init__(self, model: CausalLM, config: Mapping[str, Any], tokenizer: Tokenizer) -> None:
        super().__init__(model, config)
        self.tokenizer = tokenizer
        self.eos = SPECIAL_TOKENS.index(EOS)  # load_tokenizer checked the special tokens' ids
        self.ctx, self.gen = int(self.config["ctx"]), int(self.config["gen"])
        self._pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.get_vocab_size())]
        self._choices: dict[Decision, Choice] = {}
        self._plans: dict[bytes, Plan] = {}

    @classmethod
    def build(cls, config: Mapping[str, Any], files: Mapping[str, bytes], *, seed: int = 0) -> LMPolicy:
        """A fresh LM from ``config`` (missing keys take ``DEFAULTS``), with ``tokenizer.json`` or the default one."""
        unknown = sorted(set(config) - {*DEFAULTS, "kind"})
        if unknown:
            raise PolicyError(f"lm config: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
        cfg = DEFAULTS | {k: v for k, v in config.items() if k != "kind"}
        d, heads = int(cfg["d_model"]), int(cfg["heads"])
        if d % heads or (d // heads) % 2:
            raise PolicyError(f"lm config: d_model {d} must split into {heads} heads of even size (RoPE)")
        if not 0 < int(cfg["gen"]) < int(cfg["ctx"]):
            raise PolicyError(f"lm config: gen {cfg['gen']} must be positive and below ctx {cfg['ctx']}")
        if "tokenizer.json" in files:
            tok = load_tokenizer(files["tokenizer.json"])
            if "vocab" in config and int(config["vocab"]) != tok.get_vocab_size():
                raise PolicyError(f"lm config: vocab {config['vocab']} but tokenizer.json has "
                                  f"{tok.get_vocab_size()} tokens")
        else:
            tok = load_tokenizer(_default_tokenizer_bytes(int(cfg["vocab"])))
        cfg["vocab"] = tok.get_vocab_size()
        return cls(CausalLM(cfg, nnx.Rngs(seed)), {"kind": cls.kind, **cfg}, tok)

    def files(self) -> dict[str, bytes]:
        """The tokenizer, as ``tokenizer.json``."""
        return {"tokenizer.json": tokenizer_bytes(self.tokenizer)}

    # -- requests to tokens -------------------------------------------------------------------------------------

    def choice(self, decision: Decision) -> Choice:
        """The tokenised form of a decision (cached: the same tools come back call after call)."""
        found = self._choices.get(decision)
        if found is None:
            if len(self._choices) >= _MAX_CACHED:
                self._choices.clear()
            found = self._choices[decision] = Choice(decision, self.tokenizer, self.eos)
        return found

    def plan(self, tools: Sequence[ToolSchema]) -> Plan:
        """The decisions a call on ``tools`` makes, as ``decisions_of`` factorises them, and the room they need."""
        key = hashlib.sha256(msgspec.json.encode(tuple(tools))).digest()
        found = self._plans.get(key)
        if found is not None:
            return found
        options = playable(tools)
        names = tuple(t.name for t in options)
        choice = Decision(tool="", prop="", options=names) if len(options) > 1 else None
        decisions = {t.name: tuple(Decision(tool=t.name, prop=p, options=tuple(enum_text(v) for v in values))
                                   for p, values in enumerated(t)) for t in options}

        def need(ds: Sequence[Decision]) -> int:
            return sum(len(c.header) + c.depth for c in map(self.choice, ds))

        room = (need([choice]) if choice else 0) + max((need(ds) for ds in decisions.values()), default=self.gen)
        if room >= self.ctx:
            raise Unservable(f"the tools' decisions need {room} tokens, more than ctx {self.ctx} allows")
        if len(self._plans) >= _MAX_CACHED:
            self._plans.clear()
        found = self._plans[key] = Plan(options, choice, decisions, room)
        return found

    def prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema], room: int) -> list[int]:
        """The prompt's tokens, the most recent ``ctx - room`` of them."""
        ids: list[int] = self.tokenizer.encode(render(messages, tools)).ids
        return ids[-(self.ctx - room):]

    # -- acting -------------------------------------------------------------------------------------------------

    def act(self, messages: Sequence[Message], tools: Sequence[ToolSchema], *, seed: int,
            temperature: float = 1.0, max_tokens: int = 32) -> Generation:
        """A seeded answer: a constrained tool call when a tool is playable, else free text (see module docstring)."""
        plan = self.plan(tools)
        graph, state = nnx.split(self.model)
        rng = np.random.default_rng(seed)
        seq = self.prompt(messages, tools, plan.room)
        out: list[TokenLogprob] = []

        def step(allowed: Sequence[int] | None) -> int:
            """Sample one token among ``allowed`` (all when None) and log its log-prob."""
            if allowed is not None and len(allowed) == 1:
                token, lp = allowed[0], 0.0
            else:
                logits = np.asarray(_next_logits(graph, state, _padded(seq), np.int32(len(seq) - 1)), np.float64)
                z = logits if allowed is None else logits[list(allowed)]
                lp_all = _log_softmax(z / temperature if temperature > 0 else z)
                k = int(np.argmax(lp_all)) if temperature <= 0 else int(rng.choice(len(z), p=np.exp(lp_all)))
                token, lp = (k if allowed is None else allowed[k]), float(lp_all[k])
            seq.append(token)
            out.append(TokenLogprob(token=self._pieces[token], logprob=lp))
            return token

        if not plan.tools:
            return self._free(seq, step, graph, state, min(max_tokens, self.gen), temperature)

        def decide(decision: Decision) -> int:
            c = self.choice(decision)
            seq.extend(c.header)
            prefix: tuple[int, ...] = ()
            while prefix not in c.index:
                prefix = (*prefix, step(c.children[prefix]))
            return c.index[prefix]

        tool = plan.tools[decide(plan.choice)] if plan.choice else plan.tools[0]
        values = dict(enumerated(tool))
        arguments = {d.prop: values[d.prop][decide(d)] for d in plan.decisions[tool.name]}
        call = ToolCall(id="call_0", name=tool.name, input=arguments)
        return Generation(tool_calls=(call,), logprobs=tuple(out), stop_reason="tool_use")

    def _free(self, seq: list[int], step: Callable[[Sequence[int] | None], int], graph: Graph, state: State, limit: int,
              temperature: float) -> Generation:
        """Free text: sample to ``<eos>`` or ``limit``, then log-probs of the text's canonical tokens."""
        start = len(seq)
        while len(seq) - start < limit and step(None) != self.eos:
            pass
        ended = seq[-1] == self.eos and len(seq) > start
        content = self.tokenizer.decode(seq[start:len(seq) - ended], skip_special_tokens=False)
        units = self.tokenizer.encode(content).ids + [self.eos] * ended
        if not units:
            return Generation(stop_reason="max_tokens")
        prompt = seq[:start][-(self.ctx - max(self.gen, len(units))):]
        full = prompt + units
        logits = np.asarray(_all_logits(graph, state, _padded(full)), np.float64)
        out = []
        for j, token in enumerate(units):
            z = logits[len(prompt) + j - 1]
            lp = _log_softmax(z / temperature if temperature > 0 else z)[token]
            out.append(TokenLogprob(token=self._pieces[token], logprob=float(lp)))
        return Generation(content=content, logprobs=tuple(out), stop_reason="end_turn" if ended else "max_tokens")

    # -- training batches --------------------------------------------------------------------------------------

    def row(self, sample: Sample) -> tuple[list[int], list[int], list[tuple[int, ...] | None]]:
        """One sample as (tokens, index of each unit's token in them, allowed next tokens per unit or None)."""
        plan = self.plan(sample.tools)
        calls = sample.completion.tool_calls
        logged = len(sample.logprobs)
        allowed: list[tuple[int, ...] | None] = []
        if not plan.tools:
            if calls:
                raise Unservable(f"a free-text completion was expected, it calls {[c.name for c in calls]}")
            units = self.tokenizer.encode(sample.completion.content).ids
            if logged in (0, len(units) + 1):
                units.append(self.eos)
            elif logged != len(units):
                raise Unservable(f"the text re-tokenises to {len(units)} tokens (+<eos>) but {logged} "
                                 f"log-probs were logged")
            seq = self.prompt(sample.messages, sample.tools, max(self.gen, len(units)))
            at = list(range(len(seq), len(seq) + len(units)))
            allowed = [None] * len(units)
            return seq + units, at, allowed
        if len(calls) != 1:
            raise Unservable(f"one tool call was expected, the completion has {len(calls)}")
        seq = self.prompt(sample.messages, sample.tools, plan.room)
        at = []
        for decision, index in decisions_of(sample.tools, calls[0]):
            c = self.choice(decision)
            seq.extend(c.header)
            option = next(s for s, i in c.index.items() if i == index)
            for k, token in enumerate(option):
                at.append(len(seq))
                allowed.append(c.children[option[:k]])
                seq.append(token)
        if logged and logged != len(at):
            raise Unservable(f"the call spells {len(at)} tokens but {logged} log-probs were logged")
        return seq, at, allowed

    def collate(self, rows: Sequence[tuple[list[int], list[int], list[tuple[int, ...] | None]]]) -> Batch:
        """``tokens``/``pos``/``targets``/``allowed``/``mask`` padded to buckets."""
        b = bucket(len(rows))
        n = bucket(max((len(r[0]) for r in rows), default=1), _MIN_LEN)
        t = bucket(max((len(r[1]) for r in rows), default=1), 8)
        batch: Batch = {"tokens": np.zeros((b, n), np.int32), "pos": np.zeros((b, t), np.int32),
                        "targets": np.zeros((b, t), np.int32), "allowed": np.ones((b, t, len(self._pieces)), bool),
                        "mask": np.zeros((b, t), np.float32)}
        for i, (seq, at, allowed) in enumerate(rows):
            batch["tokens"][i, :len(seq)] = seq
            batch["pos"][i, :len(at)] = np.asarray(at) - 1  # the position before a token predicts it
            batch["targets"][i, :len(at)] = [seq[j] for j in at]
            batch["mask"][i, :len(at)] = 1.0
            for j, ids in enumerate(allowed):
                if ids is not None:
                    batch["allowed"][i, j] = False
                    batch["allowed"][i, j, list(ids)] = True
        return batch


@functools.lru_cache(maxsize=4)
def _default_tokenizer_bytes(vocab: int) -> bytes:
    return tokenizer_bytes(default_tokenizer(vocab))
