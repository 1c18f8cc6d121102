"""Replay, time travel, regressions and audit: the log read back by the people who debug and check a run."""
