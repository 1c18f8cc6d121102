"""HarnessConfig as a value: builder algebra, composition errors, ordering, serialisation, digest."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hx_cli import error_line
from hx_cli import hx as hx_command

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import (
    POST,
    PRE,
    AfterModel,
    AfterTool,
    Attachment,
    BeforeModel,
    CompositionError,
    FunctionTool,
    HarnessConfig,
    ModelConfig,
    Processor,
    Task,
)
from hx.harness.config import Format
from schemas.history import resolve_async
from schemas.hooks import HookRecord
from schemas.messages import Message, TaskSpec, ToolSchema
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.log import EventLog
from streams.topology import trace_subject

# --- processors -------------------------------------------------------------------------


class Tag(Processor):
    """Appends a marker to the model's answer (a transform at after_model)."""

    mark: str = "!"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield msgspec.structs.replace(event, content=event.content + self.mark)


class Early(Processor):
    _order = PRE
    _singleton_group = "early"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class Late(Processor):
    _order = POST
    _singleton_group = "late"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class First(Processor):
    _singleton_group = "first"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class Second(Processor):
    _singleton_group = "second"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class NeedsThird(Processor):
    """A NORMAL processor that must run after group ``third`` even when attached before it."""

    _singleton_group = "needs-third"
    _after = ("third",)

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class Third(Processor):
    _singleton_group = "third"

    async def process(self, event: AfterModel | AfterTool) -> AsyncIterator[AfterModel | AfterTool]:
        yield event


class TagAgain(Processor):
    """Another processor type in ``Tag``'s singleton group."""

    _singleton_group = Tag.type_name()
    mark: str = "?"

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield msgspec.structs.replace(event, content=event.content + self.mark)


class TagAtBeforeModel(Processor):
    """In ``Tag``'s group, but serving before_model: cannot replace ``Tag`` at after_model."""

    _singleton_group = Tag.type_name()

    async def process(self, event: BeforeModel) -> AsyncIterator[BeforeModel]:
        yield event


class Orphan(Processor):
    _after = ("not-attached",)

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class CycleA(Processor):
    _singleton_group = "cycle-a"
    _after = ("cycle-b",)

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class CycleB(Processor):
    _singleton_group = "cycle-b"
    _after = ("cycle-a",)

    async def process(self, event: AfterTool) -> AsyncIterator[AfterTool]:
        yield event


class EarlyAfterLate(Processor):
    """PRE, yet declared to run after a POST group: contradictory."""

    _order = PRE
    _after = ("late",)

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


class Observer(Processor):
    """Accepts any hook event (an observer)."""

    async def process(self, event: Any) -> AsyncIterator[Any]:
        yield event


class LoopDetector(Processor):
    """Watches after_tool and acts at before_model: one instance, state shared across its hooks."""

    _singleton_group = "loop-detector"
    limit: int = 1

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        if isinstance(event, AfterTool):
            self.__dict__["tools_seen"] = self.__dict__.get("tools_seen", 0) + 1
            yield event
            return
        seen = self.__dict__.get("tools_seen", 0)
        if seen >= self.limit:
            note = Message(role="user", content=f"loop-detector: {seen} tool results so far")
            yield msgspec.structs.replace(event, messages=(*event.messages, note))
        else:
            yield event


class Numbered(Processor):
    """Numbers the model calls it has seen in this instance: state that must not leak between attempts."""

    _singleton_group = "numbered"

    async def process(self, event: BeforeModel) -> AsyncIterator[BeforeModel]:
        self.__dict__["calls"] = calls = self.__dict__.get("calls", 0) + 1
        i = max(i for i, m in enumerate(event.messages) if m.role == "user")
        numbered = msgspec.structs.replace(event.messages[i], content=f"{event.messages[i].content} [call {calls}]")
        yield msgspec.structs.replace(event, messages=(*event.messages[:i], numbered, *event.messages[i + 1:]))


class Sized(Processor):
    times: int = 1
    label: str = "x"
    weights: dict[str, float] = {}

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield event


