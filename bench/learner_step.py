#!/usr/bin/env python
"""What GRPO costs: the learner's train step vs a pure forward+backward (and vs a plain update) on the same batch.

Run from the repository root::

    python bench/learner_step.py --kind scorer        # the scorer policy kind (hx.learner.scorer)
    python bench/learner_step.py --kind lm            # the LM policy kind (hx.learner.lm_policy)
    python bench/learner_step.py --kind toy           # a tiny model defined here, no policy kind needed
    python bench/learner_step.py --kind scorer --batch 64 --steps 100 --kl 0.04

In one process, on one model's initial parameters (copies) and one encoded batch of
synthetic samples (a tool ``act`` with an enum of 20 actions, a few messages of text), it
times, alternating so drift hits all three:

(a) ``PolicyTrainer.step`` (GRPO): the jitted GRPO loss, gradient, global norm, finiteness check and
    conditional AdamW update, metrics fetched to the host, the model updated in place;
(b) a pure forward+backward: ``jax.jit`` over ``nnx.split`` state of ``-mean(logp)`` over the
    valid units and its gradient, waited for (the issue's baseline);
(c) the same plus the optimiser chain's update (a plain training step).

All are warmed up (compiled) first; it prints the median and best of ``--steps`` timings
and the ratios of medians (target: GRPO / forward+backward at most 1.5). Measured on 2
CPU cores shared with a running benchmark (load ~3), jax 0.10.2, 2026-11-24::

    $ python bench/learner_step.py --kind scorer --steps 40
    GRPO step         median 5.43 ms  best 3.69 ms  (compiles: 1)
    forward+backward  median 4.16 ms  best 3.28 ms
      + AdamW update  median 4.77 ms  best 3.69 ms
    ratio GRPO / forward+backward 1.31 (target <= 1.5); GRPO / plain update 1.14

Same machine: scorer ``--batch 256`` 1.04 (56 ms forward+backward); lm (320k params,
16 x 256 tokens) 1.00 (312 ms). With 16 samples the fixed cost of the GRPO step's extra
work (ratio, clip, finiteness check, metrics to the host) shows; it vanishes in a real
pass's 256-sample minibatches. The medians move 10-30 % with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
from flax import nnx

from hx.learner.grpo import GRPO, GRPOConfig
from hx.learner.policy import Batch, Sample, bucket, policy_kind
from hx.learner.train_step import PolicyTrainer
from schemas.messages import Message, ToolCall, ToolSchema

ACTIONS = ("north", "south", "east", "west", "take coin", "open door", "close door", "look", "inventory",
           "take key", "unlock door", "drop key", "read note", "eat apple", "climb ladder", "wait",
           "open chest", "take sword", "light lamp", "go up")
TOOL = ToolSchema(name="act", description="Take one action in the game.",
                  input_schema={"type": "object", "properties": {"action": {"type": "string", "enum": list(ACTIONS)}},
                                "required": ["action"]})
ROOMS = ("kitchen", "cellar", "garden", "hall", "attic", "library")


def synth_samples(n: int, seed: int) -> list[Sample]:
    """``n`` logged turns of a text game: a system prompt, a few observations and moves, one ``act`` call."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        messages = [Message(role="system", content="You play a text adventure. Use the act tool."),
                    Message(role="user", content=f"You are in the {ROOMS[i % len(ROOMS)]}. Find the coin.")]
        for turn in range(int(rng.integers(1, 4))):
            action = ACTIONS[int(rng.integers(len(ACTIONS)))]
            call = ToolCall(id=f"c{turn}", name="act", input={"action": action})
            messages += [Message(role="assistant", tool_calls=(call,)),
                         Message(role="tool", tool_call_id=call.id, name="act",
                                 content=f"You {action}. The {ROOMS[int(rng.integers(len(ROOMS)))]} is quiet.")]
        chosen = ACTIONS[int(rng.integers(len(ACTIONS)))]
        completion = Message(role="assistant", tool_calls=(ToolCall(id="c9", name="act", input={"action": chosen}),))
        out.append(Sample(messages=tuple(messages), tools=(TOOL,), completion=completion))
    return out


# --- toy kind: a model of this file's own, for when no policy kind is importable ---------------

_VOCAB, _CTX, _OPT = 1024, 64, 4


def _hash_ids(text: str, length: int) -> list[int]:
    ids = [1 + zlib.crc32(w.encode()) % (_VOCAB - 1) for w in text.lower().split()][-length:]
    return ids + [0] * (length - len(ids))


