"""GRPO on a real small NNX model: the loss and gradient against numpy, the update's direction,
zero-spread groups, determinism, padding invariance, non-finite batches and compile reuse."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import pytest
from flax import nnx
from jax.typing import ArrayLike

from hx.learner.errors import NonFiniteLoss, PolicyError
from hx.learner.grpo import GRPO, GRPOConfig
from hx.learner.policy_gradient import clipped_loss
from hx.learner.train_step import PolicyTrainer, minibatches

F, H = 4, 8
"""Features per option and hidden width of the test scorer."""


class OptionScorer(nnx.Module):
    """Scores each option from its features with a one-hidden-layer MLP; log-softmax over the valid options."""

    def __init__(self, *, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(F, H, rngs=rngs)
        self.out = nnx.Linear(H, 1, use_bias=False, rngs=rngs)

    def __call__(self, batch: Mapping[str, ArrayLike]) -> tuple[jax.Array, jax.Array]:
        """Log-prob of the chosen option and entropy of each decision, ``[B, T]``."""
        feat, options, choice = (jnp.asarray(batch[k]) for k in ("feat", "opt_mask", "choice"))
        scores = self.out(jnp.tanh(self.hidden(feat)))[..., 0]
        scores = jnp.where(options > 0, scores, -1e9)
        logp = jax.nn.log_softmax(scores, axis=-1)
        chosen = jnp.take_along_axis(logp, choice[..., None], axis=-1)[..., 0]
        entropy = -jnp.where(options > 0, jnp.exp(logp) * logp, 0.0).sum(-1)
        return chosen, entropy


# --- numpy reference of the same model and loss, in float64 ---------------------------------

def np_forward(params: Mapping[str, Any], batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The scorer's math in numpy; masked options get probability exactly zero."""
    h = np.tanh(batch["feat"].astype(np.float64) @ params["hidden"]["kernel"] + params["hidden"]["bias"])
    s = np.where(batch["opt_mask"] > 0, (h @ params["out"]["kernel"])[..., 0], -np.inf)
    top = s.max(-1, keepdims=True)
    logp = s - (top + np.log(np.exp(s - top).sum(-1, keepdims=True)))
    chosen = np.take_along_axis(logp, batch["choice"][..., None], axis=-1)[..., 0]
    entropy = -np.where(batch["opt_mask"] > 0, np.exp(logp) * np.where(np.isfinite(logp), logp, 0.0), 0.0).sum(-1)
    return chosen, entropy


def np_loss(params: Mapping[str, Any], batch: Mapping[str, np.ndarray], cfg: GRPOConfig) -> dict[str, float]:
    """GRPO written out unit by unit: clipped surrogate + beta*k3 - coef*entropy, sequence-mean-token-mean."""
    logp, entropy = np_forward(params, batch)
    per_sample, ratios, k3s, clipped, ents = [], [], [], [], []
    for i in range(logp.shape[0]):
        terms = []
        for t in range(logp.shape[1]):
            if batch["mask"][i, t] == 0:
                continue
            a = float(batch["adv"][i])
            r = math.exp(logp[i, t] - batch["old_lp"][i, t])
            high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
            rc = min(max(r, 1 - cfg.clip_eps), 1 + high)
            d = batch["ref_lp"][i, t] - logp[i, t]
            k3 = math.exp(d) - d - 1 if cfg.kl_beta > 0 else 0.0
            terms.append(-min(r * a, rc * a) + cfg.kl_beta * k3 - cfg.entropy_coef * entropy[i, t])
            ratios.append(r)
            k3s.append(k3)
            ents.append(entropy[i, t])
            clipped.append(float((a > 0 and r > 1 + high) or (a < 0 and r < 1 - cfg.clip_eps)))
        if terms:
            per_sample.append(sum(terms) / len(terms))
    return {"loss": sum(per_sample) / len(per_sample), "ratio": float(np.mean(ratios)), "kl": float(np.mean(k3s)),
            "clip_fraction": float(np.mean(clipped)), "entropy": float(np.mean(ents))}