def names(procs: Sequence[Processor]) -> list[str]:
    return [type(p).__name__ for p in procs]


# --- composition errors -------------------------------------------------------------------


def test_unknown_hook_names_the_processor_and_the_hook() -> None:
    with pytest.raises(CompositionError) as err:
        HarnessConfig().attach("before_lunch", Tag())
    msg = str(err.value)
    assert Tag.type_name() in msg and "unknown hook 'before_lunch'" in msg


def test_wrong_event_type_names_the_processor_and_the_hook() -> None:
    with pytest.raises(CompositionError) as err:
        HarnessConfig().attach("before_tool", Tag())
    msg = str(err.value)
    assert Tag.type_name() in msg and "cannot attach to 'before_tool'" in msg and "after_model" in msg


def test_multi_hook_attach_checks_every_hook() -> None:
    with pytest.raises(CompositionError, match="cannot attach to 'step_end'"):
        HarnessConfig().attach(("after_tool", "step_end"), LoopDetector())


def test_second_processor_in_a_singleton_group() -> None:
    cfg = HarnessConfig().attach("after_model", Tag())
    with pytest.raises(CompositionError) as err:
        cfg.attach("after_model", Tag(mark="?"))
    assert "singleton group" in str(err.value) and Tag.type_name() in str(err.value)
    with pytest.raises(CompositionError) as err:
        cfg.attach("after_model", TagAgain())
    msg = str(err.value)
    assert TagAgain.type_name() in msg and Tag.type_name() in msg and "already held" in msg


def test_missing_after_dependency_is_raised_by_validate_and_by_agentic() -> None:
    cfg = HarnessConfig().attach("after_model", Orphan())
    with pytest.raises(CompositionError) as err:
        cfg.validate()
    msg = str(err.value)
    assert Orphan.type_name() in msg and "_after 'not-attached'" in msg and "not in the harness" in msg
    with pytest.raises(CompositionError, match="not in the harness"):
        ModelConfig(main="script:m").agentic(cfg)


def test_dependency_cycle_names_the_processors() -> None:
    cfg = HarnessConfig().attach("after_model", CycleA()).attach("after_tool", CycleB())
    with pytest.raises(CompositionError) as err:
        cfg.validate()
    msg = str(err.value)
    assert "dependency cycle" in msg and CycleA.type_name() in msg and CycleB.type_name() in msg
    assert "cycle-a" in msg and "cycle-b" in msg


def test_after_against_order_is_a_composition_error() -> None:
    cfg = HarnessConfig().attach("after_model", Late()).attach("after_model", EarlyAfterLate())
    with pytest.raises(CompositionError) as err:
        cfg.validate()
    assert EarlyAfterLate.type_name() in str(err.value) and "_order" in str(err.value)


def test_replace_that_targets_another_hook() -> None:
    cfg = HarnessConfig().attach("after_model", Tag())
    with pytest.raises(CompositionError) as err:
        cfg.replace(Tag.type_name(), TagAtBeforeModel())
    msg = str(err.value)
    assert TagAtBeforeModel.type_name() in msg and "occupies after_model" in msg and "targets before_model" in msg


def test_replace_with_a_processor_of_another_group() -> None:
    cfg = HarnessConfig().attach("after_model", Tag())
    with pytest.raises(CompositionError) as err:
        cfg.replace(Tag.type_name(), First())
    assert First.type_name() in str(err.value) and "belongs to group 'first'" in str(err.value)


def test_replace_or_remove_an_absent_group() -> None:
    with pytest.raises(CompositionError, match="no processor in singleton group 'first'"):
        HarnessConfig().remove("first")
    with pytest.raises(CompositionError, match="no processor in singleton group 'first'"):
        HarnessConfig().replace("first", First())


def test_unknown_processor_type_name() -> None:
    data = {"processors": [{"type": "no_such_processor", "hooks": ["after_model"]}]}
    with pytest.raises(CompositionError, match="unknown processor 'no_such_processor'"):
        HarnessConfig.from_dict(data)


