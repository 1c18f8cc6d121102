"""Benchmarks: task ids, adapters (TextWorldExpress, ScienceWorld, GAIA-style QA) and rollouts."""
