"""The learner as a service on a real log: its records on HX_LEARN, restarts, determinism, held-out rounds,
``hx learn`` (in-process, and as a process killed with SIGKILL and restarted) and ``hx coevolve``.

The runs are toy corridor rounds (``tests/toybench.py``) played by ``random:`` (uniform, with per-choice
log-probabilities in the scorer's factorisation: off-policy data) or by the policy itself."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import toyworld  # noqa: F401 - registers the toyworld benchmark with the in-process command
from hx_cli import error_line, hx, ok
from learner_kit import (
    avoiding,
    expected_pass,
    finished,
    learn_records,
    model_turns,
    perturbed,
    sample_of,
    trace,
)
from toybench import ToyBench, ids

from hx.aegis.ledger import read_records
from hx.aegis.loop import Evolution
from hx.aegis.state import RunState
from hx.aegis.trials import RETRIES, RETRY_BASE, Trials
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import SplitRole, Splits
from hx.harness.config import HarnessConfig
from hx.learner import checkpoint
from hx.learner.errors import PolicyError
from hx.learner.grpo import GRPOConfig
from hx.learner.provider import PolicyProvider
from hx.learner.trainer import Learner, LearnerSettings, learn_subject
from hx.runtime.models import ModelConfig
from hx.runtime.providers.resources import ProviderResources
from projections.replay_buffer import trajectories
from schemas.errors import HxError
from schemas.learn import PolicyGated, PolicyInitialised, PolicyUpdated, UpdateSkipped
from schemas.ledger import LedgerEvent, ModelChanged, RoundDecided, RoundDigested
from schemas.lifecycle import RoundStarted
from schemas.messages import ToolCall
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import BLOB_STORE, LEARN

T = TypeVar("T")
RUN = "learn-toy"
SETTINGS = RolloutSettings(attempts=4, concurrency=2, max_steps=6, seed=3)
TASKS = ids("easy", 2) + ids("walk", 1)
HELDOUT = ids("easy", 2, "test")
SMALL = LearnerSettings(config={"dim": 16, "hidden": 32, "vocab": 512}, window=1, step_weight=0.0,
                        algorithm=GRPOConfig(learning_rate=3e-3, minibatch=256, epochs=2))
"""A small scorer, one minibatch a pass and plain GRPO (episode advantages only, unless a test adds step
groups): each learner instance compiles its training step once or twice."""
WIDE = msgspec.structs.replace(SMALL, window=4)
DEADLINE_S = 120.0


@pytest.fixture
async def log(nats_url: str) -> AsyncIterator[EventLog]:
    """The event log on the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        yield conn.log


async def play(log: EventLog, number: int, tasks: list[str] = TASKS, *, spec: str = "random:",
               role: SplitRole = "adaptation", settings: RolloutSettings = SETTINGS, run_id: str = RUN) -> None:
    """Play round ``number`` of the run (claiming the run first when it is round 0)."""
    rollout = Rollout(ToyBench(), ModelConfig(main=spec), HarnessConfig(), log=log, settings=settings)
    if number == 0:
        await rollout.start(run_id)
    await rollout.run_round(run_id, number, tasks, role=role)


def on_log(url: str, work: Callable[[EventLog], Awaitable[T]]) -> T:
    """Run ``work`` on the log from a synchronous test (the in-process CLI runs its own event loop)."""
    async def main() -> T:
        async with connect(NatsSettings(url=url)) as conn:
            return await work(conn.log)
    return asyncio.run(main())


async def forgetful(log: EventLog) -> str:
    """The version of a stored scorer that never takes anything: it loses every task that needs a ``take``."""
    version, _ = await checkpoint.store(log, avoiding(checkpoint.create("scorer", SMALL.config), "take"))
    return version


def updates(records: list[Any]) -> list[PolicyUpdated | UpdateSkipped]:
    """The update records (trained or skipped) among a learner's records."""
    return [r for r in records if isinstance(r, PolicyUpdated | UpdateSkipped)]


def as_json(record: Any) -> Any:
    """A record as a JSON report shows it."""
    return json.loads(msgspec.json.encode(record))


# --- open, update, nothing twice ---------------------------------------------------------------------------


async def test_open_writes_the_first_policy_once_and_a_second_open_reads_it_back(log: EventLog) -> None:
    learner = Learner(log, RUN)
    pos = await learner.open()
    fresh = checkpoint.version(checkpoint.create("scorer"))
    assert (pos.initial, pos.version, pos.through_round, pos.updates) == (fresh, fresh, -1, [])
    [init] = await learn_records(log, RUN)
    assert isinstance(init, PolicyInitialised) and (init.run_id, init.learner, init.kind) == (RUN, "default", "scorer")
    assert init.version == fresh and init.config["window"] == 4 and init.config["algorithm"]["seed"] == 0
    assert await checkpoint.stored(log, fresh)
    assert await learner.update() is None  # no round has finished: nothing to train on, nothing written

    again = await Learner(log, RUN).open()
    assert (again.initial, again.version, again.through_round) == (fresh, fresh, -1)
    other = await Learner(log, RUN, LearnerSettings(learner="seed1", init_seed=1)).open()
    assert other.initial != fresh  # another learner of the run: its own subject and its own start
    assert await learn_records(log, RUN) == [init]
    assert [type(r) for r in await learn_records(log, RUN, "seed1")] == [PolicyInitialised]


async def test_a_finished_round_is_one_update_and_nothing_is_trained_twice(log: EventLog) -> None:
    await play(log, 0)
    learner = Learner(log, RUN, SMALL)
    initial = (await learner.open()).initial
    first = await learner.update()
    expected = await expected_pass(log, RUN, [0])
    assert expected.groups_used >= 1 and expected.groups_skipped >= 1  # the round has both kinds of group
    assert isinstance(first, PolicyUpdated)
    assert (first.run_id, first.through_round, first.rounds, first.parent) == (RUN, 0, (0,), initial)
    assert first.version != initial and first.kind == "scorer" and first.device == "cpu" and first.trace_seq > 0
    assert (first.samples, first.groups_used, first.groups_skipped) == (
        expected.samples, expected.groups_used, expected.groups_skipped)
    assert first.steps == 2 and first.skipped == {}  # epochs x minibatches
    assert all(math.isfinite(x) for x in (first.loss, first.entropy, first.grad_norm)) and first.bytes > 0
    assert await learner.update() is None
    assert updates(await learn_records(log, RUN)) == [first]
    assert learner.position.version == first.version and learner.position.updates == [first]
    fetched = await checkpoint.fetch(log, first.version)  # the new policy is in the object store
    assert checkpoint.files_of(fetched) == checkpoint.files_of(learner.policy)  # type: ignore[arg-type]


