"""Learner algorithms: RLOO's advantages by hand, one rule for groups without spread, ``hx learn --algorithm``,
and learner settings and records written before algorithms were named."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest
from hx_cli import error_line, hx, ok
from learner_kit import learn_records
from test_learner_service import RUN, on_log, play

from hx.aegis.coevolution import CoevolveSettings
from hx.errors import UnknownName
from hx.learner.algorithm import ALGORITHMS, algorithm
from hx.learner.errors import PolicyError
from hx.learner.grpo import GRPO, GRPOConfig
from hx.learner.policy_gradient import PolicyGradientConfig
from hx.learner.rloo import RLOO, RLOOConfig
from hx.learner.step_groups import turn_advantages
from hx.learner.trainer import LearnerSettings
from hx.processors.training_bridge import RLRecord, group_advantages
from projections.trajectories import Trajectory
from schemas.envelope import decode_body
from schemas.learn import PolicyInitialised, PolicyUpdated
from schemas.messages import Message


def test_rloo_subtracts_the_mean_reward_of_the_rest_of_the_group() -> None:
    got = RLOO().advantages({"four": [1.0, 0.0, 0.5, 0.5], "two": [1.0, 0.0], "one": [3.0],
                             "same": [0.1, 0.1, 0.1]}, RLOOConfig())
    # four: the others' means are 1/3, 2/3, 1/2, 1/2
    assert got["four"] == pytest.approx([1.0 - 1 / 3, 0.0 - 2 / 3, 0.0, 0.0], abs=1e-15)
    assert got["two"] == [1.0, -1.0]
    assert got["one"] == [0.0] and got["same"] == [0.0, 0.0, 0.0]  # no baseline, no spread: no signal
    with pytest.raises(PolicyError, match="'bad'"):
        RLOO().advantages({"bad": [0.0, float("inf")]}, RLOOConfig())


def test_algorithms_are_found_by_name_and_an_unknown_name_lists_the_known() -> None:
    assert ALGORITHMS.names() == ("grpo", "rloo")
    assert isinstance(algorithm("grpo"), GRPO) and isinstance(algorithm("rloo"), RLOO)
    assert (GRPO.config_type, RLOO.config_type) == (GRPOConfig, RLOOConfig)
    with pytest.raises(UnknownName, match="unknown learner algorithm 'ppo'; known: grpo, rloo"):
        algorithm("ppo")


def trajectory(task: str, attempt: int, reward: float) -> Trajectory:
    """A trajectory of no turns: the grouping and the reward are all the advantages read."""
    return Trajectory(run_id="r", round=0, task_id=task, attempt=attempt, harness_digest="h", model="m",
                      model_version="v", reward=reward, passed=reward > 0, status="completed", turns=())


def records(task: str, rewards: list[float]) -> list[RLRecord]:
    """One RL record per attempt of ``task``, with these rewards."""
    done = Message(role="assistant", content="done")
    return [RLRecord(group=task, task_id=task, attempt=n, turn=0, step=1, completion=done, reward=r)
            for n, r in enumerate(rewards)]


@pytest.mark.parametrize("rewards", [[0.1, 0.1, 0.1], [1.0, 1.0], [0.0], [0.3, 0.7, 0.7, 0.1]])
def test_the_bridge_and_the_learner_give_a_group_the_same_advantages(rewards: list[float]) -> None:
    bridge = [r.advantage for r in group_advantages(records("t", rewards))]
    learner = GRPO().advantages({"t": rewards}, GRPOConfig())["t"]
    assert bridge == learner  # one arithmetic: the same floats
    if len(set(rewards)) == 1:
        assert bridge == [0.0] * len(rewards)  # equal rewards carry no signal
        # and the learner drops such a group itself, when its steps tell nothing apart either
        groups = {"t": [trajectory("t", n, r) for n, r in enumerate(rewards)]}
        assert turn_advantages(groups, 0.0) == {}


OLD_POLICY_INITIALISED = (
    "haZydW5faWShcqdsZWFybmVyo29sZKd2ZXJzaW9u2UBhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFh"
    "YWFhYWFhYWFhYWFhYWFhpGtpbmSmc2NvcmVypmNvbmZpZ4umY29uZmlngaNkaW0QpGdycG+Lp2Fkdl9lcHPLPrDG96C17Y2oY2xpcF9lcHPL"
    "P8mZmZmZmZqtY2xpcF9lcHNfaGlnaMs/8AAAAAAAAKxlbnRyb3B5X2NvZWbLAAAAAAAAAACmZXBvY2hzBKdrbF9iZXRhyz+keuFHrhR7rWxl"
    "YXJuaW5nX3JhdGXLP4R64UeuFHutbWF4X2dyYWRfbm9ybcs/8AAAAAAAAKltaW5pYmF0Y2jNAQCkc2VlZAesd2VpZ2h0X2RlY2F5ywAAAAAA"
    "AAAApGluaXSgqWluaXRfc2VlZACka2luZKZzY29yZXKnbGVhcm5lcqNvbGSwb2ZmX3BvbGljeV90dXJuc8KucGVyX3RyYWplY3RvcnnDrXN0"
    "ZXBfZGlzY291bnTLP+5mZmZmZmarc3RlcF93ZWlnaHTLP+AAAAAAAACmd2luZG93Ag==")
"""The body of a ``PolicyInitialised`` exactly as the learner wrote it before algorithms were named (its settings
``LearnerSettings(learner="old", config={"dim": 16}, window=2, step_weight=0.5, grpo=GRPOConfig(learning_rate=1e-2,
kl_beta=0.04, clip_eps_high=1.0, epochs=4, minibatch=256, seed=7))``)."""
OLD_COEVOLVE = (
    '{"mode": "model", "budget": 0, "learner": {"learner": "old", "kind": "scorer", "config": {"dim": 16}, "init": "",'
    ' "init_seed": 0, "window": 2, "per_trajectory": true, "off_policy_turns": false, "step_weight": 0.5, '
    '"step_discount": 0.95, "grpo": {"learning_rate": 0.01, "weight_decay": 0.0, "clip_eps": 0.2, "clip_eps_high": '
    '1.0, "kl_beta": 0.04, "entropy_coef": 0.0, "max_grad_norm": 1.0, "adv_eps": 1e-06, "epochs": 4, "minibatch": '
    '256, "seed": 7}}, "policy_gate": false, "learn_after_stall": false, "rest_barren": 0}')
"""``CoevolveSettings`` as a ledger's ``LedgerOpened.settings["coevolve"]`` held them before algorithms were named."""
OLD_GRPO = GRPOConfig(learning_rate=1e-2, kl_beta=0.04, clip_eps_high=1.0, epochs=4, minibatch=256, seed=7)


