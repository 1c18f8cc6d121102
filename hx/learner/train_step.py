"""The training step: a model, its optimiser and one jitted step of a learner algorithm's loss.

The step is blind to the algorithm: it calls ``algorithm.loss(logp, entropy, batch, config)``
(``hx.learner.algorithm``) under ``jax.jit`` and reads of the config only what every
algorithm's has (``PolicyGradientConfig``: the optimiser, the pass, ``needs_reference``).

A non-finite loss or gradient never updates the model: ``PolicyTrainer.step`` leaves the
parameters and optimiser state as they were and raises ``NonFiniteLoss`` carrying the
step's metrics; the caller decides whether to drop the batch or stop the round.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import msgspec
import numpy as np
import optax  # type: ignore[import-untyped]
from flax import nnx

from hx.learner.algorithm import AUX, Algorithm, algorithm_of
from hx.learner.errors import NonFiniteLoss, PolicyError
from hx.learner.policy import Batch, bucket
from hx.learner.policy_gradient import Array, PolicyGradientConfig

_LEARNER_KEYS = ("old_lp", "ref_lp", "adv")
"""Batch entries the learner adds; zeroed in padding rows made by ``minibatches``."""

LossFn = Callable[[Array, Array, Mapping[str, Array]], tuple[Array, dict[str, Array]]]
"""An algorithm's loss with its config bound: ``(logp, entropy, batch) -> (loss, aux)``."""


class StepMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """What one optimiser step measured (aux means are over the batch's valid units)."""

    loss: float
    kl: float
    """Mean k3 estimate to the reference policy; 0 when ``kl_beta`` is 0."""
    clip_fraction: float
    """Fraction of valid units whose clipped term is the active one (no gradient through it)."""
    entropy: float
    grad_norm: float
    """Global norm of the gradient before clipping."""
    ratio: float
    """Mean ``exp(logp - old_lp)``."""
    units: int


class RoundMetrics(StepMetrics, frozen=True, kw_only=True):
    """Means of the step metrics over a round (``units``: their sum), with the number of steps."""

    steps: int


def minibatches(batch: Batch, size: int, *, seed: int = 0) -> list[Batch]:
    """``batch``'s samples shuffled under ``seed`` into steps of ``size``, each padded to the same row count.

    Rows without units (padding) are dropped before the split. Every minibatch has
    ``min(bucket(size), rows of batch)`` rows and the input's other dimensions, so all
    steps share one compiled shape; padding rows copy row 0 with ``mask`` and the
    learner's arrays zeroed.
    """
    if size < 1:
        raise PolicyError(f"minibatch size must be >= 1, got {size}")
    mask = np.asarray(batch["mask"])
    real = np.flatnonzero(mask.reshape(mask.shape[0], -1).sum(axis=1) > 0)
    if real.size == 0:
        return []
    order = real[np.random.default_rng(seed).permutation(real.size)]
    rows = min(bucket(size), mask.shape[0])
    out: list[Batch] = []
    for start in range(0, order.size, rows):
        take = order[start:start + rows]
        pad = rows - take.size
        index = np.concatenate([take, np.zeros(pad, dtype=take.dtype)])
        part = {key: np.asarray(value)[index] for key, value in batch.items()}
        if pad:
            for key in ("mask", *_LEARNER_KEYS):
                if key in part:
                    part[key][take.size:] = 0
        out.append(part)
    return out


_STATS = ("loss", "kl", "clip_fraction", "entropy", "grad_norm", "ratio", "units", "finite")

State = nnx.State[Any, Any]
"""An NNX state tree (of the model and its optimiser) inside the compiled step."""
Leaves = list[Array]
"""The raw arrays of every variable of (model, optimizer), in ``nnx.to_flat_state`` path order."""


def _train_step(graphdef: nnx.GraphDef[Any], paths: Sequence[tuple[Any, ...]], loss: LossFn, name: str,
                on_trace: Callable[[], None]) -> Callable[[Leaves, Mapping[str, Array]], tuple[Leaves, Array]]:
    """The pure step: variable arrays and batch in, next variable arrays and a vector of ``_STATS`` out."""

    def step(leaves: Leaves, batch: Mapping[str, Array]) -> tuple[Leaves, Array]:
        on_trace()  # runs once per trace, i.e. once per compile
        model, optimizer = nnx.merge(graphdef, nnx.from_flat_state(zip(paths, leaves, strict=True)))

        def loss_fn(m: nnx.Module) -> tuple[Array, dict[str, Array]]:
            logp, entropy = m(batch)
            return loss(logp, entropy, batch)

        (value, aux), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        if missing := [k for k in AUX if k not in aux]:  # checked once per trace
            raise PolicyError(f"the loss of learner algorithm {name!r} reports no {', '.join(missing)}")
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(value) & jnp.isfinite(grad_norm)
        # The forward pass may advance non-parameter state (RNG counters): keep that either way.
        current = nnx.state((model, optimizer))

        def apply(operands: tuple[State, State]) -> State:
            st, g = operands
            m, opt = nnx.merge(graphdef, st)
            opt.update(m, g)
            return nnx.state((m, opt))

        def keep(operands: tuple[State, State]) -> State:
            return operands[0]

        # The update is computed and applied only when everything is finite.
        new_state = jax.lax.cond(finite, apply, keep, (current, grads))
        flat = nnx.to_flat_state(new_state)
        if [p for p, _ in flat] != list(paths):
            raise PolicyError("the model's variables changed structure during a training step")
        stats = jnp.stack([value, aux["kl"], aux["clip_fraction"], aux["entropy"], grad_norm, aux["ratio"],
                           aux["units"], finite.astype(value.dtype)])
        return [leaf.get_raw_value() if isinstance(leaf, nnx.Variable) else leaf for _, leaf in flat], stats

    return jax.jit(step)