async def test_a_second_learner_of_one_name_is_refused_and_so_is_a_restart_with_other_settings(log: EventLog) -> None:
    await play(log, 0)
    faster = msgspec.structs.replace(SMALL, algorithm=msgspec.structs.replace(SMALL.algorithm, learning_rate=1e-2))
    first, twin, other = Learner(log, RUN, SMALL), Learner(log, RUN, SMALL), Learner(log, RUN, faster)
    for learner in (first, twin, other):
        await learner.open()
    made = await first.update()
    assert isinstance(made, PolicyUpdated)
    same = await twin.update()  # the same pass from the same state: the same record (but its wall time), deduplicated
    assert isinstance(same, PolicyUpdated) and msgspec.structs.replace(same, seconds=made.seconds) == made
    with pytest.raises(PolicyError, match="another learner named 'default' is writing to run 'learn-toy'"):
        await other.update()  # another pass of the same round: refused, not merged
    assert updates(await learn_records(log, RUN)) == [made]
    with pytest.raises(PolicyError, match="began with kind 'scorer' \\(asked: 'lm'\\)"):
        await Learner(log, RUN, msgspec.structs.replace(SMALL, kind="lm")).open()
    with pytest.raises(PolicyError, match="init_seed 0 \\(asked: 5\\)"):
        await Learner(log, RUN, msgspec.structs.replace(SMALL, init_seed=5)).open()


async def test_infrastructure_failures_and_tempered_turns_are_left_out_with_counts(log: EventLog) -> None:
    tempered = ModelConfig(main="random:", params={"main": {"temperature": 0.5}})
    rollout = Rollout(ToyBench(), tempered, HarnessConfig(), log=log, settings=SETTINGS)
    await rollout.start(RUN)
    await rollout.run_round(RUN, 0, TASKS)
    await play(log, 1, [*TASKS, *ids("crashy", 1)])  # crashy tasks end in infrastructure failures
    learner = Learner(log, RUN, WIDE)
    await learner.open()
    record = await learner.update()
    assert isinstance(record, PolicyUpdated)
    turns: Counter[tuple[int, str]] = Counter((t.round, t.task) for t in await model_turns(log, RUN))
    crashy = sum(n for (rnd, task), n in turns.items() if "crashy" in task)
    assert crashy > 0 and record.skipped["infra_failure"] == crashy
    # counted in the groups that have a spread of rewards (the others contribute no sample anyway)
    assert 0 < record.skipped["temperature"] <= sum(n for (rnd, _), n in turns.items() if rnd == 0)
    kept = sum(n for (rnd, task), n in turns.items() if rnd == 1 and "crashy" not in task)
    assert 0 < record.samples <= kept  # round 1's turns but the crashed ones (groups without spread aside)


async def test_each_trajectory_weighs_the_same_unless_turns_are_weighed(log: EventLog) -> None:
    """Per trajectory (the default) a turn's advantage is scaled by the mean length over its own; per turn it is not."""
    await play(log, 0)
    learner = Learner(log, RUN, WIDE)
    await learner.open()
    await learner.catch_up()
    state = learner.buffer.state
    by_trajectory, _, used, _ = await learner.samples(state)
    learner.settings = msgspec.structs.replace(WIDE, per_trajectory=False)
    by_turn, _, _, _ = await learner.samples(state)
    assert used > 0 and [k for k, _ in by_trajectory] == [k for k, _ in by_turn]
    lengths = Counter(k[:3] for k, _ in by_turn)  # turns per (round, task, attempt)
    assert len(set(lengths.values())) > 1  # the attempts differ in length, so the two weightings differ
    mean = sum(lengths.values()) / len(lengths)
    for (key, weighed), (_, plain) in zip(by_trajectory, by_turn, strict=True):
        assert weighed.advantage == pytest.approx(plain.advantage * mean / lengths[key[:3]], rel=1e-6)


@pytest.mark.parametrize("stored", [True, False])
async def test_turns_without_logprobs_are_rescored_under_their_policy_checkpoint_or_skipped(
        log: EventLog, stored: bool) -> None:
    behaviour = perturbed(checkpoint.create("scorer", SMALL.config), seed=4)
    version = (await checkpoint.store(log, behaviour))[0] if stored else "f" * 64
    moves = [{"tool_calls": [{"id": f"c{i}", "name": "act", "input": {"action": a}}], "model_version": version}
             for i, a in enumerate(["move east", "take coin", "move east", "take coin"])]
    scripted = ModelConfig(main="script:x", provider_options={"script:x": {"completions": moves}})
    await play(log, 0)  # random: turns, with log-probs
    await Rollout(ToyBench(), scripted, HarnessConfig(), log=log, settings=SETTINGS).run_round(RUN, 1, TASKS)
    learner = Learner(log, RUN, WIDE)
    await learner.open()
    await learner.catch_up()
    samples, skipped, _, _ = await learner.samples(learner.buffer.state)
    replayed = [sample for key, sample in samples if key[0] == 1]
    if stored:  # recomputed under the checkpoint that produced them
        assert replayed and "no_logprobs" not in skipped
        rescored = behaviour.score(replayed)  # scored in another batch shape: equal to float rounding
        assert all(math.isclose(a, b, abs_tol=1e-5) for s, r in zip(replayed, rescored, strict=True)
                   for a, b in zip(s.logprobs, r, strict=True))
    else:  # no checkpoint to recompute them under: left out and counted
        assert not replayed and skipped["no_logprobs"] > 0


