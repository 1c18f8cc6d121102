"""Providers, evolvers, benchmarks and projections come from entry points, each loaded when first named; the
``policy:`` provider serves from the ``PolicyStore`` its command lends it, the one the trainer files into.

An installed plugin is a real distribution: a ``*.dist-info`` directory with an ``entry_points.txt`` on
``sys.path``, found by ``importlib.metadata`` exactly as a pip-installed package's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from toybench import ToyBench, ids

from hx.aegis.errors import EvolverError
from hx.aegis.evolvers import EVOLVERS, make_evolver
from hx.aegis.evolvers.base import Evolver
from hx.aegis.trials import Trials
from hx.entry_points import Registry
from hx.environments.errors import BenchmarkError
from hx.environments.registry import BENCHMARKS, Benchmark, benchmark, benchmarks
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.environments.splits import Splits
from hx.harness.config import HarnessConfig
from hx.learner.grpo import GRPOConfig
from hx.learner.provider import PolicyProvider
from hx.learner.store import PolicyStore
from hx.learner.trainer import Learner, LearnerSettings
from hx.runtime.errors import ModelSpecError
from hx.runtime.models import ModelConfig
from hx.runtime.providers.base import PROVIDERS, CallContext, Provider, make_provider
from hx.runtime.providers.resources import ProviderResources
from hx.runtime.router import ModelRouter
from projections.base import Projection
from projections.registry import BUILTINS, EXPORTS, PROJECTIONS
from schemas.learn import PolicyUpdated
from schemas.messages import Message
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog

ROOT = Path(__file__).resolve().parents[1]
RUN = "store-toy"
SETTINGS = RolloutSettings(attempts=4, concurrency=2, max_steps=6, seed=3)
TASKS = ids("easy", 2) + ids("walk", 1)
SMALL = LearnerSettings(config={"dim": 16, "hidden": 32, "vocab": 512}, window=1, step_weight=0.0,
                        grpo=GRPOConfig(learning_rate=3e-3, minibatch=256, epochs=2))


def declared(group: str) -> list[str]:
    """The names hx's own distribution declares in an entry-point group."""
    return sorted(ep.name for ep in entry_points(group=group) if ep.value.startswith(("hx.", "projections.")))


# --- every declared entry point loads and is what its group holds ----------------------------------------------


def test_every_declared_provider_is_a_provider_class_under_its_scheme() -> None:
    assert declared("hx.providers") == ["anthropic", "fork", "openai", "policy", "random", "replay", "script"]
    for name in declared("hx.providers"):
        cls = PROVIDERS.load(name)
        assert isinstance(cls, type) and issubclass(cls, Provider) and cls.scheme == name


def test_every_declared_evolver_is_an_evolver_class_under_its_name() -> None:
    assert declared("hx.evolvers") == list(EVOLVERS.names()) == [
        "frozen", "induced", "llm", "offline", "offline+induced"]
    for name in declared("hx.evolvers"):
        cls = EVOLVERS.load(name)
        assert isinstance(cls, type) and issubclass(cls, Evolver) and cls.name == name


def test_every_declared_benchmark_builds_a_benchmark_of_its_name() -> None:
    assert declared("hx.benchmarks") == ["gaia", "sciworld", "twx"]
    assert set(declared("hx.benchmarks")) <= set(benchmarks())
    for name in declared("hx.benchmarks"):
        cls = BENCHMARKS.load(name)
        assert isinstance(cls, type) and issubclass(cls, Benchmark) and cls.name == name


def test_every_declared_projection_is_a_built_in_projection_of_its_name() -> None:
    assert declared("hx.projections") == sorted(BUILTINS) == ["attempt_outputs", "edit_ledger", "eval_scores", "otel",
                                                            "task_history", "trace_store"]
    assert sorted(PROJECTIONS) == ["attempt_outputs", "edit_ledger", "eval_scores", "task_history", "trace_store"]
    assert {"otel"} == EXPORTS
    for name in declared("hx.projections"):
        cls = BUILTINS[name]
        assert issubclass(cls, Projection) and cls.name == name


