"""REINFORCE leave-one-out (RLOO): each sample's baseline is the mean reward of the rest of its group.

``advantage_i = r_i - mean(r_j, j != i)`` (Kool et al., 2019; Ahmadian et al., 2024), not
divided by the group's spread: the baseline is then unbiased (it does not depend on the
sample it scores), and a group whose rewards barely differ is not blown up to unit scale as
GRPO's standardisation does (Dr. GRPO's objection). A group of one reward, or of equal
rewards, gets zeros. The loss is the family's clipped surrogate, as GRPO's.

>>> RLOO().advantages({"a": [1.0, 0.0, 0.0], "b": [0.5, 0.5]}, RLOOConfig())
{'a': [1.0, -0.5, -0.5], 'b': [0.0, 0.0]}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

from jax.typing import ArrayLike

from hx.learner.policy_gradient import Array, PolicyGradientConfig, clipped_loss, finite_rewards
from hx.processors.training_bridge import has_spread


class RLOOConfig(PolicyGradientConfig, frozen=True, forbid_unknown_fields=True, kw_only=True,
                 tag="rloo", tag_field="name"):
    """RLOO's hyper-parameters: the clipped family's (it adds none)."""


def leave_one_out(rewards: Sequence[float]) -> list[float]:
    """Each reward minus the mean of the others; zeros for a group without spread."""
    if not has_spread(rewards):
        return [0.0] * len(rewards)
    n, total = len(rewards), math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


class RLOO:
    """RLOO as a learner algorithm (entry point ``rloo``)."""

    name: ClassVar[str] = "rloo"
    config_type: ClassVar[type[RLOOConfig]] = RLOOConfig

    def advantages(self, rewards: Mapping[str, Sequence[float]], config: RLOOConfig) -> dict[str, list[float]]:
        """Each group's leave-one-out advantages."""
        return {key: leave_one_out(rs) for key, rs in finite_rewards(rewards).items()}

    def loss(self, logp: Array, entropy: Array, batch: Mapping[str, ArrayLike],
             config: RLOOConfig) -> tuple[Array, dict[str, Array]]:
        """The clipped surrogate loss."""
        return clipped_loss(logp, entropy, batch, config)