@pytest.mark.slow
async def test_a_restarted_learner_resumes_and_its_checkpoints_serve_the_next_round(log: EventLog) -> None:
    await play(log, 0)
    first = Learner(log, RUN, SMALL)
    await first.open()
    trained = await first.update()
    assert isinstance(trained, PolicyUpdated)

    restarted = Learner(log, RUN, SMALL)
    pos = await restarted.open()
    was = first.position
    assert (pos.initial, pos.version, pos.through_round, pos.seq) == (was.initial, was.version, 0, was.seq)
    assert pos.updates == [trained] and restarted.buffer.digest == first.buffer.digest
    assert await restarted.update() is None  # round 0 is not trained on twice

    # policy:<version> of the update plays the next round: its responses name it and carry its log-probs.
    served = await checkpoint.fetch(log, trained.version)
    await play(log, 1, spec=f"policy:{trained.version}")
    turns = [t for t in await model_turns(log, RUN) if t.round == 1]
    assert turns and {t.response.model_version for t in turns} == {trained.version}
    for turn, lp in zip(turns, served.score([t.sample() for t in turns]), strict=True):
        assert [x.logprob for x in turn.response.logprobs] == pytest.approx(lp, abs=1e-5)

    resumed = await restarted.update()
    expected = await expected_pass(log, RUN, [1])  # a window of one round
    assert isinstance(resumed, PolicyUpdated)
    assert (resumed.through_round, resumed.parent, resumed.rounds) == (1, trained.version, (1,))
    assert (resumed.samples, resumed.groups_used) == (expected.samples, expected.groups_used)
    assert updates(await learn_records(log, RUN)) == [trained, resumed]
    assert await checkpoint.stored(log, resumed.version)


async def test_a_rejected_policy_gives_way_to_its_parent_for_the_rollouts_and_the_next_pass(log: EventLog) -> None:
    await play(log, 0)
    learner = Learner(log, RUN, SMALL)
    initial = (await learner.open()).initial
    trained = await learner.update()
    assert isinstance(trained, PolicyUpdated) and learner.position.ungated == trained
    verdict = PolicyGated(run_id=RUN, through_round=0, candidate=trained.version, parent=initial, adopted=False,
                          solved=2, lost=(TASKS[0],), rollouts=9)
    with pytest.raises(PolicyError, match="does not follow the pass"):  # a verdict on some other policy
        await learner.gated(msgspec.structs.replace(verdict, parent=trained.version))
    await learner.gated(verdict)
    assert learner.position.version == initial and learner.position.ungated is None
    assert learner.policy is not None and checkpoint.version(learner.policy) == initial  # and trains from it
    with pytest.raises(PolicyError, match="does not follow the pass"):  # judged once
        await learner.gated(verdict)

    restarted = Learner(log, RUN, SMALL)
    pos = await restarted.open()  # the verdict is folded: the parent is the policy again
    assert (pos.version, pos.ungated, pos.updates) == (initial, None, [trained, verdict])
    await play(log, 1, spec=f"policy:{pos.version}")
    again = await restarted.update()
    assert isinstance(again, PolicyUpdated) and again.parent == initial and again.through_round == 1
    assert await learn_records(log, RUN) == [await first_record(log), trained, verdict, again]


async def first_record(log: EventLog) -> Any:
    """The learner's ``PolicyInitialised``."""
    return (await learn_records(log, RUN))[0]


async def test_the_policy_gate_replays_solved_tasks_on_their_seeds_and_retries_what_it_loses(log: EventLog) -> None:
    await play(log, 0)  # random: plays every attempt; the gate stops a task at its first pass
    first_pass: dict[str, int] = {}
    for f in sorted(await finished(log, RUN), key=lambda f: f.attempt):
        if f.passed:
            first_pass.setdefault(f.task_id, f.attempt)
    solved = sorted(first_pass)
    assert solved
    trials = Trials(log, RUN, [ToyBench()], ModelConfig(main="random:"), SETTINGS, Splits.of(TASKS, HELDOUT),
                    next_round=1)
    lost, rounds = await trials.kept(HarnessConfig(), "v0", solved, ModelConfig(main="random:"), candidate="same")
    # the same policy on the same seeds passes each task again at the attempt that first solved it
    assert lost == [] and trials.rollouts == sum(a + 1 for a in first_pass.values())
    assert list(rounds) == list(range(1, 2 + max(first_pass.values())))

    bad = await forgetful(log)
    trials.rollouts = 0
    lost, rounds = await trials.kept(HarnessConfig(), "v0", solved, ModelConfig(main=f"policy:{bad}"),
                                     candidate="forgetful")
    waves = SETTINGS.attempts * (1 + RETRIES)
    assert lost == solved and len(rounds) == waves and trials.rollouts == waves * len(solved)
    started = {r.event.round: r.event for r in await trace(log, RUN) if isinstance(r.event, RoundStarted)}
    labels = [(started[r].purpose, started[r].candidate, started[r].first_attempt) for r in rounds]
    firsts = [*range(SETTINGS.attempts), *(RETRY_BASE + w for w in range(RETRIES * SETTINGS.attempts))]
    assert labels == [("policy_gate", "forgetful", a) for a in firsts]  # paired seeds first, then fresh ones


async def test_gate_rollouts_of_the_round_trained_through_are_not_a_new_round(log: EventLog) -> None:
    rollout = Rollout(ToyBench(), ModelConfig(main="random:"), HarnessConfig(), log=log, settings=SETTINGS)
    await rollout.start(RUN)
    for number, purpose, stage in ((0, "main", 0), (1, "gate", 0)):
        await rollout.run_round(RUN, number, TASKS, label=RoundLabel(purpose=purpose, stage_round=stage))
    learner = Learner(log, RUN, SMALL)
    await learner.open()
    assert isinstance(await learner.update(), PolicyUpdated)
    await rollout.run_round(RUN, 2, TASKS[:1], label=RoundLabel(purpose="policy_gate", stage_round=0))
    assert await learner.update() is None  # more of evolution round 0: not a round to train on again
    await rollout.run_round(RUN, 3, TASKS, label=RoundLabel(purpose="main", stage_round=1))
    again = await learner.update()
    assert isinstance(again, PolicyUpdated) and again.through_round == 3


