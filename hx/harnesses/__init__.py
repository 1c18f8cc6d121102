"""Starter harnesses: a competent round-0 harness per benchmark family, shipped as package data.

Each ``<family>.yaml`` here is a ``HarnessConfig`` in its YAML form, built from the
processor library by registry name: a system prompt for the family, a history window,
a loop detector, a token budget, an input corrector and an observation trim. They are
the baseline an evolution run starts from, as the paper's round 0 is.

>>> starter_harness("textworld").groups()[:2]
('system_prompt_template', 'history_window')
"""

from __future__ import annotations

from importlib import resources

import hx.processors  # noqa: F401 - the YAML names library processors by their registry names
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError

_PACKAGE = "hx.harnesses"


def families() -> tuple[str, ...]:
    """The benchmark families that ship a starter harness."""
    return tuple(sorted(entry.name.removesuffix(".yaml") for entry in resources.files(_PACKAGE).iterdir()
                        if entry.name.endswith(".yaml")))


def starter_harness_text(family: str) -> str:
    """The YAML of a family's starter harness, as shipped."""
    entry = resources.files(_PACKAGE) / f"{family}.yaml"
    if not family or "/" in family or not entry.is_file():
        raise CompositionError(f"no starter harness for benchmark family {family!r}; "
                               f"known: {', '.join(families()) or 'none'}")
    return entry.read_text(encoding="utf-8")


def starter_harness(family: str) -> HarnessConfig:
    """The validated starter harness of a benchmark family (``textworld``, ``scienceworld``, ``qa``)."""
    return HarnessConfig.loads(starter_harness_text(family), "yaml", where=f"hx/harnesses/{family}.yaml")