class PolicyTrainer:
    """A model, its AdamW optimiser (after global-norm clipping) and the jitted step of an algorithm's loss.

    The algorithm is the config's (by its tag) unless given. ``step`` updates ``model`` in
    place. ``compiles`` counts traces of the step, so a caller can check that rounds with the
    same bucketed shapes reuse one compilation.
    """

    def __init__(self, model: nnx.Module, config: PolicyGradientConfig,
                 algorithm: Algorithm[Any] | None = None) -> None:
        self.model = model
        self.config = config
        self.algorithm = algorithm or algorithm_of(config)
        cfg = self.config
        tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                         optax.adamw(cfg.learning_rate, weight_decay=cfg.weight_decay))
        self._tx = tx
        self.optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        self.compiles = 0
        self.rounds = 0
        # Plain jax.jit over the variables' raw arrays: no graph traversal per step (nnx.jit,
        # even through nnx.cached_partial, and nnx.state/nnx.update cost more than the step of
        # a small model). The variables are found once here, so the model's structure is fixed.
        graphdef, state = nnx.split((self.model, self.optimizer))
        paths = [path for path, _ in nnx.to_flat_state(state)]
        found = {path: node for path, node in nnx.iter_graph((self.model, self.optimizer))
                 if isinstance(node, nnx.Variable)}
        self._variables = [found[path] for path in paths]
        loss: LossFn = functools.partial(self.algorithm.loss, config=cfg)
        self._step = _train_step(graphdef, paths, loss, self.algorithm.name, self._traced)

    def _traced(self) -> None:
        self.compiles += 1

    def reset_optimizer(self) -> None:
        """Start the optimiser afresh (moments and step count at zero) for the current parameters.

        The learner does this before every pass, so a pass depends only on its parent policy and
        its samples: a learner restarted from a checkpoint trains exactly as one that never
        stopped. The compiled step is kept: only the values of the optimiser's variables change.
        """
        fresh = dict(nnx.to_flat_state(nnx.state(nnx.Optimizer(self.model, self._tx, wrt=nnx.Param))))
        paths = [path for path, _ in nnx.to_flat_state(nnx.state((self.model, self.optimizer)))]
        for path, variable in zip(paths, self._variables, strict=True):
            if path[0] == 1:
                leaf = fresh[path[1:]]
                variable.set_raw_value(leaf.get_raw_value() if isinstance(leaf, nnx.Variable) else leaf)

    def _check(self, batch: Mapping[str, Any]) -> None:
        """Name a missing or misshapen learner array before it reaches the compiled step."""
        if "mask" not in batch:
            raise PolicyError("learner batch has no 'mask'")
        shape = np.shape(batch["mask"])
        needed = ["old_lp", "adv"] + (["ref_lp"] if self.config.needs_reference else [])
        for key in needed:
            if key not in batch:
                raise PolicyError(f"learner batch has no {key!r} (the learner adds old_lp, ref_lp and adv)")
            want = shape[:1] if key == "adv" else shape
            if np.shape(batch[key]) != want:
                raise PolicyError(f"learner batch {key!r} has shape {np.shape(batch[key])}, expected {want}")

    def step(self, batch: Mapping[str, Any]) -> StepMetrics:
        """One optimiser step on ``batch``; ``NonFiniteLoss`` (model unchanged) if loss or gradient is not finite."""
        self._check(batch)
        leaves, stats = self._step([v.get_raw_value() for v in self._variables], dict(batch))
        values = dict(zip(_STATS, np.asarray(stats).tolist(), strict=True))
        for variable, leaf in zip(self._variables, leaves, strict=True):
            variable.set_raw_value(leaf)
        metrics = StepMetrics(loss=values["loss"], kl=values["kl"], clip_fraction=values["clip_fraction"],
                              entropy=values["entropy"], grad_norm=values["grad_norm"], ratio=values["ratio"],
                              units=round(values["units"]))
        if values["finite"] != 1.0:
            raise NonFiniteLoss(metrics)
        return metrics

    def train(self, batches: Iterable[Mapping[str, Any]]) -> RoundMetrics:
        """One ``step`` per batch; the means of their metrics. A ``NonFiniteLoss`` stops the round."""
        steps = [self.step(b) for b in batches]
        n = len(steps)

        def mean(name: str) -> float:
            return math.fsum(getattr(s, name) for s in steps) / n if n else 0.0

        return RoundMetrics(loss=mean("loss"), kl=mean("kl"), clip_fraction=mean("clip_fraction"),
                            entropy=mean("entropy"), grad_norm=mean("grad_norm"), ratio=mean("ratio"),
                            steps=n, units=sum(s.units for s in steps))

    def train_round(self, batch: Batch) -> RoundMetrics:
        """``epochs`` passes over a round's encoded samples in shuffled minibatches of ``minibatch``."""
        cfg = self.config
        plan: list[Batch] = []
        for epoch in range(cfg.epochs):
            # Seeded by (config seed, round, epoch): reproducible, yet each pass is shuffled anew.
            seed = int(np.random.SeedSequence([cfg.seed, self.rounds, epoch]).generate_state(1)[0])
            plan.extend(minibatches(batch, cfg.minibatch, seed=seed))
        self.rounds += 1
        return self.train(plan)