@pytest.mark.slow
async def test_learners_from_scratch_make_the_same_versions_restarted_or_not(log: EventLog) -> None:
    a, b, c = (Learner(log, RUN, msgspec.structs.replace(SMALL, learner=name)) for name in "abc")
    assert len({(await x.open()).initial for x in (a, b, c)}) == 1
    made: dict[str, list[str]] = {"a": [], "b": [], "c": []}
    for number in range(2):
        await play(log, number)
        if number == 1:
            c = Learner(log, RUN, msgspec.structs.replace(SMALL, learner="c"))  # c restarts between the rounds
            await c.open()
        for x in (a, b, c):
            record = await x.update()
            assert isinstance(record, PolicyUpdated)
            made[x.settings.learner].append(record.version)
    assert made["a"] == made["b"] == made["c"] and len(set(made["a"])) == 2
    for name in "abc":
        logged = updates(await learn_records(log, RUN, name))
        assert [r.version for r in logged] == made[name]  # type: ignore[union-attr]
        assert [r.parent for r in logged] == [a.position.initial, made[name][0]]


async def test_a_round_where_every_task_has_one_reward_is_skipped(log: EventLog) -> None:
    # The walk corridors need two actions at least: in one step nobody wins.
    await play(log, 0, ids("walk", 2), settings=RolloutSettings(attempts=3, concurrency=2, max_steps=1, seed=3))
    learner = Learner(log, RUN, SMALL)
    initial = (await learner.open()).initial
    skipped = await learner.update()
    assert isinstance(skipped, UpdateSkipped)
    assert (skipped.reason, skipped.through_round, skipped.parent, skipped.groups_skipped) == (
        "no_usable_group", 0, initial, 2)
    assert learner.position.version == initial and await learner.update() is None
    await play(log, 1, ids("easy", 2))
    assert (await expected_pass(log, RUN, [1])).groups_used >= 1
    trained = await learner.update()
    assert isinstance(trained, PolicyUpdated) and (trained.through_round, trained.parent) == (1, initial)
    assert updates(await learn_records(log, RUN)) == [skipped, trained]


async def test_step_groups_learn_from_a_round_every_attempt_passed(log: EventLog) -> None:
    # In one-room corridors random play always takes the coin in time, some attempts sooner: the rewards have no
    # spread, but every attempt starts in the same state, where taking the coin at once has the highest return.
    await play(log, 0, ids("easy", 2), settings=RolloutSettings(attempts=4, concurrency=2, max_steps=30, seed=3))
    assert all(f.passed for f in await finished(log, RUN))
    plain = Learner(log, RUN, SMALL)
    await plain.open()
    skipped = await plain.update()
    assert isinstance(skipped, UpdateSkipped) and skipped.reason == "no_usable_group"
    stepped = Learner(log, RUN, msgspec.structs.replace(SMALL, learner="steps", step_weight=1.0))
    before = (await stepped.open()).initial
    trained = await stepped.update()
    assert isinstance(trained, PolicyUpdated) and trained.groups_used == 2 and trained.parent == before
    opening = [t.sample() for t in await model_turns(log, RUN) if len(t.request.messages) == 2]
    assert opening
    take = sample_of(opening[0].messages, opening[0].tools,
                     ToolCall(id="c", name="act", input={"action": "take coin"}))
    old, new = await checkpoint.fetch(log, before), await checkpoint.fetch(log, trained.version)
    assert new.score([take])[0][0] > old.score([take])[0][0]  # the opening move that wins at once is likelier


async def test_heldout_rounds_are_never_trained_on(log: EventLog) -> None:
    learner = Learner(log, RUN, WIDE)
    await learner.open()
    await play(log, 0, HELDOUT, role="heldout")
    assert await learner.update() is None  # a held-out round finishing is nothing to train on
    await play(log, 1)
    await play(log, 2)
    record = await learner.update()
    expected = await expected_pass(log, RUN, [1, 2])
    assert isinstance(record, PolicyUpdated) and (record.through_round, record.rounds) == (2, (1, 2))
    assert (record.samples, record.groups_used, record.groups_used + record.groups_skipped) == (
        expected.samples, expected.groups_used, len(TASKS))
    assert not {t.task_id for t in trajectories(learner.buffer.state)} & set(HELDOUT)
    assert updates(await learn_records(log, RUN)) == [record]


async def test_the_provider_serves_the_learners_own_copy_of_a_new_policy(log: EventLog) -> None:
    await play(log, 0)
    learner = Learner(log, RUN, msgspec.structs.replace(SMALL, init_seed=11))  # a version no other test makes
    await learner.open()
    record = await learner.update()
    assert isinstance(record, PolicyUpdated)
    blobs = await log.js.object_store(BLOB_STORE)
    await blobs.delete(f"policy/{record.version}")  # only the learner's in-process copy is left
    lent = ProviderResources(learner.store)  # as a co-evolution lends its store to its rollouts' providers
    policy, version = await PolicyProvider(record.version, log=log, resources=lent).policy()
    assert version == record.version
    assert checkpoint.files_of(policy) == checkpoint.files_of(learner.policy)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_pass_compiles_its_training_step_once(log: EventLog) -> None:
    await play(log, 0)
    n = (await expected_pass(log, RUN, [0])).samples
    assert n > 2
    learner = Learner(log, RUN, msgspec.structs.replace(SMALL, algorithm=GRPOConfig(minibatch=n - 1, epochs=1)))
    await learner.open()
    record = await learner.update()
    assert isinstance(record, PolicyUpdated) and (record.samples, record.steps) == (n, 2)
    assert learner.trainer is not None and learner.trainer.compiles == 1


