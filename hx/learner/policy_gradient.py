"""The clipped policy-gradient family GRPO and RLOO share: its config and its loss.

The learner sees a policy kind only through its model: ``model(batch)`` returns
``(logp, entropy)``, both ``[B, T]``, one entry per unit (a token or a categorical decision).
Each batch holds ``mask`` ``[B, T]`` and the learner's additions ``old_lp`` ``[B, T]``
(behaviour log-probs), ``ref_lp`` ``[B, T]`` (reference log-probs; read only when
``kl_beta > 0``) and ``adv`` ``[B]`` (the sample's advantage, from its algorithm). The
algorithms of the family differ only in their advantages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import msgspec
from jax.typing import ArrayLike

from hx.learner.errors import PolicyError

Array = jax.Array
"""A JAX array (alias for annotations)."""


class PolicyGradientConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Hyper-parameters of the clipped policy-gradient step; an algorithm's config extends it (tagged with its name).

    The training step reads the optimiser's, the pass's and ``needs_reference``; the loss the
    rest. Defaults suit a small model trained from scratch.
    """

    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    """PPO clip range: the ratio is clipped to ``[1 - clip_eps, 1 + clip_eps_high]``."""
    clip_eps_high: float | None = None
    """Upper clip range (DAPO's clip-higher); None: ``clip_eps``, a symmetric range."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy; 0 turns it (and ``ref_lp``) off."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    max_grad_norm: float = 1.0
    epochs: int = 1
    """Passes over a round's samples."""
    minibatch: int = 16
    """Samples per optimiser step."""
    seed: int = 0
    """Seeds the minibatch shuffle."""

    @property
    def clip_high(self) -> float:
        """The upper clip range in force: ``clip_eps_high``, else ``clip_eps``."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def needs_reference(self) -> bool:
        """Whether the loss reads ``ref_lp`` (the reference policy's log-probs)."""
        return self.kl_beta > 0

    def checks(self) -> tuple[tuple[str, bool, str], ...]:
        """(field, holds, rule) for every field; a subclass adds its own to these."""
        return (
            ("learning_rate", self.learning_rate > 0, "> 0"),
            ("weight_decay", self.weight_decay >= 0, ">= 0"),
            ("clip_eps", 0 < self.clip_eps < 1, "in (0, 1)"),
            ("clip_eps_high", self.clip_eps_high is None or self.clip_eps_high > 0, "> 0 (or None)"),
            ("kl_beta", self.kl_beta >= 0, ">= 0"),
            ("entropy_coef", self.entropy_coef >= 0, ">= 0"),
            ("max_grad_norm", self.max_grad_norm > 0, "> 0"),
            ("epochs", self.epochs >= 1, ">= 1"),
            ("minibatch", self.minibatch >= 1, ">= 1"),
            ("seed", self.seed >= 0, ">= 0"),
        )

    def __post_init__(self) -> None:
        for name, ok, rule in self.checks():
            value = getattr(self, name)
            # NaN fails every comparison, so it lands here too.
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise PolicyError(f"{type(self).__name__}.{name} must be {rule} and finite, got {value!r}")


def finite_rewards(rewards: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """The groups' rewards as floats; ``PolicyError`` naming a group with a non-finite one."""
    out: dict[str, list[float]] = {}
    for key, values in rewards.items():
        rs = [float(r) for r in values]
        if not all(math.isfinite(r) for r in rs):
            raise PolicyError(f"group {key!r} has a non-finite reward: {rs}")
        out[key] = rs
    return out


def clipped_loss(logp: Array, entropy: Array, batch: Mapping[str, ArrayLike],
                 cfg: PolicyGradientConfig) -> tuple[Array, dict[str, Array]]:
    """The clipped surrogate loss, sequence-mean-token-mean over valid units, and its aux means."""
    valid = jnp.asarray(batch["mask"]) > 0
    mask = valid.astype(logp.dtype)
    # Padded units may hold any value, non-finite ones too: mask them out with `where` before any
    # other operation, so neither the loss nor its gradient sees them (zero times a non-finite value is not zero).
    logp = jnp.where(valid, logp, 0.0)
    entropy = jnp.where(valid, entropy, 0.0)
    old = jnp.where(valid, jnp.asarray(batch["old_lp"]), 0.0)
    has_units = mask.sum(axis=1) > 0
    adv = jnp.where(has_units, jnp.asarray(batch["adv"]), 0.0)[:, None]

    ratio = jnp.exp(logp - old)
    clipped = jnp.clip(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_high)
    per_unit = -jnp.minimum(ratio * adv, clipped * adv)
    if cfg.kl_beta > 0:
        delta = jnp.where(valid, jnp.asarray(batch["ref_lp"]), 0.0) - logp
        k3 = jnp.exp(delta) - delta - 1.0
        per_unit = per_unit + cfg.kl_beta * k3
    else:
        k3 = jnp.zeros_like(logp)
    if cfg.entropy_coef > 0:
        per_unit = per_unit - cfg.entropy_coef * entropy

    counts = mask.sum(axis=1)
    seq_mean = (per_unit * mask).sum(axis=1) / jnp.maximum(counts, 1.0)
    rows = has_units.astype(logp.dtype)
    loss = (seq_mean * rows).sum() / jnp.maximum(rows.sum(), 1.0)

    total = mask.sum()
    denom = jnp.maximum(total, 1.0)
    clip_active = ((adv > 0) & (ratio > 1.0 + cfg.clip_high)) | ((adv < 0) & (ratio < 1.0 - cfg.clip_eps))

    def unit_mean(x: Array) -> Array:
        return jax.lax.stop_gradient((x * mask).sum() / denom)

    aux = {"kl": unit_mean(k3), "clip_fraction": unit_mean(clip_active.astype(logp.dtype)),
           "entropy": unit_mean(entropy), "ratio": unit_mean(ratio), "units": jax.lax.stop_gradient(total)}
    return loss, aux