def np_grad(params: dict[str, Any], batch: Mapping[str, np.ndarray], cfg: GRPOConfig,
            h: float = 1e-6) -> dict[str, Any]:
    """Central finite differences of ``np_loss`` for every parameter."""
    grads: dict[str, Any] = {}
    for layer, arrays in params.items():
        grads[layer] = {}
        for name, value in arrays.items():
            g = np.zeros_like(value)
            for idx in np.ndindex(value.shape):
                orig = value[idx]
                value[idx] = orig + h
                up = np_loss(params, batch, cfg)["loss"]
                value[idx] = orig - h
                down = np_loss(params, batch, cfg)["loss"]
                value[idx] = orig
                g[idx] = (up - down) / (2 * h)
            grads[layer][name] = g
    return grads


# --- fixtures ---------------------------------------------------------------------------------

def params_of(model: nnx.Module) -> dict[str, Any]:
    """The model's parameters as nested float64 numpy arrays (copies)."""
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    return jax.tree.map(lambda x: np.array(x, dtype=np.float64), pure)  # type: ignore[no-any-return]


def variables_of(trainer: PolicyTrainer) -> list[np.ndarray]:
    """Every variable of model and optimiser (parameters, moments, step counts) as numpy copies."""
    return [np.array(x) for x in jax.tree.leaves(nnx.state((trainer.model, trainer.optimizer)))]


def make_batch(seed: int = 0, b: int = 4, t: int = 3, k: int = 5) -> dict[str, np.ndarray]:
    """Decisions of ``b`` samples, ``t`` units each (row 1 has two, row 3 one), ``k`` options (some masked)."""
    rng = np.random.default_rng(seed)
    opt_mask = np.ones((b, t, k), np.float32)
    mask = np.ones((b, t), np.float32)
    if b >= 4 and t >= 3:
        opt_mask[0, 1, 3:] = 0.0
        opt_mask[2, :, 4] = 0.0
        mask[1, 2:] = 0.0
        mask[3, 1:] = 0.0
    return {"feat": rng.normal(size=(b, t, k, F)).astype(np.float32), "opt_mask": opt_mask,
            "choice": rng.integers(0, 3, size=(b, t)).astype(np.int32), "mask": mask}


def with_learner(model: nnx.Module, batch: dict[str, np.ndarray], adv: list[float],
                 offsets: np.ndarray | None = None, seed: int = 1) -> dict[str, np.ndarray]:
    """``batch`` plus old_lp (current log-probs shifted by ``offsets``), ref_lp nearby and ``adv``."""
    logp, _ = model(batch)
    logp = np.asarray(logp)
    rng = np.random.default_rng(seed)
    shift = offsets if offsets is not None else np.zeros_like(logp)
    return {**batch, "old_lp": ((logp + shift) * batch["mask"]).astype(np.float32),
            "ref_lp": ((logp + rng.normal(0, 0.2, logp.shape)) * batch["mask"]).astype(np.float32),
            "adv": np.asarray(adv, np.float32)}


# Offsets of old_lp from the current log-probs: +-0.5 puts ratios at 0.61 / 1.65, well outside the
# clip range. With the advantages below the clip is active on two units (row 0: ratio 1.65, A > 0;
# row 1: 0.61, A < 0); row 2's last unit is out of range on the side where the min keeps the
# unclipped term; the other units sit near 1. Clip-higher at 0.8 lets row 0's 1.65 through: one active unit.
OFFSETS = np.array([[0.02, -0.5, 0.0], [0.5, 0.03, 0.0], [-0.04, 0.01, 0.5], [0.0, 0.0, 0.0]], np.float32)
ADV = [1.2, -0.7, 0.5, -1.0]
CONFIGS = {"plain": GRPOConfig(), "full": GRPOConfig(kl_beta=0.1, entropy_coef=0.05, clip_eps=0.2),
           "clip_higher": GRPOConfig(clip_eps_high=0.8)}
CLIPPED = {"plain": 2 / 9, "full": 2 / 9, "clip_higher": 1 / 9}


