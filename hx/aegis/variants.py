"""Variant isolation: routing task clusters to variants, forking, and retiring the weakest.

Under the ``ensemble`` strategy a run keeps up to ``max_variants`` harness variants. Each
task cluster (``benchmark:game``) is routed to one variant; a candidate's seesaw is scoped
to the tasks of its variant. A candidate that gains tasks in some clusters and loses
others is forked into a new variant serving the clusters where it gains. When the pool is
full the weakest variant is retired first: one serving no cluster, else the one with the
lowest pass rate on its tasks in the last round. The root variant (``v0``) is never
retired. A cluster no variant serves runs under the live variant with the best success
on that cluster's tasks, else (a cluster not run yet) the best overall success
(``RunLedger.unserved``; the root until a round has run). ``global`` keeps ``v0`` alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Literal

from hx.aegis.state import RunState
from hx.gate.rule import cluster_of
from schemas.landscape import TaskDigest

Strategy = Literal["global", "ensemble"]
STRATEGIES: tuple[Strategy, ...] = ("global", "ensemble")


def route(state: RunState, tasks: Iterable[str]) -> dict[str, list[str]]:
    """Variant -> the tasks it runs, each task by its cluster's route (variants in name order)."""
    out: dict[str, list[str]] = defaultdict(list)
    routes: dict[str, str] = {}  # one route per cluster: an unserved one weighs every variant's evidence
    for task in tasks:
        cluster = cluster_of(task)
        if cluster not in routes:
            routes[cluster] = state.route(cluster)
        out[routes[cluster]].append(task)
    return dict(sorted(out.items()))


def fork_name(state: RunState) -> str:
    """The next variant's name: ``v<n>``, n counting every variant ever made."""
    return f"v{len(state.variants)}"


def weakest(state: RunState, latest: Sequence[TaskDigest]) -> str | None:
    """The variant to retire when the pool is full (never the root), or None when only the root is live."""
    root = state.opened.variant
    live = [v for v in state.live() if v != root]
    if not live:
        return None
    routes = {c: state.route(c) for c in state.ledger.clusters()}
    serving = {v: [c for c, rv in routes.items() if rv == v] for v in live}
    unserved = state.ledger.unserved()  # a cluster not run yet would run under it: not idle
    idle = sorted(v for v, clusters in serving.items() if not clusters and v != unserved)
    if idle:
        return idle[0]
    rate: dict[str, float] = {}
    for v in live:
        mine = [d for d in latest if d.variant == v]
        rate[v] = sum(d.solved for d in mine) / len(mine) if mine else 0.0
    return min(live, key=lambda v: (rate[v], v))


def pool_full(state: RunState, max_variants: int) -> bool:
    """True when forking needs a retirement first."""
    return len(state.live()) >= max_variants
