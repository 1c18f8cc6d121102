"""Group-relative policy optimisation (GRPO): each group's rewards standardised, the clipped loss.

A sample's advantage is its trajectory's reward standardised within its group,
``(r - mean) / (std + adv_eps)`` (population std; ``hx.processors.training_bridge.standardised``,
the one place that computation lives). A group whose rewards are all equal gets zeros. The loss
is the family's clipped surrogate (``hx.learner.policy_gradient.clipped_loss``).

>>> GRPO().advantages({"a": [1.0, 0.0], "b": [0.5, 0.5]}, GRPOConfig())
{'a': [0.999998000004, -0.999998000004], 'b': [0.0, 0.0]}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from jax.typing import ArrayLike

from hx.learner.policy_gradient import Array, PolicyGradientConfig, clipped_loss, finite_rewards
from hx.processors.training_bridge import standardised


class GRPOConfig(PolicyGradientConfig, frozen=True, forbid_unknown_fields=True, kw_only=True,
                 tag="grpo", tag_field="name"):
    """GRPO's hyper-parameters: the clipped family's, and the standardisation's ``adv_eps``."""

    adv_eps: float = 1e-6
    """Added to the group's standard deviation when normalising rewards."""

    def checks(self) -> tuple[tuple[str, bool, str], ...]:
        """The family's checks and ``adv_eps > 0``."""
        return (*super().checks(), ("adv_eps", self.adv_eps > 0, "> 0"))


class GRPO:
    """GRPO as a learner algorithm (entry point ``grpo``)."""

    name: ClassVar[str] = "grpo"
    config_type: ClassVar[type[GRPOConfig]] = GRPOConfig

    def advantages(self, rewards: Mapping[str, Sequence[float]], config: GRPOConfig) -> dict[str, list[float]]:
        """Each group's rewards standardised (zeros for a group without spread)."""
        return {key: standardised(rs, config.adv_eps) for key, rs in finite_rewards(rewards).items()}

    def loss(self, logp: Array, entropy: Array, batch: Mapping[str, ArrayLike],
             config: GRPOConfig) -> tuple[Array, dict[str, Array]]:
        """The clipped surrogate loss."""
        return clipped_loss(logp, entropy, batch, config)
