"""The random baseline lands where random play over the valid actions does (FACTS: coin ~0.35-0.42 at 100 steps).

``random:`` picks uniformly among the ``act`` tool's enumerated valid actions; the step cap
is 100; the harness is the textworld starter harness ``hx run`` uses by default (the agent
ignores its prompt; its loop detector and budget must not get in the way of random play).
"""

from __future__ import annotations

import pytest

import hx.environments  # noqa: F401 - registers twx and sciworld
from hx.environments.registry import benchmark
from hx.environments.results import RolloutReport
from hx.environments.rollout import Rollout, RolloutSettings
from hx.harnesses import starter_harness
from hx.runtime.models import ModelConfig
from streams.config import NatsSettings
from streams.connection import connect

pytestmark = pytest.mark.slow
RANDOM = ModelConfig(main="random:")


async def test_random_play_on_textworld_games_lands_near_the_known_rates(nats_url: str) -> None:
    twx = benchmark("twx")
    reports: dict[str, RolloutReport] = {}
    try:
        async with connect(NatsSettings(url=nats_url)) as conn:
            for game in ("coin", "mapreader", "arithmetic"):
                ro = Rollout(twx, RANDOM, starter_harness("textworld"), log=conn.log,
                             settings=RolloutSettings(attempts=1, concurrency=4, max_steps=100))
                outcome = await ro.rollout(f"baseline-{game}", twx.task_ids(game, "dev", 40))
                reports[game] = outcome.report
                assert not [r for r in outcome.results if r.status in ("interrupted", "infra_failure")]
    finally:
        twx.close()
    rate = {game: r.overall.pass_at_1 or 0.0 for game, r in reports.items()}
    assert 0.2 <= rate["coin"] <= 0.6, rate
    assert rate["mapreader"] < rate["coin"], rate
    assert rate["arithmetic"] <= 0.15, rate
    assert reports["coin"].overall.mean_steps is not None and reports["coin"].overall.mean_steps <= 100


async def test_random_play_never_solves_scienceworld(nats_url: str) -> None:
    sciworld = benchmark("sciworld")
    try:
        async with connect(NatsSettings(url=nats_url)) as conn:
            ro = Rollout(sciworld, RANDOM, starter_harness("scienceworld"), log=conn.log,
                         settings=RolloutSettings(attempts=1, concurrency=3, max_steps=8))
            outcome = await ro.rollout("baseline-sciworld", sciworld.task_ids("boil", "dev", 3))
    finally:
        sciworld.close()
    assert outcome.report.overall.attempts == 3 and outcome.report.overall.passes == 0
    assert outcome.report.overall.infra_failures == 0