# --- builder algebra ----------------------------------------------------------------------


def test_builders_return_new_configs_and_leave_the_original_alone() -> None:
    base = HarnessConfig().attach("after_model", Tag())
    digest = base.digest
    attached = base.attach("after_model", First())
    replaced = base.replace(Tag.type_name(), TagAgain(mark="#"))
    removed = base.remove(Tag.type_name())
    assert base.groups() == (Tag.type_name(),) and base.digest == digest
    assert attached.groups() == (Tag.type_name(), "first")
    assert names(replaced.at("after_model")) == ["TagAgain"]
    assert replaced.at("after_model")[0] == TagAgain(mark="#")
    assert removed.groups() == () and removed == HarnessConfig()
    assert len({base, attached, replaced, removed}) == 4
    with pytest.raises(AttributeError):
        base.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        base.attachments[0].type = "other"  # type: ignore[misc]


def test_replace_keeps_position_and_hooks() -> None:
    cfg = HarnessConfig().attach("after_model", First()).attach("after_model", Tag()).attach("after_model", Second())
    replaced = cfg.replace(Tag.type_name(), TagAgain())
    assert names(replaced.at("after_model")) == ["First", "TagAgain", "Second"]
    assert replaced.attachments[1].hooks == ("after_model",)


def test_at_orders_by_order_then_after_then_attach_order() -> None:
    cfg = (HarnessConfig()
           .attach("after_model", Late())
           .attach("after_model", NeedsThird())
           .attach("after_model", Second())
           .attach("after_model", Third())
           .attach("after_model", First())
           .attach("after_model", Early()))
    assert names(cfg.at("after_model")) == ["Early", "Second", "Third", "NeedsThird", "First", "Late"]
    assert cfg.at("before_tool") == ()
    assert [a.type for a in cfg.pipeline("after_model")] == [type(p).type_name() for p in cfg.at("after_model")]


def test_after_only_orders_a_shared_hook() -> None:
    with pytest.raises(CompositionError, match="not in the harness"):
        HarnessConfig().attach("after_model", NeedsThird()).validate()
    elsewhere = HarnessConfig().attach("after_model", NeedsThird()).attach("after_tool", Third())
    assert names(elsewhere.validate().at("after_model")) == ["NeedsThird"]
    shared = HarnessConfig().attach("after_model", NeedsThird()).attach("after_model", Third())
    assert names(shared.validate().at("after_model")) == ["Third", "NeedsThird"]


def test_observer_accepts_every_hook() -> None:
    cfg = HarnessConfig().attach(("task_start", "step_end", "task_end"), Observer())
    assert cfg.attachments[0].hooks == ("task_start", "step_end", "task_end")
    assert all(len(cfg.at(h)) == 1 for h in ("task_start", "step_end", "task_end"))


def test_multi_hook_processor_is_one_instance_per_attempt_and_its_group_spans_hooks() -> None:
    cfg = HarnessConfig().attach(("after_tool", "before_model"), LoopDetector())
    with pytest.raises(CompositionError, match="singleton group 'loop-detector'"):
        cfg.attach("after_tool", LoopDetector(limit=3))
    first = cfg.instantiate()
    assert first["after_tool"][0] is first["before_model"][0]
    second = cfg.instantiate()
    assert second["after_tool"][0] is second["before_model"][0]
    assert second["after_tool"][0] is not first["after_tool"][0]
    assert cfg.at("after_tool")[0] is not cfg.at("after_tool")[0]  # at() builds fresh instances
    assert cfg.remove("loop-detector").at("before_model") == ()


# --- value semantics ----------------------------------------------------------------------


