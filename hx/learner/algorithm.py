"""A learner algorithm: how a group's rewards become advantages, and the loss the jitted step minimises.

The learner service and the training step are blind to the algorithm: they ask it for
advantages (per group of trajectories, and per step group) and hand its ``loss`` to the
compiled step. An algorithm is a class registered as an ``hx.algorithms`` entry point by
the module that defines it (``grpo = "hx.learner.grpo:GRPO"``); its config is a frozen,
tagged msgspec Struct (tag: the algorithm's name) extending
``hx.learner.policy_gradient.PolicyGradientConfig``, which holds what the step itself reads
(optimiser, epochs, minibatch, seed, whether a reference policy is needed).

This module imports no JAX, so the command line can list the algorithms without loading it.

>>> ALGORITHMS.names()
('grpo', 'rloo')
>>> algorithm("grpo").name
'grpo'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from hx.entry_points import Registry
from hx.errors import LoadFailed

if TYPE_CHECKING:
    import jax
    from jax.typing import ArrayLike

    from hx.learner.policy_gradient import PolicyGradientConfig

C = TypeVar("C", bound="PolicyGradientConfig", contravariant=True)

AUX = ("kl", "clip_fraction", "entropy", "ratio", "units")
"""What a loss reports beside its value: means over the batch's valid units (``units``: their count)."""


class Algorithm(Protocol[C]):
    """A learner algorithm: its name, its config type, its advantages and its loss.

    ``advantages`` maps each group's rewards (in order) to one advantage per reward; a group
    without spread gets zeros (whether it is dropped is the learner's choice, not the
    algorithm's). ``loss(logp, entropy, batch, config)`` runs inside the jitted step:
    ``logp`` and ``entropy`` are ``[B, T]`` from the policy's model, ``batch`` holds ``mask``,
    ``old_lp``, ``adv`` and (when ``config.needs_reference``) ``ref_lp``; it returns the
    scalar loss and the ``AUX`` means.
    """

    name: ClassVar[str]
    config_type: ClassVar[type[PolicyGradientConfig]]

    def advantages(self, rewards: Mapping[str, Sequence[float]], config: C) -> dict[str, list[float]]:
        """Each group's advantages, one per reward, in order."""
        ...

    def loss(self, logp: jax.Array, entropy: jax.Array, batch: Mapping[str, ArrayLike],
             config: C) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The scalar loss of a minibatch and its ``AUX`` means."""
        ...


ALGORITHMS: Registry[type[Algorithm[Any]]] = Registry("hx.algorithms", "learner algorithm")
"""The learner algorithms: ``hx.algorithms`` entry points, imported when first asked for."""


def algorithm(name: str) -> Algorithm[Any]:
    """The algorithm registered as ``name``; ``UnknownName`` (listing the known ones) if none is."""
    cls = ALGORITHMS.load(name)
    if getattr(cls, "name", None) != name or tag_of(getattr(cls, "config_type", None)) != name:
        raise LoadFailed(f"learner algorithm {name!r} ({cls!r}) must have name {name!r} and a config "
                         f"Struct tagged {name!r}")
    return cls()


def algorithm_of(config: PolicyGradientConfig) -> Algorithm[Any]:
    """The algorithm a config belongs to (by its tag)."""
    return algorithm(str(tag_of(type(config))))


def tag_of(config_type: object) -> object:
    """The msgspec tag of a config Struct type (None when it has none)."""
    struct_config = getattr(config_type, "__struct_config__", None)
    return getattr(struct_config, "tag", None)