class ToyScorer(nnx.Module):
    """Bag-of-words context against bag-of-words options: one categorical decision per sample."""

    def __init__(self, *, rngs: nnx.Rngs, dim: int = 64) -> None:
        self.embed = nnx.Embed(_VOCAB, dim, rngs=rngs)
        self.ctx = nnx.Linear(dim, dim, rngs=rngs)
        self.opt = nnx.Linear(dim, dim, rngs=rngs)

    def _pool(self, ids: jax.Array) -> jax.Array:
        m = (ids > 0).astype(jnp.float32)[..., None]
        return (self.embed(ids) * m).sum(-2) / jnp.maximum(m.sum(-2), 1.0)

    def __call__(self, batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """Per-decision log-prob of the chosen option and entropy, ``[B, 1]``."""
        c = jnp.tanh(self.ctx(self._pool(batch["ctx"])))                 # [B, D]
        o = jnp.tanh(self.opt(self._pool(batch["options"])))             # [B, K, D]
        scores = jnp.where(batch["option_mask"] > 0, jnp.einsum("bd,bkd->bk", c, o), -1e9)
        lp = jax.nn.log_softmax(scores, -1)
        chosen = jnp.take_along_axis(lp, batch["chosen"][:, None], -1)
        ent = -(jnp.exp(lp) * jnp.where(batch["option_mask"] > 0, lp, 0.0)).sum(-1, keepdims=True)
        return chosen, ent


def toy_encode(samples: Sequence[Sample]) -> Batch:
    """The toy model's arrays: hashed context words, option words, the chosen index; B bucketed, T = 1."""
    b, k = bucket(len(samples)), bucket(len(ACTIONS), 8)
    out: Batch = {"ctx": np.zeros((b, _CTX), np.int32), "options": np.zeros((b, k, _OPT), np.int32),
                  "option_mask": np.zeros((b, k), np.float32), "chosen": np.zeros((b,), np.int32),
                  "mask": np.zeros((b, 1), np.float32)}
    for i, s in enumerate(samples):
        text = " ".join(m.content or " ".join(c.input["action"] for c in m.tool_calls) for m in s.messages)
        out["ctx"][i] = _hash_ids(text, _CTX)
        for j, a in enumerate(ACTIONS):
            out["options"][i, j] = _hash_ids(a, _OPT)
        out["option_mask"][i, :len(ACTIONS)] = 1.0
        out["chosen"][i] = ACTIONS.index(s.completion.tool_calls[0].input["action"])
        out["mask"][i, 0] = 1.0
    return out


def build(kind: str, config: Mapping[str, Any], seed: int) -> tuple[nnx.Module, Callable[[Sequence[Sample]], Batch]]:
    """A model of ``kind`` and its encoder."""
    if kind == "toy":
        return ToyScorer(rngs=nnx.Rngs(seed)), toy_encode
    policy = policy_kind(kind).build(config=config, files={}, seed=seed)
    return policy.model, policy.encode


def neg_mean_logp(model: nnx.Module, batch: Mapping[str, jax.Array]) -> jax.Array:
    """The baselines' loss: minus the mean log-prob of the valid units."""
    logp, _ = model(batch)
    mask = batch["mask"]
    loss: jax.Array = -(logp * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    return loss


def plain_step(model: nnx.Module, tx: optax.GradientTransformation) -> tuple[Callable[..., Any], nnx.State[Any, Any]]:
    """A jitted forward + backward of ``-mean(logp)`` over valid units + optimiser update, over split state."""
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    @jax.jit
    def step(state: nnx.State[Any, Any], batch: Mapping[str, jax.Array]) -> tuple[nnx.State[Any, Any], jax.Array]:
        m, opt = nnx.merge(graphdef, state)

        loss, grads = nnx.value_and_grad(neg_mean_logp)(m, batch)
        opt.update(m, grads)
        return nnx.state((m, opt)), loss

    return step, state


def grad_step(model: nnx.Module) -> tuple[Callable[..., Any], nnx.State[Any, Any]]:
    """A jitted pure forward + backward of ``-mean(logp)`` over valid units: the gradient, no update."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state: nnx.State[Any, Any], batch: Mapping[str, jax.Array]) -> tuple[jax.Array, nnx.State[Any, Any]]:
        m = nnx.merge(graphdef, state)

        loss, grads = nnx.value_and_grad(neg_mean_logp)(m, batch)
        return loss, grads

    return step, state


def main() -> None:
    """Parse arguments, build the batch, time both steps, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("toy", "scorer", "lm"), default="scorer")
    ap.add_argument("--config", default="{}", help="the kind's config as JSON")
    ap.add_argument("--batch", type=int, default=16, help="samples in the batch")
    ap.add_argument("--group", type=int, default=4, help="samples per reward group")
    ap.add_argument("--steps", type=int, default=50, help="timed steps of each kind")
    ap.add_argument("--kl", type=float, default=0.0, help="kl_beta of the GRPO step")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    print(f"jax {jax.__version__} backend={jax.default_backend()} devices={jax.devices()}")
    model, encode = build(args.kind, json.loads(args.config), args.seed)
    plain_model = nnx.clone(model)  # same initial parameters, updated separately
    samples = synth_samples(args.batch, args.seed)
    batch = encode(samples)
    n_rows, _ = batch["mask"].shape

    rng = np.random.default_rng(args.seed)
    logp, _ = model(batch)
    mask = batch["mask"]
    # Behaviour log-probs a little off the current ones, so some ratios clip; a reference nearby.
    old_lp = (np.asarray(logp) + rng.normal(0, 0.3, mask.shape)).astype(np.float32) * mask
    ref_lp = ((np.asarray(logp) + rng.normal(0, 0.1, mask.shape)).astype(np.float32) * mask
              if args.kl > 0 else np.zeros_like(mask))
    rewards = {f"g{g}": [float(rng.integers(0, 2)) + 0.1 * j for j in range(args.group)]
               for g in range(-(-args.batch // args.group))}
    cfg = GRPOConfig(kl_beta=args.kl)
    by_group = GRPO().advantages(rewards, cfg)
    advs = [a for g in sorted(rewards, key=lambda k: int(k[1:])) for a in by_group[g]]
    adv = np.zeros(n_rows, np.float32)
    adv[:args.batch] = advs[:args.batch]
    batch = {**batch, "old_lp": old_lp, "ref_lp": ref_lp, "adv": adv}
    params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    shapes = " ".join(f"{k}{list(v.shape)}" for k, v in sorted(batch.items()))
    print(f"kind={args.kind} params={params:,} samples={args.batch} batch: {shapes}")

    trainer = PolicyTrainer(model, cfg)
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay))
    step, state = plain_step(plain_model, tx)
    grad, grad_state = grad_step(nnx.clone(plain_model))
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}

    def run_grad() -> None:
        loss, grads = grad(grad_state, device_batch)
        for leaf in jax.tree.leaves(grads):
            leaf.block_until_ready()
        float(loss)

    def run_plain() -> None:
        nonlocal state
        state, loss = step(state, device_batch)
        float(loss)

    t0 = time.perf_counter()
    trainer.step(device_batch)
    t1 = time.perf_counter()
    run_plain()
    t2 = time.perf_counter()
    run_grad()
    print(f"first call (compile): GRPO {1e3 * (t1 - t0):.0f} ms, plain {1e3 * (t2 - t1):.0f} ms")
    for _ in range(3):
        trainer.step(device_batch)
        run_plain()
        run_grad()

    grpo_t: list[float] = []
    plain_t: list[float] = []
    grad_t: list[float] = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        metrics = trainer.step(device_batch)
        t1 = time.perf_counter()
        run_plain()
        t2 = time.perf_counter()
        run_grad()
        t3 = time.perf_counter()
        grpo_t.append(t1 - t0)
        plain_t.append(t2 - t1)
        grad_t.append(t3 - t2)
    g, p, f = statistics.median(grpo_t), statistics.median(plain_t), statistics.median(grad_t)
    print(f"last GRPO metrics: {metrics}")
    print(f"GRPO step         median {1e3 * g:.2f} ms  best {1e3 * min(grpo_t):.2f} ms  (compiles: {trainer.compiles})")
    print(f"forward+backward  median {1e3 * f:.2f} ms  best {1e3 * min(grad_t):.2f} ms")
    print(f"  + AdamW update  median {1e3 * p:.2f} ms  best {1e3 * min(plain_t):.2f} ms")
    print(f"ratio GRPO / forward+backward {g / f:.2f} (target <= 1.5); GRPO / plain update {g / p:.2f}")


if __name__ == "__main__":
    main()