async def test_the_connection_is_served_while_a_pass_trains(log: EventLog) -> None:
    # A pass takes minutes on a real window: run on the event loop, it would starve the NATS
    # client (the server drops one that misses two pings). A round trip to the server is made
    # from inside the pass here; with the pass on the loop it could not complete and would time out.
    await play(log, 0)
    learner = Learner(log, RUN, SMALL)
    await learner.open()
    assert learner.trainer is not None
    loop, train = asyncio.get_running_loop(), learner.trainer.train
    round_trips: list[None] = []

    def train_with_a_round_trip(batches: Any) -> Any:
        round_trips.append(asyncio.run_coroutine_threadsafe(log.nc.flush(timeout=10), loop).result(timeout=30))
        return train(batches)

    learner.trainer.train = train_with_a_round_trip  # type: ignore[method-assign]
    record = await learner.update()
    assert isinstance(record, PolicyUpdated) and len(round_trips) == 1


# --- hx learn ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_hx_learn_once_trains_what_has_finished_and_prints_the_update(nats_url: str) -> None:
    on_log(nats_url, lambda log: play(log, 0))
    first = ok(hx("--nats-url", nats_url, "learn", RUN, "--once"))
    said = re.sub(r"\s+", " ", first.stderr).strip()  # the console wraps long lines
    opened = f"learner default of {RUN}: policy {checkpoint.version(checkpoint.create('scorer'))[:12]}, trained " \
             "through round -1 "
    assert said.startswith(opened) and said.count("through round 0: policy ") == 1
    assert re.search(r"through round 0: policy [0-9a-f]{12} · \d+ samples · groups \d+ used, \d+ without spread · "
                     r"loss [-0-9.]+ · KL 0.0000 .* on cpu$", said), said
    again = ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--json"))
    assert again.stdout == "" and re.sub(r"\s+", " ", again.stderr).strip().endswith("trained through round 0")

    on_log(nats_url, lambda log: play(log, 1))
    third = ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--json"))
    [line] = third.stdout.splitlines()
    printed = json.loads(line)
    records = updates(on_log(nats_url, lambda log: learn_records(log, RUN)))
    assert [r.through_round for r in records] == [0, 1] and all(isinstance(r, PolicyUpdated) for r in records)
    assert printed == as_json(records[1]) and printed["parent"] == records[0].version  # type: ignore[union-attr]
    assert f"through round 0: policy {records[0].version[:12]}" in said  # type: ignore[union-attr]


def test_hx_learn_of_a_run_that_is_not_there_is_a_one_line_error_that_writes_nothing(nats_url: str) -> None:
    assert error_line(hx("--nats-url", nats_url, "learn", "never-ran", "--once")) == (
        "error: run 'never-ran' is not on this log (no run.started): nothing to learn from")
    assert on_log(nats_url, lambda log: learn_records(log, "never-ran")) == []
    bad = hx("--nats-url", nats_url, "learn", "../x", "--once")
    assert bad.exit_code == 2 and "run id '../x' has characters '/'" in bad.output and "Traceback" not in bad.output


def test_hx_learn_policy_config_weigh_and_clip_set_the_learner_and_bad_values_are_usage_errors(nats_url: str) -> None:
    for pair in ("context_gain", "context_gain=high", "=0.1", "context_gain=true"):
        bad = hx("--nats-url", nats_url, "learn", RUN, "--once", "--policy-config", pair)
        assert bad.exit_code == 2 and f"{pair!r}: expected KEY=NUMBER" in bad.output, bad.output
    on_log(nats_url, lambda log: play(log, 0))
    ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "gain", "--policy-config", "context_gain=0",
          "--policy-config", "hidden=8"))
    first = on_log(nats_url, lambda log: learn_records(log, RUN, "gain"))[0]
    assert isinstance(first, PolicyInitialised) and first.config["config"] == {"context_gain": 0, "hidden": 8}
    assert first.config["per_trajectory"] is True
    ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "turns", "--weigh", "turn"))
    turns = on_log(nats_url, lambda log: learn_records(log, RUN, "turns"))[0]
    assert isinstance(turns, PolicyInitialised) and turns.config["per_trajectory"] is False
    assert turns.config["algorithm"]["clip_eps_high"] == 1.0  # clip-higher unless asked
    ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "symmetric", "--clip-eps-high", "0.2"))
    symmetric = on_log(nats_url, lambda log: learn_records(log, RUN, "symmetric"))
    assert isinstance(symmetric[0], PolicyInitialised) and symmetric[0].config["algorithm"]["clip_eps_high"] == 0.2
    assert isinstance(symmetric[1], PolicyUpdated)
    bad = hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "zero", "--clip-eps-high", "0")
    assert bad.exit_code == 2 and "--clip-eps-high" in bad.output, bad.output
    bad = hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "neg", "--policy-config", "context_gain=-1")
    assert error_line(bad) == "error: scorer config: context_gain=-1 must be a finite number >= 0"
    assert on_log(nats_url, lambda log: learn_records(log, RUN, "neg")) == []