def test_equal_by_value_hashable_and_digest_stable_across_resolving_attach_orders() -> None:
    a = HarnessConfig().attach("after_model", Late()).attach("after_model", Tag()).attach("after_model", Early())
    b = HarnessConfig().attach("after_model", Early()).attach("after_model", Tag()).attach("after_model", Late())
    c = HarnessConfig().attach("after_model", Tag()).attach("after_model", Late()).attach("after_model", Early())
    assert a.attachments != b.attachments
    assert a == b == c and a.digest == b.digest == c.digest and hash(a) == hash(b)
    assert len({a, b, c}) == 1 and {a: "v1"}[b] == "v1"
    assert a.digest.startswith("sha256:") and len(a.digest) == len("sha256:") + 64
    # dependencies resolve attach order too
    d = HarnessConfig().attach("after_model", NeedsThird()).attach("after_model", Third())
    e = HarnessConfig().attach("after_model", Third()).attach("after_model", NeedsThird())
    assert d == e
    # the order hooks are listed in does not matter either
    f = HarnessConfig().attach(("before_model", "after_tool"), LoopDetector())
    g = HarnessConfig().attach(("after_tool", "before_model"), LoopDetector())
    assert f == g and f.digest == g.digest


def test_digest_differs_when_pipelines_differ() -> None:
    base = HarnessConfig().attach("after_model", First()).attach("after_model", Second())
    swapped = HarnessConfig().attach("after_model", Second()).attach("after_model", First())
    params = HarnessConfig().attach("after_model", Tag(mark="?"))
    hooks = HarnessConfig().attach("after_tool", Observer())
    other_hook = HarnessConfig().attach("step_end", Observer())
    slots = base.with_slots(tracer="none")
    digests = {base.digest, swapped.digest, params.digest, HarnessConfig().attach("after_model", Tag()).digest,
               hooks.digest, other_hook.digest, slots.digest, HarnessConfig().digest}
    assert len(digests) == 8
    assert base != swapped and base != slots
    assert HarnessConfig().attach("after_model", Tag(mark="!")) == HarnessConfig().attach("after_model", Tag())


def test_digest_is_taken_over_canonical_json() -> None:
    cfg = HarnessConfig().attach("after_model", Tag(mark="?")).attach(("after_tool", "before_model"), LoopDetector())
    again = HarnessConfig.loads(cfg.dumps("json"), "json")
    assert again.digest == cfg.digest
    # the digest is a function of canonical JSON only: recompute it independently
    canonical = json.dumps(cfg.canonical(), sort_keys=True, separators=(",", ":"))
    assert cfg.digest == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert list(cfg.canonical()["pipelines"]) == ["before_model", "after_model", "after_tool"]


# --- serialisation ------------------------------------------------------------------------


def rich_config() -> HarnessConfig:
    return (HarnessConfig()
            .attach("after_model", Tag(mark="??"))
            .attach("after_model", Sized(times=3, label="big", weights={"b": 0.5, "a": 1.25}))
            .attach(("after_tool", "before_model"), LoopDetector(limit=4))
            .attach("after_model", Early())
            .attach(("task_start", "task_end"), Observer())
            .with_slots(tools=("search",), workspace="/tmp/ws", plugins=("json",)))


@pytest.mark.parametrize("fmt", ["json", "yaml", "toml"])
def test_round_trip(fmt: Format, tmp_path: Path) -> None:
    cfg = rich_config()
    text = cfg.dumps(fmt)
    again = HarnessConfig.loads(text, fmt)
    assert again == cfg and again.digest == cfg.digest and again.attachments == cfg.attachments
    assert again.slots == cfg.slots
    assert again.dumps(fmt) == text  # canonical: serialising again gives the same text
    saved = cfg.save(tmp_path / f"harness.{'yml' if fmt == 'yaml' else fmt}")
    assert HarnessConfig.load(saved) == cfg
    sized = next(p for p in again.at("after_model") if isinstance(p, Sized))
    assert sized == Sized(times=3, label="big", weights={"a": 1.25, "b": 0.5})


