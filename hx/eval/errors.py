"""Errors of the eval floor: suites, criteria and their parameters, generated task files."""

from __future__ import annotations

from schemas.errors import HxError


class EvalError(HxError, ValueError):
    """An eval suite, a criterion or an eval run cannot be used as given; the message names what and where."""


class UnknownCriterion(EvalError):
    """A suite names a criterion the registry does not have."""


class SuiteInvalid(EvalError):
    """A suite or generated-tasks file does not match its schema."""
