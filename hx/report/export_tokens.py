"""A run's tokens as ``hx export`` writes them: per round, per meta-model stage, and per task of the task agent.

Every figure is the round's decision's own (``RoundMetrics.tokens``, on the ledger): nothing is
re-read from the trace. A round decided before hx counted tokens has no rows; a round that made
no model call (an offline evolver, a random agent) has its rows, with zeros.

>>> from schemas.messages import Usage
>>> t = RoundTokens(meta={"evolver": Usage(input_tokens=4200, output_tokens=380)}, agent=Usage(input_tokens=20),
...                 tasks={"b:g:dev:0": Usage(input_tokens=20)})
>>> [(r["kind"], r["stage"], r["task"], r["input_tokens"]) for r in token_rows(0, t)]
[('meta', 'evolver', None, 4200), ('agent', None, None, 20), ('agent', None, 'b:g:dev:0', 20)]
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.ledger import RoundTokens
from schemas.messages import Usage


def usage_json(usage: Usage) -> dict[str, Any]:
    """A usage as plain data: input, output and cache-read tokens, and the provider-reported cost."""
    data: dict[str, Any] = msgspec.to_builtins(usage)
    return data


def token_rows(round: int, tokens: RoundTokens | None) -> list[dict[str, Any]]:
    """The lines of ``data/tokens.jsonl`` for one round: a line per meta-model stage, the task agent's total (task
    null) and a line per task."""
    if tokens is None:
        return []
    rows = [{"round": round, "kind": "meta", "stage": stage, "task": None, **usage_json(u)}
            for stage, u in tokens.meta.items()]
    rows.append({"round": round, "kind": "agent", "stage": None, "task": None, **usage_json(tokens.agent)})
    rows += [{"round": round, "kind": "agent", "stage": None, "task": task, **usage_json(u)}
             for task, u in tokens.tasks.items()]
    return rows


def curve_tokens(tokens: RoundTokens | None) -> dict[str, Any] | None:
    """A round's tokens as ``curves.json`` shows them: per meta-model stage and the task agent's total."""
    if tokens is None:
        return None
    return {"meta": {stage: usage_json(u) for stage, u in tokens.meta.items()}, "agent": usage_json(tokens.agent)}
