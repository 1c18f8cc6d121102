"""Model specs given on the command line: checked before anything starts, an error naming its option."""

from __future__ import annotations

from hx.runtime.errors import ModelSpecError
from hx.runtime.providers.base import check_spec


def check_spec_option(option: str, spec: str) -> None:
    """Check ``spec`` (given as ``option``) without calling a model; ``ModelSpecError`` names the option."""
    try:
        check_spec(spec)
    except ModelSpecError as exc:
        raise ModelSpecError(f"{option}: {exc}") from None