def jax_loss_and_grad(model: nnx.Module, batch: Mapping[str, np.ndarray],
                      cfg: GRPOConfig) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """``clipped_loss`` on the model, its aux and its gradient as nested numpy."""
    def fn(m: nnx.Module) -> tuple[jax.Array, dict[str, jax.Array]]:
        logp, entropy = m(batch)
        return clipped_loss(logp, entropy, batch, cfg)

    (loss, aux), grads = nnx.value_and_grad(fn, has_aux=True)(model)
    pure = jax.tree.map(lambda x: np.array(x, dtype=np.float64), nnx.to_pure_dict(grads))
    return float(loss), {k: float(v) for k, v in aux.items()}, pure


# --- the loss and its gradient ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loss_and_gradient_match_numpy_reference(name: str) -> None:
    cfg = CONFIGS[name]
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = with_learner(model, make_batch(), ADV, OFFSETS)
    ref = np_loss(params_of(model), batch, cfg)
    loss, aux, grads = jax_loss_and_grad(model, batch, cfg)
    assert loss == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
    assert ref["clip_fraction"] == pytest.approx(CLIPPED[name])
    for key in ("clip_fraction", "ratio", "kl", "entropy"):
        assert aux[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    assert aux["units"] == 9
    fd = np_grad(params_of(model), batch, cfg)
    for layer in fd:
        for param in fd[layer]:
            np.testing.assert_allclose(grads[layer][param], fd[layer][param], rtol=2e-3, atol=2e-6)
    assert np.abs(fd["hidden"]["kernel"]).max() > 1e-3  # the check is not vacuous


def test_step_applies_clipped_adamw_to_the_gradient() -> None:
    cfg = GRPOConfig(learning_rate=1e-2, weight_decay=0.1, max_grad_norm=0.05, kl_beta=0.1, entropy_coef=0.05)
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = with_learner(model, make_batch(), ADV, OFFSETS)
    before = params_of(model)
    _, _, grads = jax_loss_and_grad(model, batch, cfg)
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in jax.tree.leaves(grads)))
    assert norm > cfg.max_grad_norm  # global-norm clipping is active
    metrics = PolicyTrainer(model, cfg).step(batch)
    assert metrics.grad_norm == pytest.approx(norm, rel=1e-5)
    assert metrics.units == 9
    after = params_of(model)
    for layer in before:
        for name, p in before[layer].items():
            # First AdamW step: bias-corrected moments give g / (|g| + eps), then decoupled decay.
            g = grads[layer][name] * (cfg.max_grad_norm / norm)
            want = p - cfg.learning_rate * (g / (np.abs(g) + 1e-8) + cfg.weight_decay * p)
            np.testing.assert_allclose(after[layer][name], want, rtol=1e-5, atol=1e-6)


# --- direction of the update and zero advantages ----------------------------------------------

def test_positive_advantage_raises_log_prob_and_negative_lowers_it() -> None:
    model = OptionScorer(rngs=nnx.Rngs(1))
    # The same two-option decision twice, once choosing option 0 (A > 0), once option 1 (A < 0):
    # the loss falls only by moving probability from option 1 to option 0. (With more options or
    # unrelated decisions, AdamW's sign-like first step need not raise every positive sample.)
    base = make_batch(b=2, t=1, k=2)
    base["feat"][1] = base["feat"][0]
    base["choice"][:, 0] = [0, 1]
    batch = with_learner(model, base, [1.0, -1.0])
    before = np.asarray(model(batch)[0])[:, 0]
    metrics = PolicyTrainer(model, GRPOConfig(learning_rate=1e-2)).step(batch)
    after = np.asarray(model(batch)[0])[:, 0]
    assert metrics.grad_norm > 0
    assert after[0] > before[0] + 1e-4
    assert after[1] < before[1] - 1e-4


@pytest.mark.parametrize(("high", "low", "top"), [(None, 1.2, 1.45), (1.0, 2.0, 2.4)])
def test_the_upper_clip_bounds_how_far_a_rewarded_choice_rises_in_a_pass(high: float | None, low: float,
                                                                          top: float) -> None:
    # One rewarded choice, trained until the clipped surrogate stops its gradient: its ratio to the
    # behaviour probability ends just past 1 + eps (1.2 symmetric, 2.0 with clip-higher at 1.0): past it,
    # only Adam's momentum still moves it. This is what bounds a rare rewarded choice's rise per learner pass.
    model = OptionScorer(rngs=nnx.Rngs(2))
    batch = with_learner(model, make_batch(b=1, t=1, k=5), [1.0])
    trainer = PolicyTrainer(model, GRPOConfig(learning_rate=1e-3, clip_eps_high=high))
    for _ in range(300):
        trainer.step(batch)
    ratio = float(np.exp(np.asarray(model(batch)[0])[0, 0] - batch["old_lp"][0, 0]))
    assert low < ratio < top


