"""Benchmarks: task ids, adapters (TextWorldExpress, ScienceWorld, GAIA-style QA) and rollouts.

The adapters are entry points (``hx.benchmarks``), imported when a benchmark is first named.
"""
