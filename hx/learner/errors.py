"""Errors of the learner layer: policies, their checkpoints and training steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.errors import HxError

if TYPE_CHECKING:
    from hx.learner.train_step import StepMetrics


class PolicyError(HxError):
    """A policy cannot serve a request or load a checkpoint; the message names what and where."""


class NonFiniteLoss(PolicyError):
    """A step's loss or gradient was not finite; the update was not applied."""

    def __init__(self, metrics: StepMetrics) -> None:
        self.metrics = metrics
        super().__init__(f"non-finite loss or gradient (loss={metrics.loss}, grad_norm={metrics.grad_norm}, "
                         f"units={metrics.units}); parameters and optimiser state left unchanged")


class Unservable(PolicyError):
    """A request or a logged completion this policy cannot answer or score (no usable tool, unknown choice)."""