def test_every_declared_algorithm_and_policy_kind_is_its_kind_under_its_name() -> None:
    from hx.learner.algorithm import ALGORITHMS
    from hx.learner.kinds import KINDS
    from hx.learner.policy import Policy

    assert declared("hx.algorithms") == list(ALGORITHMS.names()) == ["grpo", "rloo"]
    for name in declared("hx.algorithms"):
        assert ALGORITHMS.load(name).name == name
    assert declared("hx.policies") == list(KINDS) == ["lm", "scorer"]
    for name in declared("hx.policies"):
        cls = KINDS.load(name)
        assert isinstance(cls, type) and issubclass(cls, Policy)


# --- a plugin is one module and one entry-point line ------------------------------------------------------------

PLUGIN = '''
from hx.aegis.evolvers.base import Evolver
from hx.environments.registry import Benchmark, TaskId
from hx.runtime.providers.base import Completion, Provider


class EchoProvider(Provider):
    scheme = "echo"

    async def complete(self, messages, tools, params, ctx):
        return Completion(content=messages[-1].content, model_version=self.model)


class PlugBench(Benchmark):
    name = "plug"

    def games(self):
        return ("g",)

    def task_ids(self, game, split, limit=None):
        return self.first_ids(game, split, 3, limit)

    def make_task(self, task_id):
        raise NotImplementedError


class PlugEvolver(Evolver):
    name = "plug"

    async def propose(self, context, k):
        return []


class Broken:
    pass
'''
ENTRY_POINTS = """
[hx.providers]
echo = hxplug_mod:EchoProvider
broken = hxplug_mod:Broken
missing = hxplug_missing:Nothing

[hx.benchmarks]
plug = hxplug_mod:PlugBench
missing = hxplug_missing:Nothing

[hx.evolvers]
plug = hxplug_mod:PlugEvolver
broken = hxplug_mod:Broken
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed distribution ``hxplug`` declaring a provider, a benchmark and an evolver (and broken ones)."""
    (tmp_path / "hxplug_mod.py").write_text(PLUGIN)
    info = tmp_path / "hxplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hxplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hxplug_mod", raising=False)
    registries: list[Registry[object]] = [PROVIDERS, BENCHMARKS, EVOLVERS]  # type: ignore[list-item]
    for registry in registries:  # what this test loads is forgotten after it, like the distribution
        monkeypatch.setattr(registry, "_loaded", dict(registry._loaded))


@pytest.mark.usefixtures("plugin")
async def test_an_installed_provider_is_found_by_its_scheme_and_a_broken_one_is_a_model_spec_error() -> None:
    provider = make_provider("echo:v1")
    ctx = CallContext(run_id="r", round=0, task_id="t", attempt=0, step=0)
    completion = await provider.complete((Message(role="user", content="hello"),), (), {}, ctx)
    assert (completion.content, completion.model_version) == ("hello", "v1")
    with pytest.raises(ModelSpecError, match=r"unknown model provider 'nope' in 'nope:m'; known: anthropic, broken, "
                                             r"echo, fork, missing, openai, policy, random, replay, script$"):
        make_provider("nope:m")
    with pytest.raises(ModelSpecError, match=r"'broken'.* is not a Provider subclass with scheme 'broken'"):
        make_provider("broken:m")
    with pytest.raises(ModelSpecError, match=r"model provider 'missing' \(hxplug_missing:Nothing\): cannot be loaded: "
                                             "ModuleNotFoundError"):
        make_provider("missing:m")


@pytest.mark.usefixtures("plugin")
def test_an_installed_benchmark_and_evolver_are_found_by_name() -> None:
    assert "plug" in benchmarks() and [str(t) for t in benchmark("plug").task_ids("g", "dev", 2)] == [
        "plug:g:dev:0", "plug:g:dev:1"]
    with pytest.raises(BenchmarkError, match=r"benchmark 'missing' \(hxplug_missing:Nothing\): cannot be loaded"):
        benchmark("missing")
    assert "plug" in EVOLVERS.names() and make_evolver("plug", meta=None, store=None).name == "plug"
    with pytest.raises(EvolverError, match=r"evolver 'broken': .* is not an Evolver subclass"):
        make_evolver("broken", meta=None, store=None)


