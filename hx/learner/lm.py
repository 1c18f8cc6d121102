"""A small causal transformer LM in Flax NNX: RMSNorm, RoPE, causal self-attention, SwiGLU MLP.

Why not a library: google-tunix 0.1.7 has NNX Llama/Qwen definitions that run on this
jax/flax, but it costs 108 packages and 1.6 GB, its MLP weights start at zero (so trained
from scratch those layers get no gradient), and it measured no faster than an own model.
hx therefore keeps this small LM, sized by a plain dict; loading real checkpoints is for
later. Every weight is a plain ``nnx.Param``, so ``nnx.to_pure_dict(nnx.state(lm, nnx.Param))``
is the whole checkpoint.

Called on a batch (see ``hx.learner.lm_policy``), the model returns the log-probability and
entropy of every completion token under the masks of the batch: position ``pos`` of
``tokens`` predicts ``targets``, renormalised over the ``allowed`` tokens.

>>> import numpy as np
>>> lm = CausalLM(LM_DEFAULTS | {"vocab": 40, "d_model": 16, "mlp": 32}, nnx.Rngs(0))
>>> lm.logits(np.zeros((2, 5), np.int32)).shape
(2, 5, 40)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Array = jax.Array

LM_DEFAULTS: dict[str, Any] = {"vocab": 1024, "d_model": 96, "layers": 2, "heads": 4, "ctx": 256, "mlp": 256,
                               "tied": True, "rope_base": 10000.0}
"""The tiny default: about 0.3M parameters with a 1,024-token vocabulary, quick on a CPU."""

NEG = -1e9
"""Logit of a disallowed token: finite, so ``p * log p`` is 0 rather than NaN, yet ``exp`` underflows to 0."""


def rope(x: Array, positions: Array, base: float) -> Array:
    """Rotary position embedding of ``x`` [B, L, H, D] (D even) at integer ``positions`` [L]."""
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle = positions[:, None].astype(jnp.float32) * freq[None, :]  # [L, half]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


class RMSNorm(nnx.Module):
    """Root-mean-square normalisation with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32))
        self.eps = eps

    def __call__(self, x: Array) -> Array:
        """``x`` scaled to unit RMS over its last axis, times the learned scale."""
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.scale[...]


class Attention(nnx.Module):
    """Multi-head causal self-attention with rotary positions."""

    def __init__(self, d_model: int, heads: int, rope_base: float, rngs: nnx.Rngs) -> None:
        self.heads, self.head_dim, self.rope_base = heads, d_model // heads, rope_base
        self.qkv = nnx.Linear(d_model, 3 * d_model, use_bias=False, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, use_bias=False, rngs=rngs)

    def __call__(self, x: Array) -> Array:
        """Each position attends to itself and the positions before it."""
        b, n, d = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim), 3, axis=2)
        positions = jnp.arange(n)
        q = rope(q[:, :, 0], positions, self.rope_base)
        k = rope(k[:, :, 0], positions, self.rope_base)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(self.head_dim))
        causal = jnp.tril(jnp.ones((n, n), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, NEG), axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", weights, v[:, :, 0]).reshape(b, n, d))


class SwiGLU(nnx.Module):
    """The gated MLP: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, d_model: int, hidden: int, rngs: nnx.Rngs) -> None:
        self.gate = nnx.Linear(d_model, hidden, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(d_model, hidden, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, d_model, use_bias=False, rngs=rngs)

    def __call__(self, x: Array) -> Array:
        """The MLP of every position."""
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """One pre-norm transformer block: attention then MLP, each on a residual."""

    def __init__(self, config: Mapping[str, Any], rngs: nnx.Rngs) -> None:
        d = int(config["d_model"])
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(d, int(config["heads"]), float(config["rope_base"]), rngs)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, int(config["mlp"]), rngs)

    def __call__(self, x: Array) -> Array:
        """The block's update of the residual stream."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class CausalLM(nnx.Module):
    """The decoder-only LM; ``__call__`` maps an encoded batch to per-token (log-prob, entropy)."""

    def __init__(self, config: Mapping[str, Any], rngs: nnx.Rngs) -> None:
        vocab, d = int(config["vocab"]), int(config["d_model"])
        # A small embedding scale keeps the tied head's first distribution near uniform.
        self.embed = nnx.Embed(vocab, d, embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs) for _ in range(int(config["layers"]))])
        self.norm = RMSNorm(d)
        self.head = None if config["tied"] else nnx.Linear(d, vocab, use_bias=False, rngs=rngs)

    def hidden(self, tokens: Array) -> Array:
        """The final normalised hidden state [B, L, d] of every position of ``tokens`` [B, L]."""
        x = self.embed(jnp.asarray(tokens))
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def project(self, h: Array) -> Array:
        """Logits over the vocabulary of hidden states ``h`` [..., d]."""
        return self.embed.attend(h) if self.head is None else self.head(h)

    def logits(self, tokens: Array) -> Array:
        """Next-token logits [B, L, V] at every position of ``tokens`` [B, L]."""
        return self.project(self.hidden(tokens))

    def next_logits(self, tokens: Array, at: Array) -> Array:
        """Next-token logits [V] after position ``at`` of the single sequence ``tokens`` [1, L]."""
        h = jax.lax.dynamic_index_in_dim(self.hidden(tokens)[0], at, axis=0, keepdims=False)
        return self.project(h)

    def __call__(self, batch: Mapping[str, Any]) -> tuple[Array, Array]:
        """Log-prob and entropy [B, T] of each target token, over the tokens allowed at its position."""
        h = self.hidden(batch["tokens"])  # [B, L, d]
        pos = jnp.asarray(batch["pos"])
        at = jnp.take_along_axis(h, pos[..., None], axis=1)  # [B, T, d]: only the predicting positions
        logits = jnp.where(jnp.asarray(batch["allowed"]), self.project(at), NEG)
        logp_all = jax.nn.log_softmax(logits, axis=-1)
        logp = jnp.take_along_axis(logp_all, jnp.asarray(batch["targets"])[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        mask = jnp.asarray(batch["mask"])
        return logp * mask, entropy * mask


def param_count(model: nnx.Module) -> int:
    """The number of trainable parameters."""
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
