"""The trainable policy as the run loop and the learner see it: the scorer kind, its checkpoints, and ``policy:``
as a model provider on real rollouts of the toy corridor benchmark against a real nats-server."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
import pytest
from flax import nnx
from learner_kit import (
    GO,
    SAY,
    ModelTurn,
    TalkBench,
    finished,
    model_errors,
    model_turns,
    perturbed,
    sample_of,
)
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors
from toybench import ACT, ACTIONS, ToyBench, ids

from hx.environments.rollout import Rollout, RolloutSettings
from hx.harness.config import HarnessConfig
from hx.learner import checkpoint, orbax_params
from hx.learner.errors import PolicyError, Unservable
from hx.learner.policy import Decision, bucket, decisions_of
from hx.learner.provider import PolicyProvider
from hx.learner.scorer import Context, ScorerPolicy
from hx.runtime.errors import ModelSpecError
from hx.runtime.models import ModelConfig
from schemas.messages import Message, ToolCall
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import BLOB_STORE

CHAT = (Message(role="system", content="Find the coin."), Message(role="user", content="You are in room 0 of 3."))
SETTINGS = RolloutSettings(attempts=2, concurrency=2, max_steps=5, seed=3)
TASKS = ids("easy", 1) + ids("walk", 1)


def conversation(turns: int) -> tuple[Message, ...]:
    """The corridor chat after ``turns`` moves east."""
    out = list(CHAT)
    for i in range(turns):
        out.append(Message(role="assistant", tool_calls=(ToolCall(id=f"c{i}", name="act", input={"action":
                                                                                                "move east"}),)))
        out.append(Message(role="tool", content=f"You are in room {i + 1}.", tool_call_id=f"c{i}"))
    return tuple(out)


def act_call(action: str) -> ToolCall:
    """A call of the corridor's ``act``."""
    return ToolCall(id="c", name="act", input={"action": action})