def test_serialised_form_names_type_and_parameters() -> None:
    cfg = HarnessConfig().attach("after_model", Tag(mark="??")).attach("after_model", First())
    data = json.loads(cfg.dumps("json"))
    assert data["processors"] == [{"type": Tag.type_name(), "hooks": ["after_model"], "params": {"mark": "??"}},
                                  {"type": First.type_name(), "hooks": ["after_model"]}]


PLUGIN = '''
from collections.abc import AsyncIterator

import msgspec

from hx import AfterModel, Processor


class Shout(Processor):
    times: int = 1

    async def process(self, event: AfterModel) -> AsyncIterator[AfterModel]:
        yield msgspec.structs.replace(event, content=event.content.upper() + "!" * self.times)
'''


def test_module_class_path_loads_from_a_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hx_test_plugin_shout.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "harness.yaml"
    path.write_text("processors:\n- type: hx_test_plugin_shout:Shout\n  hooks: [after_model]\n  params: {times: 3}\n")
    cfg = HarnessConfig.load(path)
    (proc,) = cfg.at("after_model")
    assert type(proc).__module__ == "hx_test_plugin_shout" and type(proc).__name__ == "Shout"
    assert proc.params() == {"times": 3}
    assert cfg.attachments == (Attachment(type="hx_test_plugin_shout:Shout", hooks=("after_model",),
                                          params={"times": 3}),)


@pytest.mark.parametrize(("processors", "expected"), [
    ([{"type": Sized.type_name(), "hooks": ["after_model"], "params": {"times": "many"}}], "bad parameters"),
    ([{"type": Sized.type_name(), "hooks": ["after_model"], "params": {"colour": "red"}}], "bad parameters"),
    ([{"type": "hx_no_such_module_xyz:Thing", "hooks": ["after_model"]}], "cannot load processor"),
    ([{"type": "json:dumps", "hooks": ["after_model"]}], "is not a Processor subclass"),
    ([{"type": Sized.type_name(), "hooks": ["before_lunch"]}], "before_lunch"),
    ([{"type": Sized.type_name(), "hooks": ["before_tool"]}], "cannot attach to 'before_tool'"),
    ([{"type": Orphan.type_name(), "hooks": ["after_model"]}], "not in the harness"),
])
def test_bad_config_file_names_the_file(tmp_path: Path, processors: list[dict[str, Any]], expected: str) -> None:
    path = tmp_path / "bad-harness.json"
    path.write_text(json.dumps({"processors": processors}))
    with pytest.raises(CompositionError) as err:
        HarnessConfig.load(path)
    msg = str(err.value)
    assert str(path) in msg and expected in msg


def test_bad_params_error_names_the_processor(tmp_path: Path) -> None:
    path = tmp_path / "harness.toml"
    path.write_text(f'[[processors]]\ntype = "{Sized.type_name()}"\nhooks = ["after_model"]\n'
                    '[processors.params]\ntimes = "many"\n')
    with pytest.raises(CompositionError) as err:
        HarnessConfig.load(path)
    assert str(path) in str(err.value) and Sized.type_name() in str(err.value) and "times" in str(err.value)


def test_unreadable_or_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CompositionError, match="cannot read harness config"):
        HarnessConfig.load(tmp_path / "missing.yaml")
    with pytest.raises(CompositionError, match="unknown config suffix"):
        HarnessConfig.load(tmp_path / "harness.ini")
    broken = tmp_path / "broken.toml"
    broken.write_text("processors = [\n")
    with pytest.raises(CompositionError, match=f"{broken}: not valid toml"):
        HarnessConfig.load(broken)
    extra = tmp_path / "extra.yaml"
    extra.write_text("processors: []\nmodels: {}\n")
    with pytest.raises(CompositionError, match="unknown keys"):
        HarnessConfig.load(extra)


BINARY = bytes([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0xC5, 0xFF, 0x00, 0x01]) * 20
"""A PNG-like binary file: not UTF-8 at offset 0 (0x89)."""


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_a_binary_file_is_not_a_harness_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"picture{suffix}"
    path.write_bytes(BINARY)
    with pytest.raises(CompositionError) as err:
        HarnessConfig.load(path)
    assert str(err.value) == f"{path}: not a harness file: not UTF-8 text (byte 0x89 at offset 0)"