def learner_process(url: str, data: Path, *args: str) -> Awaitable[asyncio.subprocess.Process]:
    """``hx learn RUN *args`` as a process of its own, in a session of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HX_")}
    return asyncio.create_subprocess_exec(sys.executable, "-m", "hx", "--nats-url", url, "--data-dir", str(data),
                                          "learn", RUN, *args, env={**env},
                                          stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                          start_new_session=True)


async def first_update(log: EventLog, proc: asyncio.subprocess.Process) -> PolicyUpdated:
    """The learner's first PolicyUpdated, read from HX_LEARN as it arrives; fails if the process dies first."""
    async def seen() -> PolicyUpdated:
        async for rec in log.subscribe(LEARN.name, subjects=[learn_subject(RUN, "default")],
                                       types=(PolicyUpdated.TYPE,)):
            assert isinstance(rec.event, PolicyUpdated)
            return rec.event
        raise AssertionError("the subscription ended")

    watch, died = asyncio.create_task(seen()), asyncio.create_task(proc.wait())
    done, _ = await asyncio.wait({watch, died}, timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    for task in (watch, died):
        if task not in done:
            task.cancel()
    await asyncio.gather(watch, died, return_exceptions=True)
    if watch not in done:
        stderr = (await proc.stderr.read()).decode() if died in done and proc.stderr else "(still running)"
        raise AssertionError(f"no PolicyUpdated within {DEADLINE_S}s; the learner: {stderr}")
    return watch.result()


@pytest.mark.slow
async def test_a_killed_follower_restarts_without_training_a_round_twice(
        log: EventLog, nats_url: str, tmp_path: Path) -> None:
    await play(log, 0)
    follower = await learner_process(nats_url, tmp_path)  # no --once: it follows the run, which is still open
    try:
        seen = await first_update(log, follower)
        assert seen.through_round == 0
    finally:
        follower.kill()  # SIGKILL: no cleanup, no checkpoint of its own
        await follower.wait()
    assert follower.returncode == -9

    await play(log, 1)
    again = await learner_process(nats_url, tmp_path, "--once")
    _, err = await asyncio.wait_for(again.communicate(), DEADLINE_S)
    assert again.returncode == 0, err.decode()
    said = re.sub(r"\s+", " ", err.decode())  # the console wraps long lines
    assert "trained through round 0 " in said and said.count("through round 1: policy ") == 1

    records = await learn_records(log, RUN)
    [init] = [r for r in records if isinstance(r, PolicyInitialised)]
    done = updates(records)
    assert [r.through_round for r in done] == [0, 1] and all(isinstance(r, PolicyUpdated) for r in done)
    chain = [init.version, *(r.version for r in done)]  # type: ignore[union-attr]
    assert [r.parent for r in done] == chain[:-1] and len(set(chain)) == 3
    assert done[0] == seen

    # Following again, it trains on the next round and stops by itself when the run finishes.
    follower = await learner_process(nats_url, tmp_path)
    try:
        await play(log, 2)
        await Rollout(ToyBench(), ModelConfig(), HarnessConfig(), log=log).finish(RUN, rounds=3)
        _, err = await asyncio.wait_for(follower.communicate(), DEADLINE_S)
    finally:
        if follower.returncode is None:
            follower.kill()
            await follower.wait()
    assert follower.returncode == 0, err.decode()
    done = updates(await learn_records(log, RUN))
    assert [r.through_round for r in done] == [0, 1, 2] and done[2].parent == chain[-1]


# --- hx coevolve ---------------------------------------------------------------------------------------------


def coevolve(url: str, data: Path, mode: str, *more: str, run_id: str = "") -> dict[str, Any]:
    """A tiny ``hx coevolve`` on the toy world in ``mode``; its JSON report, its held-out figures checked."""
    run_id = run_id or f"co-{mode}"
    result = ok(hx("--nats-url", url, "--data-dir", str(data), "coevolve", "--mode", mode, "--bench", "toyworld:rooms",
                   "--tasks", "4", "--heldout-tasks", "2", "--rounds", "2", "--max-steps", "30", "--concurrency",
                   "2", "--run-id", run_id, "--json", *more))
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["run_id"] == run_id and report["status"] in ("completed", "patience")
    for held in (report["heldout_before"], report["heldout_after"]):
        [game] = held["games"]
        assert game["game"] == "toyworld:rooms" and game["tasks"] == 2 and 0 <= game["pass_at_2"] <= 1
    assert report["heldout_before"]["round"] == -1 and report["heldout_after"]["round"] == len(report["rounds"]) - 1
    return report


def passes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The learner passes of a report (its ``learner`` list also holds the policy gate's verdicts)."""
    return [u for u in report["learner"] if "adopted" not in u]


def main_turns(url: str, run_id: str, gates: list[PolicyGated]) -> list[Any]:
    """The run's model turns outside the policy gate's rollouts."""
    gated = {r for g in gates for r in g.trace_rounds}
    return [t for t in on_log(url, lambda log: model_turns(log, run_id)) if t.round not in gated]


def ledger_of(url: str, run_id: str) -> list[LedgerEvent]:
    """The run's edit ledger as read back from the log."""
    async def main() -> list[LedgerEvent]:
        async with connect(NatsSettings(url=url)) as conn:
            return list(await read_records(conn, run_id) or [])
    return asyncio.run(main())


def models_in_force(url: str, run_id: str, records: list[LedgerEvent],
                    gates: list[PolicyGated]) -> dict[int, tuple[str, set[str]]]:
    """Per evolution round: the model its ledger says was in force, and the versions its rollouts were served by."""
    turns = main_turns(url, run_id, gates)
    out = {}
    for digested in (r for r in records if isinstance(r, RoundDigested)):
        state = RunState.of(r for r in records if not isinstance(r, ModelChanged) or r.round <= digested.round)
        out[digested.round] = (state.model, {f"policy:{t.response.model_version}" for t in turns
                                             if t.round in digested.trace_rounds})
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "gate"), [("both", True), ("model", False)])
def test_hx_coevolve_trains_the_policy_and_reports_it(nats_url: str, tmp_path: Path, mode: str, gate: bool) -> None:
    report = coevolve(nats_url, tmp_path, mode, *(["--policy-gate"] if gate else []))
    logged = on_log(nats_url, lambda log: learn_records(log, f"co-{mode}"))
    [init] = [r for r in logged if isinstance(r, PolicyInitialised)]
    assert report["learner"] == [as_json(r) for r in logged if r is not init]
    trained = [r for r in updates(logged) if isinstance(r, PolicyUpdated)]
    gates = [r for r in logged if isinstance(r, PolicyGated)]
    assert trained and len({r.through_round for r in updates(logged)}) == len(updates(logged))
    if gate:  # every new policy is judged right after its pass, before any other rollout
        assert [(g.candidate, g.parent) for g in gates] == [(r.version, r.parent) for r in trained]
        assert all(logged[logged.index(r) + 1] == g for r, g in zip(trained, gates, strict=True))
        assert all(g.adopted == (not g.lost) and g.rollouts >= g.solved for g in gates)
        assert report["policy"] == next((g.candidate for g in reversed(gates) if g.adopted), init.version)
    else:
        assert not gates and report["policy"] == trained[-1].version
    # Each pass starts from the policy the rollouts used: the last one adopted (every new one, ungated).
    current = init.version
    adopted = {init.version}
    for r in logged[1:]:
        if isinstance(r, PolicyUpdated):
            assert r.parent == current
            current = r.version if not gate else current
        elif isinstance(r, PolicyGated) and r.adopted:
            current = r.candidate
        adopted.add(current)
    # Each round's rollouts used the learner's policy of the moment; the last held-out ones, the final policy.
    served = {t.response.model_version for t in main_turns(nats_url, f"co-{mode}", gates)}
    assert served <= adopted and report["policy"] in served
    # The ledger names the model each round's rollouts (and so its verdicts) ran under, from the round it changed.
    ledger = ledger_of(nats_url, f"co-{mode}")
    in_force = models_in_force(nats_url, f"co-{mode}", ledger, gates)
    assert len(in_force) == len(report["rounds"]) and all(served == {model} for model, served in in_force.values())
    changes = [r for r in ledger if isinstance(r, ModelChanged)]
    assert [c.model for c in changes] == list(dict.fromkeys(model for _, (model, _) in sorted(in_force.items())))
    if mode == "model":  # a frozen harness: nothing is ever shipped
        assert all(not row["shipped"] for row in report["rounds"])


