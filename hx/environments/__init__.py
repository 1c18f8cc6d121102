"""Benchmarks: task ids, adapters (TextWorldExpress, ScienceWorld, GAIA-style QA) and rollouts."""

from hx.environments import gaia, sciworld, twx  # noqa: F401 - each registers its benchmark on import