def test_zero_spread_groups_get_zeros_and_population_std_is_used() -> None:
    out = GRPO().advantages({"a": [1.0, 2.0, 3.0], "same": [5.0, 5.0], "one": [7.0], "tiny": [0.1, 0.1, 0.1]},
                            GRPOConfig(adv_eps=1e-6))
    assert {k: v for k, v in out.items() if k != "a"} == {"same": [0.0, 0.0], "one": [0.0], "tiny": [0.0] * 3}
    want = (np.array([1.0, 2.0, 3.0]) - 2.0) / (np.std([1.0, 2.0, 3.0]) + 1e-6)
    np.testing.assert_allclose(out["a"], want, rtol=1e-12)
    with pytest.raises(PolicyError, match="'bad'"):
        GRPO().advantages({"bad": [1.0, float("nan")]}, GRPOConfig())


def test_all_zero_advantages_leave_parameters_unchanged() -> None:
    model = OptionScorer(rngs=nnx.Rngs(2))
    batch = with_learner(model, make_batch(), [0.0] * 4, OFFSETS)
    before = params_of(model)
    metrics = PolicyTrainer(model, GRPOConfig(learning_rate=1e-2, weight_decay=0.0)).step(batch)
    assert metrics.grad_norm == 0.0
    after = params_of(model)
    for layer in before:
        for name in before[layer]:
            assert np.array_equal(before[layer][name], after[layer][name])


# --- determinism, padding, non-finite batches, compiles ----------------------------------------

def test_same_seed_and_batches_give_bit_identical_parameters() -> None:
    cfg = GRPOConfig(learning_rate=1e-2, minibatch=2, epochs=2, seed=3, kl_beta=0.05)
    finals = []
    for _ in range(2):
        model = OptionScorer(rngs=nnx.Rngs(4))
        batch = with_learner(model, make_batch(seed=5), ADV, OFFSETS)
        trainer = PolicyTrainer(model, cfg)
        first = trainer.train_round(batch)
        second = trainer.train_round(batch)
        assert first.steps == second.steps == 4  # 2 epochs x 2 minibatches of 2
        finals.append(params_of(model))
    for a, b in zip(jax.tree.leaves(finals[0]), jax.tree.leaves(finals[1]), strict=True):
        assert np.array_equal(a, b)


def test_minibatches_cover_real_rows_once_and_keep_shapes() -> None:
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = with_learner(model, make_batch(b=4), ADV)
    batch = {k: np.concatenate([v, v[:1]] * 1 + [np.zeros_like(v[:3])]) for k, v in batch.items()}  # 8 rows
    batch["adv"][4] = 9.0  # a fifth real row, marked by its advantage
    parts = minibatches(batch, 3, seed=11)
    assert [p["mask"].shape for p in parts] == [(4, 3), (4, 3)]  # bucket(3) = 4 rows each
    real = [a for p in parts for a, m in zip(p["adv"], p["mask"], strict=True) if m.sum() > 0]
    assert sorted(real) == sorted([*ADV, 9.0])
    padded = parts[-1]["mask"].sum(axis=1) == 0
    assert padded.sum() == 3 and (parts[-1]["adv"][padded] == 0).all()
    assert [p["adv"].tolist() for p in minibatches(batch, 3, seed=11)] == [p["adv"].tolist() for p in parts]
    assert [p["adv"].tolist() for p in minibatches(batch, 3, seed=12)] != [p["adv"].tolist() for p in parts]