@pytest.mark.slow
def test_a_policy_that_loses_solved_tasks_is_rejected_and_its_parent_plays_on(
        nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = on_log(nats_url, forgetful)
    real = Trials.kept

    async def forgetting(self: Trials, harness: HarnessConfig, variant: str, tasks: Any, models: ModelConfig,
                         candidate: str) -> Any:
        # the gate judges a policy that forgot how to take the coin in place of the pass's own
        return await real(self, harness, variant, tasks, msgspec.structs.replace(models, main=f"policy:{bad}"),
                          candidate)

    monkeypatch.setattr(Trials, "kept", forgetting)
    # model mode: the starter harness throughout (a shipped processor could take the coin for the policy)
    report = coevolve(nats_url, tmp_path, "model", "--rounds", "3", "--policy-gate", run_id="co-forget")
    logged = on_log(nats_url, lambda log: learn_records(log, "co-forget"))
    init = logged[0]
    assert isinstance(init, PolicyInitialised)
    gates = [r for r in logged if isinstance(r, PolicyGated)]
    trained = [r for r in logged if isinstance(r, PolicyUpdated)]
    assert gates and all(not g.adopted and g.lost and len(g.lost) == g.solved for g in gates if g.solved)
    assert all(r.parent == init.version for r in trained)  # each pass starts again from the kept policy
    assert report["policy"] == init.version
    assert {t.response.model_version for t in main_turns(nats_url, "co-forget", gates)} == {init.version}
    spent = sum(row["rollouts"] for row in report["rounds"]) + sum(g.rollouts for g in gates)
    assert sum(g.rollouts for g in gates) >= sum(g.solved for g in gates) * 2 * (1 + RETRIES) > 0
    assert spent > sum(row["rollouts"] for row in report["rounds"])


@pytest.mark.slow
def test_hx_coevolve_harness_mode_keeps_the_policy(nats_url: str, tmp_path: Path) -> None:
    report = coevolve(nats_url, tmp_path, "harness")
    logged = on_log(nats_url, lambda log: learn_records(log, "co-harness"))
    [init] = logged
    assert isinstance(init, PolicyInitialised)
    assert report["learner"] == [] and report["policy"] == init.version
    served = {t.response.model_version for t in on_log(nats_url, lambda log: model_turns(log, "co-harness"))}
    assert served == {init.version}
    changes = [r for r in ledger_of(nats_url, "co-harness") if isinstance(r, ModelChanged)]
    assert [(c.round, c.model) for c in changes] == [(0, f"policy:{init.version}")]  # the first policy, once


@pytest.mark.slow
def test_a_learner_that_waits_for_the_stall_trains_first_after_the_first_round_without_a_ship(
        nats_url: str, tmp_path: Path) -> None:
    report = coevolve(nats_url, tmp_path, "both", "--rounds", "4", "--learn-after-stall", run_id="co-stall")
    ledger = ledger_of(nats_url, "co-stall")
    decided = [r for r in ledger if isinstance(r, RoundDecided)]
    stall = next(r.round for r in decided if r.idle)  # the toy world's evolver runs out of edits within 4 rounds
    assert stall >= 1, "round 0 shipped nothing: the test would not tell waiting from learning at once"
    assert stall < len(decided) - 1, "no round after the stall: the test would not see a trained policy play"
    logged = on_log(nats_url, lambda log: learn_records(log, "co-stall"))
    init = logged[0]
    assert isinstance(init, PolicyInitialised)
    trained = [r for r in updates(logged) if isinstance(r, PolicyUpdated)]
    # no pass before the stall; the first one trains on every round so far, then one pass per round
    assert trained and len(updates(logged)) == len(decided) - stall
    assert updates(logged)[0].parent == init.version
    in_force = models_in_force(nats_url, "co-stall", ledger, [])
    for t, (model, served) in sorted(in_force.items()):
        first = t <= stall  # the rounds up to the stall are the harness-only run's: the first policy plays them
        assert (served == {f"policy:{init.version}"}) == first and served == {model}, (t, stall, served)
    assert report["policy"] == trained[-1].version


@pytest.mark.slow
def test_barren_tasks_sit_out_rounds_and_the_ledger_names_them(nats_url: str, tmp_path: Path) -> None:
    # 14 steps: a random walk reaches the coin in some tasks and not in others (every pattern of resting shows)
    report = coevolve(nats_url, tmp_path, "model", "--rounds", "4", "--max-steps", "14", "--rest-barren", "1",
                      run_id="co-rest")
    ledger = ledger_of(nats_url, "co-rest")
    digested = {r.round: r for r in ledger if isinstance(r, RoundDigested)}
    tasks = {d.task for d in digested[0].digests}
    assert len(tasks) == 4 and not digested[0].rested  # round 0 knows no barren task
    turns = main_turns(nats_url, "co-rest", [])  # the trace, read once
    played = {t: {turn.task for turn in turns if turn.round in r.trace_rounds} for t, r in digested.items()}
    assert any(r.rested for r in digested.values()), "no task rested: the test would not see the rule act"
    for t, r in digested.items():
        assert set(r.rested) | {d.task for d in r.digests} == tasks and not set(r.rested) & played[t]
        assert played[t] == {d.task for d in r.digests} and report["rounds"][t]["rollouts"] == 2 * len(played[t])
        if t == 0:
            continue
        # with R = 1: a task that failed both attempts of the round before sits out, one that sat out plays
        failed = {d.task for d in digested[t - 1].digests if d.passes == 0}
        if failed != tasks:  # (when every task would rest, all play)
            assert set(r.rested) == failed
    # an auditor's export names them in the round's decision
    ok(hx("--nats-url", nats_url, "export", "co-rest", str(tmp_path / "export")))
    for t, r in digested.items():
        decision = (tmp_path / "export" / f"R{t}" / "decision.md").read_text()
        assert ("## Rested" in decision) == bool(r.rested) and all(f"`{task}`" in decision for task in r.rested)


def test_learn_after_stall_outside_both_is_a_usage_error(nats_url: str, tmp_path: Path) -> None:
    bad = hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "coevolve", "--mode", "model",
             "--bench", "toyworld:rooms", "--learn-after-stall", "--run-id", "co-bad")
    assert bad.exit_code == 2 and "--learn-after-stall applies to --mode both, not --mode model" in bad.output
    assert on_log(nats_url, lambda log: learn_records(log, "co-bad")) == []  # refused before anything is written