@pytest.fixture
async def log(nats_url: str) -> AsyncIterator[EventLog]:
    """The event log on the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        yield conn.log


# --- the scorer: uniform at first, seeded, factorised like random: ------------------------------------------


def test_an_untrained_scorer_is_uniform_over_each_decisions_options() -> None:
    policy = checkpoint.create("scorer")
    for turns in (0, 3):
        gen = policy.act(conversation(turns), (ACT, SAY, GO), seed=turns)
        sizes = [2, 2, 3] if gen.tool_calls[0].name == "go" else [2, len(ACTIONS)]
        assert [lp.logprob for lp in gen.logprobs] == pytest.approx([-math.log(n) for n in sizes], abs=1e-6)
    scored = policy.score([sample_of(conversation(2), (ACT,), act_call(a)) for a in ACTIONS])
    assert scored == [pytest.approx((-math.log(len(ACTIONS)),), abs=1e-6)] * len(ACTIONS)


def test_act_is_seeded_and_every_call_is_made_of_enum_members() -> None:
    policy = perturbed(checkpoint.create("scorer"))
    tools = (ACT, SAY, GO)
    drawn = [policy.act(conversation(1), tools, seed=s) for s in range(40)]
    assert [policy.act(conversation(1), tools, seed=s) for s in range(40)] == drawn  # same seed, same answer
    calls = [g.tool_calls for g in drawn]
    assert all(len(c) == 1 for c in calls)
    assert len({msgspec.json.encode(c) for c in calls}) > 4  # seeds differ, answers differ
    assert {c[0].name for c in calls} == {"act", "go"}  # both playable tools are drawn, never the free one
    for (call,) in calls:
        if call.name == "act":
            assert call.input["action"] in ACTIONS and set(call.input) == {"action"}
        else:  # enum values keep their type; the free property is left out
            assert call.input["dir"] in ("north", "south") and call.input["speed"] in (1, 2, 3)
            assert isinstance(call.input["speed"], int) and set(call.input) == {"dir", "speed"}
    greedy = {msgspec.json.encode(policy.act(conversation(1), tools, seed=s, temperature=0).tool_calls)
              for s in range(5)}
    assert len(greedy) == 1  # temperature 0 ignores the seed


def test_act_logprobs_are_the_score_of_the_same_completion() -> None:
    policy = perturbed(checkpoint.create("scorer"), seed=2)
    tools = (ACT, GO)
    samples, logged = [], []
    for s in range(12):
        messages = conversation(s % 4)
        gen = policy.act(messages, tools, seed=s)
        samples.append(sample_of(messages, tools, *gen.tool_calls))
        logged.append(tuple(lp.logprob for lp in gen.logprobs))
    assert len({len(lp) for lp in logged}) == 2 and len({round(x, 4) for lp in logged for x in lp}) > 4  # not uniform
    together = policy.score(samples)
    for lp, alone, sample in zip(logged, together, samples, strict=True):
        assert alone == pytest.approx(lp, abs=1e-5)
        assert policy.score([sample])[0] == pytest.approx(lp, abs=1e-5)  # padding does not change a score


def test_two_playable_tools_factorise_into_a_tool_choice_then_one_unit_per_enumerated_property() -> None:
    call = ToolCall(id="c", name="go", input={"dir": "south", "speed": 3, "note": "whatever"})
    assert decisions_of((SAY, ACT, GO), call) == [
        (Decision(tool="", prop="", options=("act", "go")), 1),
        (Decision(tool="go", prop="dir", options=("north", "south")), 1),
        (Decision(tool="go", prop="speed", options=("1", "2", "3")), 2)]
    assert decisions_of((ACT, SAY), act_call("take coin")) == [  # one playable tool: no tool-choice unit
        (Decision(tool="act", prop="action", options=ACTIONS), 3)]
    policy = perturbed(checkpoint.create("scorer"), seed=3)
    batch = policy.encode([sample_of(CHAT, (ACT, GO), call), sample_of(CHAT, (ACT, GO), act_call("look")),
                           sample_of(CHAT, (ACT,), act_call("look"))])
    assert batch["mask"][:3].sum(axis=1).tolist() == [3, 2, 1]
    gen = next(g for s in range(50) if (g := policy.act(CHAT, (ACT, GO), seed=s)).tool_calls[0].name == "go")
    assert [lp.token for lp in gen.logprobs[:1]] == ["go"] and len(gen.logprobs) == 3
    assert gen.logprobs[2].token in ("1", "2", "3")  # a non-string enum value as JSON text


def test_what_the_scorer_cannot_serve_is_unservable_and_says_why() -> None:
    policy = checkpoint.create("scorer")
    with pytest.raises(Unservable, match=r"no tool with enumerated inputs.*\['say'\]"):
        policy.act(CHAT, (SAY,), seed=0)
    with pytest.raises(Unservable, match="tools offered: none"):
        policy.act(CHAT, (), seed=0)
    good = sample_of(CHAT, (ACT,), act_call("look"))
    with pytest.raises(Unservable, match=r"sample 1: tool call 'act': action='dance' is not one of its 4 choices"):
        policy.score([good, sample_of(CHAT, (ACT,), act_call("dance"))])
    with pytest.raises(Unservable, match=r"sample 0: .*one tool call, the completion has 0"):
        policy.encode([msgspec.structs.replace(good, completion=Message(role="assistant", content="I give up."))])
    with pytest.raises(Unservable, match=r"tool call 'say' is not one of the playable tools \['act'\]"):
        policy.score([sample_of(CHAT, (ACT, SAY), ToolCall(id="c", name="say", input={"text": "hi"}))])
    with pytest.raises(Unservable, match="speed='fast' is not one of its 3 choices"):
        policy.score([sample_of(CHAT, (GO,), ToolCall(id="c", name="go", input={"dir": "north", "speed": "fast"}))])
    assert issubclass(Unservable, PolicyError) and policy.score([]) == []


def test_encode_pads_to_bucketed_shapes() -> None:
    policy = checkpoint.create("scorer")
    go = ToolCall(id="c", name="go", input={"dir": "north", "speed": 1})
    five = [sample_of(conversation(i), (ACT, GO), go if i % 2 else act_call("look")) for i in range(5)]
    seven = [sample_of(conversation(10 + i), (ACT, GO), go) for i in range(7)]
    a, b = policy.encode(five), policy.encode(seven)
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert a["mask"].shape == (8, 4)  # 5 and 7 rows -> 8; 3 decisions -> 4
    assert a["options"].shape[2] == 8  # at least 8 option slots
    assert (a["mask"].sum(axis=1) > 0).sum() == 5 and not a["mask"][5:].any()
    nine = policy.encode(five + five[:4])
    assert nine["mask"].shape[0] == 16
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16] and bucket(3, 8) == 8


# --- checkpoints --------------------------------------------------------------------------------------------


def test_a_checkpoint_directory_round_trips_bit_exact_under_a_stable_version(tmp_path: Path) -> None:
    policy = perturbed(checkpoint.create("scorer", {"dim": 16, "hidden": 32}, seed=4))
    ver = checkpoint.save(policy, tmp_path / "a")
    assert ver == checkpoint.version(policy) == checkpoint.version_of(checkpoint.files_of(policy))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["config.json", "model.safetensors"]
    loaded = checkpoint.load(tmp_path / "a")
    assert isinstance(loaded, ScorerPolicy) and loaded.config == policy.config
    assert checkpoint.files_of(loaded) == checkpoint.files_of(policy)  # byte for byte
    assert checkpoint.save(loaded, tmp_path / "b") == ver
    assert policy.act(conversation(2), (ACT, GO), seed=9) == loaded.act(conversation(2), (ACT, GO), seed=9)
    assert checkpoint.version(checkpoint.create("scorer", {"dim": 16, "hidden": 32}, seed=4)) != ver
    # One weight changed: another version.
    tensors = load_tensors((tmp_path / "a" / "model.safetensors").read_bytes())
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[0] += 1e-3
    (tmp_path / "b" / "model.safetensors").write_bytes(save_tensors(tensors))
    changed = checkpoint.load(tmp_path / "b")
    assert checkpoint.version(changed) != ver and checkpoint.version(checkpoint.load(tmp_path / "a")) == ver


def option_logprobs(policy: ScorerPolicy, observation: str) -> np.ndarray:
    """The scorer's distribution over the corridor's actions after an observation."""
    ctx = Context((*CHAT, Message(role="user", content=observation)), policy.config["hist_len"])
    return policy._distribution(ctx, Decision(tool="act", prop="action", options=tuple(ACTIONS)), 1.0)


def test_context_gain_weighs_the_context_term_and_zero_makes_the_words_around_the_options_moot() -> None:
    def scorer(gain: float) -> ScorerPolicy:
        policy = perturbed(checkpoint.create("scorer", {"dim": 16, "hidden": 32, "context_gain": gain}, seed=2))
        assert isinstance(policy, ScorerPolicy)
        return policy

    # Two observations that differ only in words no option has: only the context term can tell them apart.
    quiet, loud = "A lamp hums here.", "Rain drums on a tin roof."
    for gain in (1.0, 0.1):
        assert not np.allclose(option_logprobs(scorer(gain), quiet), option_logprobs(scorer(gain), loud))
    assert np.allclose(option_logprobs(scorer(0.0), quiet), option_logprobs(scorer(0.0), loud))
    assert scorer(0.0).config["context_gain"] == 0.0 and checkpoint.create("scorer").config["context_gain"] == 0.0
    for bad in (-0.5, math.nan, math.inf, "high", True):
        with pytest.raises(PolicyError, match=r"context_gain=.* must be a finite number >= 0"):
            checkpoint.create("scorer", {"context_gain": bad})


def test_a_checkpoint_from_before_context_gain_serves_as_it_was_made(tmp_path: Path) -> None:
    made = perturbed(checkpoint.create("scorer", {"dim": 16, "hidden": 32, "context_gain": 1.0}, seed=6))
    assert isinstance(made, ScorerPolicy)
    files = checkpoint.files_of(made)
    config = json.loads(files["config.json"])
    del config["context_gain"]  # as written before the key existed
    old = loaded_from(tmp_path / "old", {**files, "config.json": json.dumps(config).encode()})
    assert old.config["context_gain"] == 1.0
    assert np.array_equal(option_logprobs(old, "A lamp hums here."), option_logprobs(made, "A lamp hums here."))
    # A fresh policy asked for without the key takes today's default instead.
    assert checkpoint.create("scorer", {"dim": 16}).config["context_gain"] == 0.0


def loaded_from(path: Path, files: dict[str, bytes]) -> ScorerPolicy:
    """Write ``files`` as a checkpoint directory and load it."""
    path.mkdir()
    for name, data in files.items():
        (path / name).write_bytes(data)
    policy = checkpoint.load(path)
    assert isinstance(policy, ScorerPolicy)
    return policy


def load_error(path: Path, files: dict[str, bytes]) -> str:
    """Write ``files`` (empty ones left out) as a checkpoint directory; the PolicyError loading it raises."""
    path.mkdir()
    for name, data in files.items():
        if data:
            (path / name).write_bytes(data)
    with pytest.raises(PolicyError) as caught:
        checkpoint.load(path)
    return str(caught.value)


def test_a_bad_checkpoint_is_a_policy_error_naming_the_problem(tmp_path: Path) -> None:
    policy = checkpoint.create("scorer", {"dim": 8, "hidden": 16})
    good = checkpoint.files_of(policy)
    tensors = load_tensors(good["model.safetensors"])

    def broken(name: str, **files: bytes) -> str:
        message = load_error(tmp_path / name, {**good, **{k.replace("_", "."): v for k, v in files.items()}})
        assert str(tmp_path / name) in message  # where, then what
        return message

    assert "model.safetensors does not load" in broken("garbage", model_safetensors=b"\x00not safetensors")
    assert "model.safetensors does not load" in broken("cut", model_safetensors=good["model.safetensors"][:-100])
    assert "config.json is not JSON" in broken("json", config_json=b"{kind: scorer")
    assert "names no policy kind" in broken("nokind", config_json=b"{}")
    assert "no model.safetensors" in broken("noweights", model_safetensors=b"")
    assert "no config.json" in broken("noconfig", config_json=b"")
    wrong = dict(tensors, **{"embed/embedding": np.zeros((10, 8), np.float32)})
    message = broken("shape", model_safetensors=save_tensors(wrong))
    assert "'embed/embedding'" in message and "[10, 8]" in message and "[4096, 8]" in message
    lacking = {k: v for k, v in tensors.items() if k != "prior/kernel"}
    assert "lack tensor 'prior/kernel'" in broken("lacking", model_safetensors=save_tensors(lacking))
    with pytest.raises(PolicyError, match="is not a directory"):
        checkpoint.load(tmp_path / "nowhere")
    with pytest.raises(PolicyError, match="unknown key"):
        checkpoint.create("scorer", {"depth": 3})


def test_an_unknown_kind_or_setting_names_the_checkpoint_too(tmp_path: Path) -> None:
    good = checkpoint.files_of(checkpoint.create("scorer", {"dim": 8, "hidden": 16}))
    message = load_error(tmp_path / "kind", {**good, "config.json": json.dumps({"kind": "transformer"}).encode()})
    assert "unknown policy kind 'transformer'; known: lm, scorer" in message
    assert str(tmp_path / "kind") in message
    message = load_error(tmp_path / "key", {**good, "config.json": json.dumps({"kind": "scorer", "depth": 3}).encode()})
    assert "unknown key(s) depth" in message and str(tmp_path / "key") in message


@pytest.mark.parametrize("kind", ["scorer", "lm"])
def test_an_orbax_checkpoint_round_trips_bit_exact_under_the_safetensors_version(tmp_path: Path, kind: str) -> None:
    policy = perturbed(checkpoint.create(kind, seed=4))
    ver = checkpoint.save(policy, tmp_path / "o", format="orbax")
    assert ver == checkpoint.version(policy) == checkpoint.save(policy, tmp_path / "s")
    side = ["tokenizer.json"] if kind == "lm" else []
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["config.json", "params", *side]
    assert (tmp_path / "o" / "params").is_dir()
    loaded = checkpoint.load(tmp_path / "o")
    assert type(loaded) is type(policy) and loaded.config == policy.config
    assert checkpoint.files_of(loaded) == checkpoint.files_of(policy)  # byte for byte, safetensors included
    assert checkpoint.version(loaded) == ver
    assert loaded.act(conversation(2), (ACT, GO), seed=9) == policy.act(conversation(2), (ACT, GO), seed=9)
    # Saving over a checkpoint of the other form replaces it: the directory holds one checkpoint.
    assert checkpoint.save(loaded, tmp_path / "s", format="orbax") == ver
    assert not (tmp_path / "s" / "model.safetensors").exists()
    assert checkpoint.save(checkpoint.load(tmp_path / "s"), tmp_path / "o") == ver
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["config.json", "model.safetensors", *side]
    assert checkpoint.files_of(checkpoint.load(tmp_path / "o")) == checkpoint.files_of(policy)


def test_an_orbax_checkpoint_written_with_orbax_itself_loads(tmp_path: Path) -> None:
    policy = perturbed(checkpoint.create("scorer", {"dim": 8, "hidden": 16}), seed=3)
    files = checkpoint.files_of(policy)
    state = nnx.state(policy.model, nnx.Param)
    # The pure dict (our layout) and the nnx.State itself (flax's checkpointing guide: leaves under "value").
    for name, tree in (("pure", nnx.to_pure_dict(state)), ("state", state)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_bytes(files["config.json"])
        with ocp.StandardCheckpointer() as ckptr:
            ckptr.save((tmp_path / name / "params").absolute(), tree)
        loaded = checkpoint.load(tmp_path / name)
        assert checkpoint.files_of(loaded) == files and checkpoint.version(loaded) == checkpoint.version(policy)


async def test_policy_spec_serves_an_orbax_checkpoint_directory(tmp_path: Path) -> None:
    policy = perturbed(checkpoint.create("scorer", {"dim": 8, "hidden": 16}), seed=8)
    ver = checkpoint.save(policy, tmp_path / "orbax-ckpt", format="orbax")
    served, served_ver = await PolicyProvider(str(tmp_path / "orbax-ckpt")).policy()  # inside a running loop
    assert served_ver == ver and checkpoint.files_of(served) == checkpoint.files_of(policy)


def test_a_bad_orbax_checkpoint_is_a_policy_error_naming_the_problem(tmp_path: Path) -> None:
    policy = checkpoint.create("scorer", {"dim": 8, "hidden": 16})
    good = tmp_path / "good"
    checkpoint.save(policy, good, format="orbax")
    params = nnx.to_pure_dict(nnx.state(policy.model, nnx.Param))

    def broken(name: str, damage: Callable[[Path], object]) -> str:
        """Copy the good checkpoint to ``name``, damage it; the PolicyError loading it raises (one line)."""
        path = tmp_path / name
        shutil.copytree(good, path)
        damage(path)
        with pytest.raises(PolicyError) as caught:
            checkpoint.load(path)
        message = str(caught.value)
        assert message.startswith(f"checkpoint {str(path)!r}: ") and "\n" not in message, message
        assert "Traceback" not in message and "tensorstore_spec" not in message
        return message

    def instead(make: Callable[[Path], object]) -> Callable[[Path], None]:
        """A damage: ``params/`` deleted, then ``make(params/)``."""
        def damage(path: Path) -> None:
            shutil.rmtree(path / "params")
            make(path / "params")
        return damage

    def rewritten(tree: dict[str, Any]) -> Callable[[Path], None]:
        """A damage: ``params/`` written anew by orbax, with ``tree``."""
        return instead(lambda params: orbax_params.write(tree, params))

    def data_file(path: Path) -> Path:
        """The biggest file of the checkpoint's OCDBT data: the tensors."""
        return max((p for p in (path / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)

    assert "holds both model.safetensors and params/ (Orbax); keep one" in broken(
        "both", lambda p: (p / "model.safetensors").write_bytes(checkpoint.files_of(policy)["model.safetensors"]))
    assert "no model.safetensors and no params/ (Orbax)" in broken("neither", lambda p: shutil.rmtree(p / "params"))
    assert "params is not a directory" in broken("file", instead(lambda params: params.write_bytes(b"x")))
    assert "no config.json" in broken("noconfig", lambda p: (p / "config.json").unlink())
    message = broken("badmeta", lambda p: (p / "params" / "_METADATA").write_bytes(b"{"))
    assert "params/ (Orbax) does not load (at tensor 'context/bias'): JSONDecodeError" in message
    message = broken("nomanifest", lambda p: (p / "params" / "manifest.ocdbt").unlink())
    assert "params/ (Orbax) does not load" in message and "NOT_FOUND" in message
    message = broken("nodata", lambda p: data_file(p).unlink())
    assert "params/ (Orbax) does not load (at tensor" in message
    message = broken("cut", lambda p: data_file(p).write_bytes(data_file(p).read_bytes()[:1000]))
    assert "params/ (Orbax) does not load (at tensor" in message
    message = broken("empty", instead(Path.mkdir))
    assert "params/ (Orbax) does not load (at tensor 'context/bias')" in message
    lacking = {k: v for k, v in params.items() if k != "prior"}
    assert "the weights lack tensor 'prior/bias'" in broken("lacking", rewritten(lacking))
    shape = {**params, "embed": {"embedding": np.zeros((10, 8), np.float32)}}
    message = broken("shape", rewritten(shape))  # orbax would pad it to the model's shape: checked as stored
    assert "tensor 'embed/embedding' is float32[10, 8], the model wants float32[4096, 8]" in message
    dtype = {**params, "embed": {"embedding": np.zeros((4096, 8), np.float16)}}
    assert "tensor 'embed/embedding' is float16[4096, 8]" in broken("dtype", rewritten(dtype))
    with pytest.raises(ValueError, match="checkpoint format 'npz'"):
        checkpoint.save(policy, tmp_path / "npz", format="npz")  # type: ignore[arg-type]


async def test_store_and_fetch_through_the_object_store(log: EventLog) -> None:
    policy = perturbed(checkpoint.create("scorer", {"dim": 8, "hidden": 16}, seed=5))
    files = checkpoint.files_of(policy)
    ver, size = await checkpoint.store(log, policy)
    assert ver == checkpoint.version(policy) and size == sum(len(d) for d in files.values())
    assert await checkpoint.stored(log, ver) and not await checkpoint.stored(log, "0" * 64)
    fetched = await checkpoint.fetch(log, ver)
    assert checkpoint.files_of(fetched) == files
    assert await checkpoint.store(log, fetched) == (ver, size)  # already there: the same address

    with pytest.raises(PolicyError, match="no policy checkpoint '000000000000' in the object store"):
        await checkpoint.fetch(log, "0" * 64)
    blobs = await log.js.object_store(BLOB_STORE)
    other = checkpoint.files_of(perturbed(checkpoint.create("scorer", {"dim": 8, "hidden": 16}, seed=5), seed=9))
    await blobs.put(f"policy/{ver}/model.safetensors", other["model.safetensors"])  # valid weights, other ones
    with pytest.raises(PolicyError, match=f"'{ver[:12]}': its files do not hash to its version"):
        await checkpoint.fetch(log, ver)
    await blobs.delete(f"policy/{ver}/config.json")
    with pytest.raises(PolicyError, match=r"file config\.json is missing"):
        await checkpoint.fetch(log, ver)
    await blobs.delete(f"policy/{ver}")  # without its index a checkpoint is absent, never partial
    assert not await checkpoint.stored(log, ver)


# --- policy: as a model provider ----------------------------------------------------------------------------


def test_bad_policy_specs_fail_the_check_with_a_clear_message() -> None:
    for spec in ("policy:scorer", "policy:lm", "policy:deadbeef", "policy:" + "ab" * 32, "policy:ckpt/v1"):
        ModelConfig(main=spec).check()
    for bad in ("policy:nope!", "policy:abc123", "policy:DEADBEEF", "policy:"):
        with pytest.raises(ModelSpecError) as caught:
            ModelConfig(main=bad).check()
        message = str(caught.value)
        assert message.startswith("role main: ") and "expected a kind (lm, scorer)" in message
        assert "at least 8 hex digits" in message and "directory" in message


async def rollout(log: EventLog, spec: str, run_id: str, tasks: list[str] = TASKS) -> None:
    """A one-round run of ``tasks`` played by the model ``spec``."""
    made = Rollout(ToyBench(), ModelConfig(main=spec), HarnessConfig(), log=log, settings=SETTINGS)
    await made.start(run_id)
    await made.run_round(run_id, 0, tasks)
    await made.finish(run_id, rounds=1)


async def test_a_rollout_with_policy_scorer_logs_its_version_and_logprobs(log: EventLog) -> None:
    await rollout(log, "policy:scorer", "fresh")
    fresh = checkpoint.create("scorer")
    turns = await model_turns(log, "fresh")
    assert len(turns) > len(TASKS) * SETTINGS.attempts  # most attempts take several steps
    assert {t.response.model_version for t in turns} == {checkpoint.version(fresh)}
    scored = fresh.score([t.sample() for t in turns])
    for turn, lp in zip(turns, scored, strict=True):
        assert [x.logprob for x in turn.response.logprobs] == pytest.approx(lp, abs=1e-5)
        assert turn.response.tool_calls[0].input["action"] in ACTIONS


async def test_a_checkpoint_directory_serves_and_replays_the_same_episode_in_another_run(
        log: EventLog, tmp_path: Path) -> None:
    policy = perturbed(checkpoint.create("scorer"), seed=6)
    ver = checkpoint.save(policy, tmp_path / "ckpt")
    spec = f"policy:{tmp_path / 'ckpt'}"
    await rollout(log, spec, "dir-1")
    await rollout(log, spec, "dir-2")
    first, second = await model_turns(log, "dir-1"), await model_turns(log, "dir-2")
    assert {t.response.model_version for t in first + second} == {ver}
    scored = policy.score([t.sample() for t in first])
    assert len({round(x, 4) for lp in scored for x in lp}) > 1  # the served policy is not uniform
    for turn, lp in zip(first, scored, strict=True):
        assert [x.logprob for x in turn.response.logprobs] == pytest.approx(lp, abs=1e-5)

    def actions(turns: list[ModelTurn]) -> dict[tuple[str, int], list[str]]:
        """The actions of each attempt, in order."""
        out: dict[tuple[str, int], list[str]] = {}
        for t in turns:
            out.setdefault((t.task, t.attempt), []).append(t.response.tool_calls[0].input["action"])
        return out

    assert actions(first) == actions(second)  # the run id plays no part in the seed
    assert len({tuple(a) for a in actions(first).values()}) > 1  # attempts differ from one another


async def test_a_stored_version_is_served_by_a_prefix_and_an_unknown_one_is_a_model_error(log: EventLog) -> None:
    policy = perturbed(checkpoint.create("scorer"), seed=7)
    ver, _ = await checkpoint.store(log, policy)
    await rollout(log, f"policy:{ver[:10]}", "prefix", TASKS[:1])
    turns = await model_turns(log, "prefix")
    assert turns and {t.response.model_version for t in turns} == {ver}
    served, served_ver = await PolicyProvider(ver[:8], log=log).policy()
    assert served_ver == ver and checkpoint.files_of(served) == checkpoint.files_of(policy)

    unknown = "0123abcd" if not ver.startswith("0123abcd") else "fedc9876"
    await rollout(log, f"policy:{unknown}", "unknown", TASKS[:1])
    errors = await model_errors(log, "unknown")
    assert errors and all(f"policy version '{unknown}' matches 0 stored checkpoints" in e.message for e in errors)
    assert all("Traceback" not in e.message for e in errors)


async def test_tools_without_an_enum_give_a_model_error_naming_why(log: EventLog) -> None:
    made = Rollout(TalkBench(), ModelConfig(main="policy:scorer"), HarnessConfig(), log=log,
                   settings=RolloutSettings(attempts=1, max_steps=3))
    await made.start("talk")
    outcome = await made.run_round("talk", 0, ["talk:chat:dev:0"])
    [error] = await model_errors(log, "talk")
    assert error.kind == "other" and error.next_action == "raise" and error.role == "main"
    assert error.message == ("policy:scorer: no tool with enumerated inputs to choose from (tools offered: ['say'])")
    [verdict] = await finished(log, "talk")
    assert verdict.status == "infra_failure" and error.message in verdict.reason and "Traceback" not in verdict.reason
    assert [r.status for r in outcome.results] == ["infra_failure"]