@pytest.mark.parametrize("command", [
    ("run", "--bench", "twx:coin", "--tasks", "1"),
    ("evolve", "--bench", "twx:coin", "--tasks", "1", "--rounds", "1"),
    ("replay", "some-run", "--round", "1"),
    ("fork", "some-run", "--task", "twx:coin:dev:0", "--attempt", "0", "--step", "1"),
])
def test_a_binary_harness_file_is_one_line_and_nothing_written(tmp_path: Path, command: tuple[str, ...]) -> None:
    path = tmp_path / "harness.yaml"
    path.write_bytes(BINARY)
    data = tmp_path / "data"
    result = hx_command("--data-dir", str(data), *command, "--harness", str(path))
    line = error_line(result)
    assert result.stderr.strip().splitlines() == [line]
    assert line == f"error: {path}: not a harness file: not UTF-8 text (byte 0x89 at offset 0)"
    assert not data.exists()  # no server started, no results claimed


# --- per-attempt instances, on the log ------------------------------------------------------


class EchoTask(Task):
    """Two steps: the script calls ``echo`` once, then answers."""

    def __init__(self, task_id: str = "echo:1") -> None:
        self.spec = TaskSpec(id=task_id, instruction="echo hi, then say done")
        self._tools = [FunctionTool(ToolSchema(name="echo", input_schema={"type": "object"}), lambda text: text)]

    def tools(self) -> list[FunctionTool]:
        return self._tools

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="exact", passed=final_answer == "done", score=float(final_answer == "done"))


ECHO_SCRIPT = {"completions": [
    {"content": "", "tool_calls": [{"id": "c1", "name": "echo", "input": {"text": "hi"}}]},
    {"content": "done"},
]}


async def before_model_returned(log: EventLog, subject: str) -> list[BeforeModel]:
    out = []
    async for rec in resolve_async(log.read(subjects=[subject])):
        ev = rec.event
        if isinstance(ev, HookRecord) and ev.stage == "returned" and isinstance(ev.event, BeforeModel):
            out.append(ev.event)
    return out


def agent_models() -> ModelConfig:
    return ModelConfig(main="script:echo", provider_options={"script:echo": ECHO_SCRIPT})


async def test_fresh_processor_instances_per_attempt(nats_url: str) -> None:
    cfg = HarnessConfig().attach("before_model", Numbered())
    task = EchoTask()
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = agent_models().agentic(cfg, log=conn.log)
        results = [await agent.run(task, run_id="fresh", attempt=i) for i in range(2)]
        results += await asyncio.gather(*(agent.run(task, run_id="fresh", attempt=i) for i in (2, 3)))
        assert [(r.status, r.passed, r.steps) for r in results] == [("completed", True, 2)] * 4
        for i in range(4):
            seen = await before_model_returned(conn.log, trace_subject("fresh", 0, task.spec.id, i))
            # each attempt numbers from 1: its Numbered instance is its own
            assert [next(m.content for m in reversed(b.messages) if m.role == "user") for b in seen] == [
                "echo hi, then say done [call 1]", "echo hi, then say done [call 2]"], i


async def test_multi_hook_processor_shares_state_across_its_hooks_in_a_run(nats_url: str) -> None:
    cfg = HarnessConfig().attach(("after_tool", "before_model"), LoopDetector())
    task = EchoTask()
    async with connect(NatsSettings(url=nats_url)) as conn:
        agent = agent_models().agentic(cfg, log=conn.log)
        for attempt in range(2):
            result = await agent.run(task, run_id="detector", attempt=attempt)
            assert (result.status, result.passed) == ("completed", True)
            seen = await before_model_returned(conn.log, trace_subject("detector", 0, task.spec.id, attempt))
            assert [b.messages[-1].content for b in seen] == ["echo hi, then say done",
                                                             "loop-detector: 1 tool results so far"]