def test_padding_rows_and_units_change_neither_loss_nor_gradient() -> None:
    cfg = CONFIGS["full"]
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = with_learner(model, make_batch(), ADV, OFFSETS)
    rng = np.random.default_rng(9)
    padded: dict[str, np.ndarray] = {}
    for key, value in batch.items():
        # Four more rows and two more units; learner arrays there hold NaN, model inputs noise.
        shape = (8,) if key == "adv" else (8, 5, *value.shape[2:])
        if key in ("old_lp", "ref_lp", "adv"):
            fill = np.full(shape, np.nan, np.float32)
        elif key == "choice":
            fill = rng.integers(0, 3, shape).astype(value.dtype)
        else:
            fill = rng.normal(size=shape).astype(value.dtype)
        fill[tuple(slice(0, n) for n in value.shape)] = value
        padded[key] = fill
    padded["mask"][4:] = 0.0
    padded["mask"][:, 3:] = 0.0
    padded["opt_mask"] = np.abs(np.sign(padded["opt_mask"]))  # noise options stay selectable
    loss, aux, grads = jax_loss_and_grad(model, batch, cfg)
    loss_p, aux_p, grads_p = jax_loss_and_grad(model, padded, cfg)
    assert loss_p == pytest.approx(loss, rel=1e-6)
    assert aux_p == pytest.approx(aux, rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_p), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("key", ["old_lp", "adv"])
def test_non_finite_batch_raises_and_leaves_model_and_optimizer_unchanged(key: str) -> None:
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = with_learner(model, make_batch(), ADV, OFFSETS)
    trainer = PolicyTrainer(model, GRPOConfig(learning_rate=1e-2))
    trainer.step(batch)  # moments and step count are non-trivial before the bad batch
    before = variables_of(trainer)
    bad = {k: v.copy() for k, v in batch.items()}
    bad[key][0] = np.nan  # row 0 has valid units
    with pytest.raises(NonFiniteLoss) as caught:
        trainer.step(bad)
    assert math.isnan(caught.value.metrics.loss) and caught.value.metrics.units == 9
    for a, b in zip(before, variables_of(trainer), strict=True):
        assert np.array_equal(a, b)
    assert isinstance(caught.value, PolicyError)
    trainer.step(batch)  # a good batch still trains, on the same compiled step
    assert trainer.compiles == 1
    assert int(trainer.optimizer.step[...]) == 2


def test_same_bucket_shapes_do_not_recompile() -> None:
    model = OptionScorer(rngs=nnx.Rngs(0))
    trainer = PolicyTrainer(model, GRPOConfig(minibatch=4))
    first = with_learner(model, make_batch(seed=1), ADV)
    second = with_learner(model, make_batch(seed=2), [0.3, -0.3, 1.0, -1.0])
    trainer.train_round(first)
    trainer.train_round(second)
    assert trainer.compiles == 1
    trainer.step(with_learner(model, make_batch(seed=3, b=8), [1.0, -1.0] * 4))
    assert trainer.compiles == 2  # a new bucket compiles once, as the counter shows


# --- configuration and batch checks -----------------------------------------------------------

def test_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(PolicyError, match="clip_eps"):
        GRPOConfig(clip_eps=1.5)
    with pytest.raises(PolicyError, match="clip_eps_high"):
        GRPOConfig(clip_eps_high=0.0)
    with pytest.raises(PolicyError, match="learning_rate"):
        GRPOConfig(learning_rate=float("nan"))
    with pytest.raises(PolicyError, match="minibatch"):
        GRPOConfig(minibatch=0)
    with pytest.raises(msgspec.ValidationError, match="lr"):
        msgspec.convert({"lr": 0.1}, GRPOConfig)
    assert msgspec.convert({"kl_beta": 0.04}, GRPOConfig).kl_beta == 0.04


def test_step_names_a_missing_learner_array() -> None:
    model = OptionScorer(rngs=nnx.Rngs(0))
    batch = make_batch()
    with pytest.raises(PolicyError, match="'old_lp'"):
        PolicyTrainer(model, GRPOConfig()).step(batch)
    full = with_learner(model, batch, ADV)
    del full["ref_lp"]
    with pytest.raises(PolicyError, match="'ref_lp'"):
        PolicyTrainer(model, GRPOConfig(kl_beta=0.1)).step(full)