# --- nothing heavy is imported before it is named -----------------------------------------------------------------

HEAVY = ("jax", "flax", "opentelemetry.sdk", "opentelemetry.exporter", "projections.otel_spans", "textworld_express",
         "scienceworld", "anthropic", "hx.learner.provider", "hx.environments.twx")


def loaded_after(code: str) -> list[str]:
    """Which of the heavy modules a fresh interpreter has imported after running ``code``."""
    probe = (f"{textwrap.dedent(code)}\nimport json, sys\n"
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    found: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_the_command_and_its_help_import_no_learner_exporter_or_game_engine() -> None:
    assert loaded_after("import hx.cli.main") == []
    assert loaded_after("""
        from hx.cli.main import cli
        assert cli.main(["projections", "status", "--help"], standalone_mode=False) == 0
        """) == []
    assert loaded_after("import hx.environments.registry; hx.environments.registry.benchmarks()") == []


# --- the policy store travels explicitly --------------------------------------------------------------------------


@pytest.fixture
async def log(nats_url: str) -> AsyncIterator[EventLog]:
    """The event log on the test's own nats-server."""
    async with connect(NatsSettings(url=nats_url)) as conn:
        yield conn.log


async def test_the_store_a_learner_files_into_is_the_one_its_policy_providers_serve_from(log: EventLog) -> None:
    rollout = Rollout(ToyBench(), ModelConfig(main="random:"), HarnessConfig(), log=log, settings=SETTINGS)
    await rollout.start(RUN)
    await rollout.run_round(RUN, 0, TASKS)
    store, other = PolicyStore(), PolicyStore()
    learner = Learner(log, RUN, SMALL, store=store)
    await learner.open()
    record = await learner.update()
    assert isinstance(record, PolicyUpdated)
    filed = store.get(record.version)
    assert filed is not None and filed[1] == record.version
    # served from the store: no log to load a checkpoint from, and the very copy the learner filed
    spec = f"policy:{record.version}"
    router = ModelRouter(ModelConfig(main=spec), resources=ProviderResources(store))
    provider = router.provider(spec)
    assert isinstance(provider, PolicyProvider) and provider.store is store
    assert await provider.policy() == filed
    # another store knows nothing of it: its provider loads a copy of its own, and the first store is untouched
    assert record.version not in other
    fetched = await PolicyProvider(record.version, log=log, resources=ProviderResources(other)).policy()
    assert fetched[1] == record.version and fetched[0] is not filed[0] and other.get(record.version) == fetched
    assert store.get(record.version) == filed


async def test_a_runs_rollouts_lend_their_providers_one_store_and_another_run_has_its_own(log: EventLog) -> None:
    splits = Splits.of(TASKS, ids("easy", 1, "test"))
    models = ModelConfig(main="policy:scorer", provider_options={"policy:scorer": {"config": SMALL.config}})
    first = Trials(log, "store-a", [ToyBench()], models, SETTINGS, splits, next_round=0)
    second = Trials(log, "store-b", [ToyBench()], models, SETTINGS, splits, next_round=0)
    for trials in (first, second):
        await Rollout(ToyBench(), models, HarnessConfig(), log=log, settings=SETTINGS).start(trials.run_id)
        for _ in range(2):
            await trials.run(HarnessConfig(), TASKS[:1], role="adaptation", label=RoundLabel(purpose="main"))
    a, b = first.resources.get(PolicyStore), second.resources.get(PolicyStore)
    assert a is not None and b is not None and a is not b
    copies_a = {id(kept[0]) for kept in map(a.get, list(a)) if kept is not None}
    copies_b = {id(kept[0]) for kept in map(b.get, list(b)) if kept is not None}
    assert len(copies_a) == len(copies_b) == 1  # every attempt of both rounds of a run served by one loaded copy
    assert list(a) == list(b) and copies_a != copies_b  # the same policy, loaded once per run
