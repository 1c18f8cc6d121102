"""The ``lm`` policy: tokenizer, seeded constrained and free decoding, act/score agreement, training end to end."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import optax  # type: ignore[import-untyped]
import pytest
from flax import nnx

from hx.learner.errors import PolicyError, Unservable
from hx.learner.lm import param_count
from hx.learner.lm_policy import LMPolicy, render
from hx.learner.policy import Generation, Sample, playable, policy_kind
from hx.learner.tokenizer import EOS, SPECIAL_TOKENS, load_tokenizer, tokenizer_bytes, train_tokenizer
from schemas.messages import Message, ToolCall, ToolSchema

ACTIONS = ["go north", "go south", "go east", "go west", "take coin", "take key", "take apple", "open door",
           "open box", "open chest", "look", "inventory", "wait", "examine table", "put coin in box", "close door",
           "eat apple", "read book", "drop key", "climb"]
MESSAGES = (Message(role="system", content="Find the coin."),
            Message(role="user", content="You are in the kitchen. A door leads north; a box is here."),
            Message(role="assistant", tool_calls=(ToolCall(id="c0", name="act", input={"action": "look"}),)),
            Message(role="tool", name="act", content="A kitchen, a box, a door.", tool_call_id="c0"))


def tool(name: str, **enums: list[Any]) -> ToolSchema:
    """A tool whose properties are the given enumerations."""
    return ToolSchema(name=name, input_schema={"type": "object",
                                               "properties": {k: {"enum": v} for k, v in enums.items()}})


ACT = (tool("act", action=ACTIONS),)


@pytest.fixture(scope="module")
def policy() -> LMPolicy:
    built = policy_kind("lm").build({}, {}, seed=0)
    assert isinstance(built, LMPolicy)
    return built


def sample_of(messages: tuple[Message, ...], tools: tuple[ToolSchema, ...], gen: Generation) -> Sample:
    """The logged turn of a generation."""
    completion = Message(role="assistant", content=gen.content, tool_calls=gen.tool_calls)
    logprobs = tuple(t.logprob for t in gen.logprobs)
    return Sample(messages=messages, tools=tools, completion=completion, logprobs=logprobs)


def test_tokenizer_round_trips_text_and_bytes(policy: LMPolicy) -> None:
    tok = train_tokenizer(["the cat sat on the mat", "hello world"] * 20, vocab=300)
    again = load_tokenizer(tokenizer_bytes(tok))
    text = "héllo wörld 日本 \x00\t\n  <eos> the cat {\"a\": [1, 2.5]}"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    assert again.encode(text).ids == tok.encode(text).ids
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert tok.encode("<eos>").ids == [tok.token_to_id(EOS)]
    with pytest.raises(PolicyError):
        load_tokenizer(b"{not json")
    rebuilt = LMPolicy.build({}, policy.files(), seed=0)
    assert rebuilt.files() == policy.files() and rebuilt.config == policy.config


def test_build_checks_config_and_is_tiny(policy: LMPolicy) -> None:
    assert 200_000 <= param_count(policy.model) <= 1_000_000
    with pytest.raises(PolicyError, match="unknown keys"):
        LMPolicy.build({"layer": 3}, {})
    with pytest.raises(PolicyError, match="heads"):
        LMPolicy.build({"d_model": 90, "heads": 4}, policy.files())
    with pytest.raises(PolicyError, match="vocab"):
        LMPolicy.build({"vocab": 100}, policy.files())


def test_act_is_seeded(policy: LMPolicy) -> None:
    runs = [policy.act(MESSAGES, ACT, seed=s) for s in range(12)]
    assert runs[3] == policy.act(MESSAGES, ACT, seed=3)
    assert len({r.tool_calls[0].input["action"] for r in runs}) >= 3
    assert policy.act(MESSAGES, ACT, seed=5, temperature=0) == policy.act(MESSAGES, ACT, seed=6, temperature=0)


def test_constrained_act_only_yields_enum_members_and_matches_score(policy: LMPolicy) -> None:
    rng = random.Random(7)
    words = ["go", "gold", "g", "north", "no", "1", "12", "a b", "x-y", "ÿ", ""]
    for case in range(12):
        tools = []
        for t in range(rng.randint(1, 3)):
            props: dict[str, list[Any]] = {}
            for p in range(rng.randint(1, 2)):
                size = rng.randint(1, 8)
                values: list[Any] = [" ".join(rng.sample(words, rng.randint(1, 2))) for _ in range(size)]
                props[f"p{p}"] = values + [rng.randint(0, 30), True][: rng.randint(0, 2)]
            tools.append(tool(f"t{t}", **props))
        tools.append(ToolSchema(name="say", input_schema={"properties": {"text": {"type": "string"}}}))
        offered = tuple(tools)
        gens = [policy.act(MESSAGES, offered, seed=case * 100 + s) for s in range(4)]
        for gen in gens:
            (call,) = gen.tool_calls
            chosen = next(t for t in playable(offered) if t.name == call.name)
            for prop, spec in chosen.input_schema["properties"].items():
                assert call.input[prop] in spec["enum"]
            assert gen.stop_reason == "tool_use" and gen.logprobs
        scored = policy.score([sample_of(MESSAGES, offered, g) for g in gens])
        for gen, lps in zip(gens, scored, strict=True):
            np.testing.assert_allclose(lps, [t.logprob for t in gen.logprobs], atol=1e-5)


def test_act_logprobs_equal_score_with_tool_choice_and_truncation(policy: LMPolicy) -> None:
    tools = (tool("move", where=["north", "south", "up"]), tool("act", action=ACTIONS, times=[1, 2, 3]))
    long = MESSAGES + tuple(Message(role="user", content=f"turn {i}: nothing happens here at all.") for i in range(60))
    assert len(policy.tokenizer.encode(render(long, tools)).ids) > policy.ctx  # the prompt must be cut
    gens = [(m, policy.act(m, tools, seed=s)) for s in range(3) for m in (MESSAGES, long)]
    assert {g.tool_calls[0].name for _, g in gens} == {"move", "act"}
    scored = policy.score([sample_of(m, tools, g) for m, g in gens])
    for (_, gen), lps in zip(gens, scored, strict=True):
        np.testing.assert_allclose(lps, [t.logprob for t in gen.logprobs], atol=1e-5)


def test_option_probabilities_of_decisions_sum_to_one(policy: LMPolicy) -> None:
    options = ["go", "go north", "gold", "take coin", "take key", "1", "look", "l"]
    tools = (tool("act", verb=options, times=[1, 2, 30]),)
    samples = [Sample(messages=MESSAGES, tools=tools, completion=Message(role="assistant", tool_calls=(
        ToolCall(id="c", name="act", input={"verb": v, "times": n}),))) for v in options for n in (1, 2, 30)]
    totals = [sum(lps) for lps in policy.score(samples)]
    assert math.fsum(math.exp(t) for t in totals) == pytest.approx(1.0, abs=1e-5)
    assert max(totals) - min(totals) > 0.01  # not trivially uniform


def test_single_option_decisions_emit_tokens_at_log_prob_zero(policy: LMPolicy) -> None:
    gen = policy.act(MESSAGES, (tool("act", action=["open the door"]),), seed=1)
    assert gen.tool_calls[0].input == {"action": "open the door"}
    assert len(gen.logprobs) >= 3 and all(t.logprob == 0.0 for t in gen.logprobs)
    assert gen.logprobs[-1].token == EOS


def test_free_decoding_samples_text_and_scores_it(policy: LMPolicy) -> None:
    tools = (ToolSchema(name="say", input_schema={"properties": {"text": {"type": "string"}}}),)
    gens = [policy.act(MESSAGES, tools, seed=s, max_tokens=12) for s in range(3)]
    gens.append(policy.act(MESSAGES, (), seed=0, max_tokens=1, temperature=0))
    assert gens[0] == policy.act(MESSAGES, tools, seed=0, max_tokens=12)
    assert len({g.content for g in gens}) == 4
    for gen in gens:
        assert not gen.tool_calls and gen.logprobs
        assert gen.stop_reason == ("end_turn" if gen.logprobs[-1].token == EOS else "max_tokens")
        assert all(t.logprob < 0 for t in gen.logprobs)
    scored = policy.score([sample_of(MESSAGES, tools, g) for g in gens[:3]])
    for gen, lps in zip(gens, scored, strict=False):
        np.testing.assert_allclose(lps, [t.logprob for t in gen.logprobs], atol=1e-5)


def test_unservable_completions_name_the_sample(policy: LMPolicy) -> None:
    good = sample_of(MESSAGES, ACT, policy.act(MESSAGES, ACT, seed=0))
    call = ToolCall(id="c", name="act", input={"action": "fly away"})
    bad = Sample(messages=MESSAGES, tools=ACT, completion=Message(role="assistant", tool_calls=(call,)))
    with pytest.raises(Unservable, match=r"sample 1: .*'fly away' is not one of its 20 choices"):
        policy.encode([good, bad])
    no_call = Sample(messages=MESSAGES, tools=ACT, completion=Message(role="assistant", content="hi"))
    with pytest.raises(Unservable, match="sample 0: one tool call was expected"):
        policy.encode([no_call])
    miscounted = Sample(messages=MESSAGES, tools=ACT, completion=good.completion, logprobs=(-1.0,) * 40)
    with pytest.raises(Unservable, match="40 log-probs"):
        policy.encode([miscounted])


def test_batches_are_bucketed(policy: LMPolicy) -> None:
    samples = [sample_of(MESSAGES, ACT, policy.act(MESSAGES, ACT, seed=s)) for s in range(3)]
    batch = policy.encode(samples)
    b, n = batch["tokens"].shape
    assert (b, n & (n - 1)) == (4, 0) and batch["allowed"].shape[:2] == batch["mask"].shape
    assert batch["mask"].sum() == sum(len(s.logprobs) for s in samples)
    assert not batch["mask"][3].any()


def test_a_gradient_step_raises_the_samples_log_prob() -> None:
    policy = LMPolicy.build({"layers": 1}, {}, seed=3)
    sample = sample_of(MESSAGES, ACT, policy.act(MESSAGES, ACT, seed=0))
    batch = policy.encode([sample])
    optimizer = nnx.Optimizer(policy.model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model: nnx.Module, optimizer: nnx.Optimizer[nnx.Module]) -> None:
        def loss(model: nnx.Module) -> Any:
            logp, _ = model(batch)
            return -logp.sum()

        optimizer.update(model, nnx.grad(loss)(model))

    before = sum(policy.score([sample])[0])
    step(policy.model, optimizer)
    after = sum(policy.score([sample])[0])
    assert after > before + 0.05


def test_weights_round_trip_as_a_pure_dict(policy: LMPolicy) -> None:
    pure = nnx.to_pure_dict(nnx.state(policy.model, nnx.Param))
    other = LMPolicy.build(policy.config, policy.files(), seed=9)
    logged = sample_of(MESSAGES, ACT, policy.act(MESSAGES, ACT, seed=2))
    assert other.score([logged]) != policy.score([logged])
    state = nnx.state(other.model, nnx.Param)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(other.model, state)
    assert other.score([logged]) == policy.score([logged])
    assert other.act(MESSAGES, ACT, seed=2) == policy.act(MESSAGES, ACT, seed=2)
