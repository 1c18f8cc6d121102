"""Errors of the experiment floor: specs, their designs, runs and panel replies."""

from __future__ import annotations

from schemas.errors import HxError


class ExperimentError(HxError, ValueError):
    """An experiment spec, run or review cannot be used as given; the message names what and where."""


class SpecRejected(ExperimentError):
    """A spec that changes more than one thing, or whose falsified_if does not parse, or is otherwise unsound."""


class FalsifyUnparsed(SpecRejected):
    """A falsified_if outside the expression language (``hx.experiment.falsify``); the message says which part."""


class ReplyUnparsed(ExperimentError):
    """A panel persona's reply does not parse as its verdict."""