def test_learner_records_and_settings_written_before_algorithms_were_named_read_as_grpo() -> None:
    event = decode_body(PolicyInitialised.TYPE, 1, base64.b64decode(OLD_POLICY_INITIALISED))
    assert isinstance(event, PolicyInitialised) and event.algorithm is msgspec.UNSET and "grpo" in event.config
    settings = msgspec.convert(event.config, LearnerSettings)
    assert settings == LearnerSettings(learner="old", config={"dim": 16}, window=2, step_weight=0.5,
                                       algorithm=OLD_GRPO)
    assert "grpo" not in msgspec.to_builtins(settings)  # written back in the new shape
    assert msgspec.to_builtins(settings)["algorithm"]["name"] == "grpo"
    coevolve = msgspec.convert(json.loads(OLD_COEVOLVE), CoevolveSettings)
    assert coevolve.learner == settings and coevolve.mode == "model"
    rloo = LearnerSettings(algorithm=RLOOConfig(learning_rate=1e-2))
    assert msgspec.convert(msgspec.to_builtins(rloo), LearnerSettings) == rloo


def test_learner_settings_refuse_a_config_they_could_not_read_back() -> None:
    class Other(PolicyGradientConfig, frozen=True, kw_only=True, tag="other", tag_field="name"):
        """An algorithm config that ``AlgorithmConfig`` does not list."""

    with pytest.raises(PolicyError, match=r"LearnerSettings\.algorithm: Other is not one of GRPOConfig, RLOOConfig"):
        LearnerSettings(algorithm=Other())  # type: ignore[arg-type]


@pytest.mark.slow
def test_hx_learn_algorithm_rloo_trains_another_policy_than_grpo_from_the_same_round(nats_url: str) -> None:
    on_log(nats_url, lambda log: play(log, 0))
    ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "g"))
    ok(hx("--nats-url", nats_url, "learn", RUN, "--once", "--learner", "r", "--algorithm", "rloo"))
    [g_init, g_pass] = on_log(nats_url, lambda log: learn_records(log, RUN, "g"))
    [r_init, r_pass] = on_log(nats_url, lambda log: learn_records(log, RUN, "r"))
    assert isinstance(g_init, PolicyInitialised) and isinstance(r_init, PolicyInitialised)
    assert (g_init.algorithm, r_init.algorithm) == ("grpo", "rloo") and g_init.version == r_init.version
    assert r_init.config["algorithm"]["name"] == "rloo" and g_init.config["algorithm"]["name"] == "grpo"
    assert isinstance(g_pass, PolicyUpdated) and isinstance(r_pass, PolicyUpdated)
    assert (g_pass.samples, g_pass.groups_used) == (r_pass.samples, r_pass.groups_used)  # the same data
    assert g_pass.version != r_pass.version and g_pass.parent == r_pass.parent == g_init.version


def test_an_unknown_algorithm_is_a_one_line_error_naming_the_known_ones(nats_url: str) -> None:
    on_log(nats_url, lambda log: play(log, 0))
    bad = hx("--nats-url", nats_url, "learn", RUN, "--once", "--algorithm", "ppo")
    assert error_line(bad) == "error: unknown learner algorithm 'ppo'; known: grpo, rloo"
    assert on_log(nats_url, lambda log: learn_records(log, RUN)) == []


def test_hx_learn_and_hx_coevolve_offer_the_registered_algorithms() -> None:
    for command in ("learn", "coevolve"):
        shown = " ".join(ok(hx(command, "--help")).stdout.split())
        assert "--algorithm [grpo|rloo]" in shown and "[default: grpo]" in shown, shown
