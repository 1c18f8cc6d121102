"""The evolution job as ``LedgerOpened.settings`` records it, read in today's shape whichever shape it was written in.

Today the job is nested: the rollout's settings under ``rollout``, the loop's under
``loop``, an ``hx coevolve`` job's under ``coevolve``. Before, it was flat: the rollout's five
settings at top level, the loop's under ``settings`` and the co-evolution's under ``coevolve``
(``{}`` for a plain evolution). A recorded job is signed and chained with its ledger, so it is
never rewritten: ``nested_job`` upgrades the reading instead, and every reader goes through it.

>>> nested_job({"run_id": "r", "attempts": 3, "seed": 1, "settings": {"rounds": 2}, "coevolve": {}})
{'run_id': 'r', 'rollout': {'attempts': 3, 'seed': 1}, 'loop': {'rounds': 2}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLLOUT_FIELDS = ("attempts", "concurrency", "max_steps", "seed", "timeout_s")
"""The rollout's settings, at the top level of a job recorded before jobs were nested."""


def nested_job(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded job (``LedgerOpened.settings``) in the nested shape: a flat (older) one upgraded, a nested
    one as it is."""
    if "rollout" in settings or "loop" in settings:
        return dict(settings)
    job = {k: v for k, v in settings.items() if k not in (*ROLLOUT_FIELDS, "settings", "coevolve")}
    job["rollout"] = {k: settings[k] for k in ROLLOUT_FIELDS if k in settings}
    job["loop"] = dict(settings.get("settings") or {})
    if settings.get("coevolve"):  # {}: a plain evolution
        job["coevolve"] = settings["coevolve"]
    return job