@pytest.mark.slow
def test_hx_coevolve_stops_when_its_rollout_budget_is_spent(nats_url: str, tmp_path: Path) -> None:
    result = ok(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "coevolve", "--mode", "model", "--bench",
                   "toyworld:rooms", "--tasks", "4", "--heldout-tasks", "2", "--rounds", "3", "--max-steps", "30",
                   "--budget", "5", "--run-id", "co-budget", "--json"))
    report = json.loads(result.stdout)
    [row] = report["rounds"]  # 8 attempts in round 0 spend the budget of 5: no round 1
    assert row["rollouts"] == 8 and report["status"] == "completed" and len(passes(report)) == 1
    assert report["heldout_after"]["round"] == 0


@pytest.mark.slow
def test_a_coevolution_resumed_after_spending_its_budget_starts_no_new_round(nats_url: str, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    common = ("--nats-url", nats_url, "--data-dir", str(tmp_path), "coevolve")
    real = Evolution.heldout

    async def failing(self: Evolution, after: int) -> Any:
        if after >= 0:  # the run dies after deciding the round that spent its budget, as a lost server would end it
            raise HxError("the server went away")
        return await real(self, after)

    monkeypatch.setattr(Evolution, "heldout", failing)
    assert "the server went away" in error_line(hx(*common, "--mode", "model", "--bench", "toyworld:rooms", "--tasks",
                                                   "4", "--heldout-tasks", "2", "--rounds", "3", "--max-steps", "30",
                                                   "--budget", "5", "--run-id", "co-spent", "--json"))
    monkeypatch.undo()
    report = json.loads(ok(hx(*common, "--resume", "co-spent", "--json")).stdout)
    [row] = report["rounds"]  # round 0's 8 attempts spent the budget of 5: the resumed run goes to its held-out
    assert row["rollouts"] == 8 and report["status"] == "completed" and report["heldout_after"]["round"] == 0
    assert len(passes(report)) == 1


@pytest.mark.slow
async def test_the_lm_kind_plays_through_the_provider_and_trains_through_the_learner(log: EventLog) -> None:
    tiny = {"d_model": 32, "layers": 1, "heads": 2, "ctx": 128, "mlp": 64}
    models = ModelConfig(main="policy:lm", provider_options={"policy:lm": {"config": tiny}})
    rollout = Rollout(ToyBench(), models, HarnessConfig(), log=log, settings=SETTINGS)
    await rollout.start(RUN)
    await rollout.run_round(RUN, 0, TASKS)
    learner = Learner(log, RUN, msgspec.structs.replace(SMALL, kind="lm", config=tiny))
    initial = (await learner.open()).initial
    turns = await model_turns(log, RUN)
    assert turns and {t.response.model_version for t in turns} == {initial}  # the same fresh LM on both sides
    assert all(len(t.response.logprobs) >= 2 for t in turns)  # token-level: " take coin<eos>" is several tokens
    record = await learner.update()
    assert isinstance(record, PolicyUpdated) and record.kind == "lm" and record.samples > 0
    assert "unservable" not in record.skipped and "unit_mismatch" not in record.skipped


@pytest.mark.slow
def test_a_coevolution_stopped_between_a_pass_and_its_verdict_judges_the_pass_when_resumed(
        nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    common = ("--nats-url", nats_url, "--data-dir", str(tmp_path), "coevolve")

    async def failing(self: Trials, *args: Any, **kwargs: Any) -> Any:
        raise HxError("the server went away")  # as a lost server would end the run in the policy gate

    monkeypatch.setattr(Trials, "kept", failing)
    assert "the server went away" in error_line(hx(*common, "--mode", "model", "--bench", "toyworld:rooms", "--tasks",
                                                   "4", "--heldout-tasks", "2", "--rounds", "3", "--max-steps", "30",
                                                   "--policy-gate", "--run-id", "co-cut", "--json"))
    cut = on_log(nats_url, lambda log: learn_records(log, "co-cut"))
    assert isinstance(cut[-1], PolicyUpdated)  # the pass is recorded, its verdict is not
    monkeypatch.undo()
    report = json.loads(ok(hx(*common, "--resume", "co-cut", "--json")).stdout)
    logged = on_log(nats_url, lambda log: learn_records(log, "co-cut"))
    verdict = logged[len(cut)]
    assert logged[:len(cut)] == cut and isinstance(verdict, PolicyGated)
    assert (verdict.candidate, verdict.through_round) == (cut[-1].version, cut[-1].through_round)
    # one pass per round: the verdict's rollouts are not a round the resumed learner trains on again
    through = [r.through_round for r in updates(logged)]
    assert len(through) == len(set(through)) == len(report["rounds"])
