"""ModelConfig and ModelRouter: roles, fallback chains, error classification, every try an event."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import hx.runtime.providers.script  # noqa: F401 - registers the script: provider
from hx import (
    CallContext,
    Completion,
    FunctionTool,
    HarnessConfig,
    ModelConfig,
    Provider,
    ProviderError,
    Task,
)
from hx.runtime.errors import ContextTooLong
from hx.runtime.providers import base as providers_base
from hx.runtime.router import ModelRouter
from schemas.event import Event
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.messages import Message, TaskSpec, ToolSchema
from schemas.model import ModelError, ModelRequest, ModelResponse
from schemas.tools import VerifierScore
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject


class FlakyProvider(Provider):
    """Fails with the kinds listed in its ``fail`` option, one per call, then answers (or ``always`` fails)."""

    scheme = "flaky"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.failures: list[str] = list(self.options.get("fail", []))
        self.always: str | None = self.options.get("always")
        self.retry_after: float | None = self.options.get("retry_after")
        self.calls = 0
        self.closed = False

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        self.calls += 1
        kind = self.always or (self.failures.pop(0) if self.failures else None)
        if kind == "context_length":
            raise ContextTooLong(f"{self.spec}: prompt is too long")
        if kind is not None:
            raise ProviderError(kind, f"{self.spec}: {kind} ({self.options.get('detail', 'no detail')})",  # type: ignore[arg-type]
                                retry_after=self.retry_after)
        return Completion(content=f"answer from {self.spec}", stop_reason="end_turn", model_version=self.spec)

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _register_flakyprovider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the test provider for this module's tests only: the provider registry is global."""
    monkeypatch.setitem(providers_base.PROVIDERS._added, FlakyProvider.scheme, FlakyProvider)


MESSAGES = (Message(role="user", content="hello"),)
CTX = CallContext(run_id="r", round=0, task_id="t", attempt=0, step=1)


class Recorder:
    """A router with a fake sleep: delays are recorded, nothing waits."""

    def __init__(self, config: ModelConfig) -> None:
        self.delays: list[float] = []
        self.events: list[Event] = []
        self.router = ModelRouter(config, sleep=self.sleep)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)

    async def complete(self, role: str = "main", **kwargs: Any) -> tuple[str, Completion]:
        return await self.router.complete(role, MESSAGES, (), CTX, self.events.append, **kwargs)

    def tries(self) -> list[tuple[str, str, int, str]]:
        """(event, model, try_index, kind/next_action) per event."""
        out = []
        for e in self.events:
            if isinstance(e, ModelRequest):
                out.append(("request", e.model, e.try_index, ""))
            elif isinstance(e, ModelError):
                out.append(("error", e.model, e.try_index, f"{e.kind}->{e.next_action}"))
            elif isinstance(e, ModelResponse):
                out.append(("response", e.model, e.try_index, ""))
        return out


def chain(primary: dict[str, Any], *fallbacks: dict[str, Any], **kwargs: Any) -> ModelConfig:
    specs = [f"flaky:m{i}" for i in range(1 + len(fallbacks))]
    options = dict(zip(specs, (primary, *fallbacks), strict=True))
    return ModelConfig(main=specs[0], fallback={"main": specs[1:]}, provider_options=options, **kwargs)


async def test_rate_limit_is_retried_with_backoff_then_falls_back() -> None:
    rec = Recorder(chain({"always": "rate_limit"}, {}, retries=2, backoff_s=0.5))
    spec, completion = await rec.complete()
    assert (spec, completion.content) == ("flaky:m1", "answer from flaky:m1")
    assert rec.delays == [0.5, 1.0]
    assert rec.tries() == [
        ("request", "flaky:m0", 0, ""), ("error", "flaky:m0", 0, "rate_limit->retry"),
        ("request", "flaky:m0", 1, ""), ("error", "flaky:m0", 1, "rate_limit->retry"),
        ("request", "flaky:m0", 2, ""), ("error", "flaky:m0", 2, "rate_limit->fallback"),
        ("request", "flaky:m1", 3, ""), ("response", "flaky:m1", 3, "")]
    assert rec.router.provider("flaky:m0").calls == 3  # type: ignore[attr-defined]


async def test_backoff_is_exponential() -> None:
    rec = Recorder(chain({"fail": ["rate_limit"] * 3}, retries=3, backoff_s=0.25))
    spec, _ = await rec.complete()
    assert spec == "flaky:m0" and rec.delays == [0.25, 0.5, 1.0]
    assert rec.tries()[-1] == ("response", "flaky:m0", 3, "")


async def test_a_transient_rate_limit_recovers_on_the_same_model() -> None:
    rec = Recorder(chain({"fail": ["rate_limit"]}, {}, backoff_s=2.0))
    spec, _ = await rec.complete()
    assert spec == "flaky:m0" and rec.delays == [2.0]
    assert rec.tries() == [("request", "flaky:m0", 0, ""), ("error", "flaky:m0", 0, "rate_limit->retry"),
                           ("request", "flaky:m0", 1, ""), ("response", "flaky:m0", 1, "")]
    assert rec.router.provider("flaky:m1").calls == 0  # type: ignore[attr-defined]


async def test_retry_after_is_honoured() -> None:
    rec = Recorder(chain({"fail": ["rate_limit", "rate_limit"], "retry_after": 7.5}, backoff_s=0.5))
    await rec.complete()
    assert rec.delays == [7.5, 7.5]


@pytest.mark.parametrize("kind", ["connection", "server"])
async def test_transient_kinds_are_retried(kind: str) -> None:
    rec = Recorder(chain({"fail": [kind]}, backoff_s=0.1))
    spec, _ = await rec.complete()
    assert spec == "flaky:m0" and rec.delays == [0.1]
    assert rec.tries()[1] == ("error", "flaky:m0", 0, f"{kind}->retry")


@pytest.mark.parametrize("kind", ["authentication", "other"])
async def test_authentication_and_other_errors_fall_back_at_once(kind: str) -> None:
    rec = Recorder(chain({"always": kind}, {}, retries=5))
    spec, _ = await rec.complete()
    assert spec == "flaky:m1" and rec.delays == []
    assert rec.tries() == [("request", "flaky:m0", 0, ""), ("error", "flaky:m0", 0, f"{kind}->fallback"),
                           ("request", "flaky:m1", 1, ""), ("response", "flaky:m1", 1, "")]
    assert rec.router.provider("flaky:m0").calls == 1  # type: ignore[attr-defined]


async def test_context_too_long_raises_without_retry_or_fallback() -> None:
    rec = Recorder(chain({"always": "context_length"}, {}, retries=3))
    with pytest.raises(ContextTooLong, match="flaky:m0: prompt is too long"):
        await rec.complete()
    assert rec.delays == []
    assert rec.tries() == [("request", "flaky:m0", 0, ""), ("error", "flaky:m0", 0, "context_length->raise")]
    assert "flaky:m1" not in rec.router._providers


async def test_all_models_failing_raises_the_last_error() -> None:
    rec = Recorder(chain({"always": "rate_limit"}, {"always": "authentication"}, {"always": "server"},
                         retries=1, backoff_s=0.0))
    with pytest.raises(ProviderError) as err:
        await rec.complete()
    assert err.value.kind == "server" and "flaky:m2" in str(err.value)
    assert [t[3] for t in rec.tries() if t[0] == "error"] == [
        "rate_limit->retry", "rate_limit->fallback", "authentication->fallback", "server->retry", "server->raise"]
    assert [t[2] for t in rec.tries() if t[0] == "request"] == [0, 1, 2, 3, 4]
    assert rec.delays == [0.0, 0.0]


async def test_error_messages_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key-123")
    rec = Recorder(chain({"always": "authentication", "detail": "bad key sk-test-not-a-real-key-123"}))
    with pytest.raises(ProviderError) as err:
        await rec.complete()
    assert "sk-test" not in str(err.value) and "***" in str(err.value)
    assert all("sk-test" not in e.message for e in rec.events if isinstance(e, ModelError))


async def test_roles_resolve_with_their_own_chains_and_params() -> None:
    config = ModelConfig(
        main="flaky:main", judge="flaky:judge", evaluator="flaky:eval", roles={"critic": "flaky:critic"},
        fallback={"judge": ["flaky:judge-backup"], "critic": ["flaky:critic-backup"]},
        params={"judge": {"temperature": 0.0, "max_tokens": 16}},
        provider_options={"flaky:judge": {"always": "authentication"}})
    assert config.chain("main") == ["flaky:main"]
    assert config.chain("judge") == ["flaky:judge", "flaky:judge-backup"]
    assert config.chain("evaluator") == ["flaky:eval"]
    assert config.chain("critic") == ["flaky:critic", "flaky:critic-backup"]
    rec = Recorder(config)
    assert (await rec.complete("judge"))[0] == "flaky:judge-backup"
    assert (await rec.complete("evaluator"))[0] == "flaky:eval"
    assert (await rec.complete("critic"))[0] == "flaky:critic"
    assert (await rec.complete("main", extra_params={"seed": 1}))[0] == "flaky:main"
    requests = [e for e in rec.events if isinstance(e, ModelRequest)]
    assert [(r.role, r.model) for r in requests] == [("judge", "flaky:judge"), ("judge", "flaky:judge-backup"),
                                                     ("evaluator", "flaky:eval"), ("critic", "flaky:critic"),
                                                     ("main", "flaky:main")]
    assert requests[0].params == {"temperature": 0.0, "max_tokens": 16} and requests[-1].params == {"seed": 1}
    assert all(isinstance(e, ModelRequest | ModelError | ModelResponse) and e.role == "judge" for e in rec.events[:4])


@pytest.mark.parametrize("role", ["nope", "judge", "evaluator"])
async def test_an_unconfigured_role_is_an_error(role: str) -> None:
    config = ModelConfig(main="flaky:main")
    with pytest.raises(ProviderError, match=f"no model configured for role '{role}'"):
        config.chain(role)
    rec = Recorder(config)
    with pytest.raises(ProviderError, match=f"no model configured for role '{role}'") as err:
        await rec.complete(role)
    assert err.value.kind == "other" and rec.events == []


async def test_providers_are_cached_per_spec_and_closed() -> None:
    rec = Recorder(chain({"fail": ["rate_limit"]}, backoff_s=0.0))
    await rec.complete()
    provider = rec.router.provider("flaky:m0")
    assert provider is rec.router.provider("flaky:m0") and provider.calls == 2  # type: ignore[attr-defined]
    assert provider.options == {"fail": ["rate_limit"]}  # the options as configured, for this spec
    await rec.router.aclose()
    assert provider.closed  # type: ignore[attr-defined]
    assert rec.router.provider("flaky:m0") is not provider


# --- in a run, on the log ------------------------------------------------------------------------


class Hello(Task):
    """One step: the model says something; any answer passes."""

    def __init__(self) -> None:
        self.spec = TaskSpec(id="hello:1", instruction="say hello")

    def tools(self) -> Sequence[FunctionTool]:
        return ()

    async def reset(self) -> str:
        return self.spec.instruction

    async def verify(self, final_answer: str) -> VerifierScore:
        return VerifierScore(verifier="nonempty", passed=bool(final_answer), score=float(bool(final_answer)))


async def attempt(nats_url: str, config: ModelConfig, run_id: str) -> tuple[Any, list[Event]]:
    async with connect(NatsSettings(url=nats_url)) as conn:
        result = await config.agentic(HarnessConfig(), log=conn.log).run(Hello(), run_id=run_id)
        events = [r.event async for r in conn.log.read(subjects=[trace_subject(run_id, 0, "hello:1", 0)])]
    return result, events


async def test_every_try_is_on_the_log(nats_url: str) -> None:
    config = chain({"fail": ["rate_limit"]}, {}, retries=0, backoff_s=0.0)
    result, events = await attempt(nats_url, config, "tries")
    assert (result.status, result.passed, result.final_answer) == ("completed", True, "answer from flaky:m1")
    model_events = [e for e in events if isinstance(e, ModelRequest | ModelError | ModelResponse)]
    assert [(type(e).__name__, e.model, e.try_index) for e in model_events] == [
        ("ModelRequest", "flaky:m0", 0), ("ModelError", "flaky:m0", 0), ("ModelRequest", "flaky:m1", 1),
        ("ModelResponse", "flaky:m1", 1)]
    error = model_events[1]
    assert isinstance(error, ModelError)
    assert (error.kind, error.next_action, error.role, error.step) == ("rate_limit", "fallback", "main", 1)
    assert isinstance(events[0], AttemptStarted) and events[0].model == "flaky:m0"


async def test_all_models_failing_in_a_run_is_an_infra_failure_naming_the_model(nats_url: str) -> None:
    config = chain({"always": "authentication"}, {"always": "rate_limit"}, retries=1, backoff_s=0.0)
    result, events = await attempt(nats_url, config, "all-down")
    assert (result.status, result.passed) == ("infra_failure", False)
    assert "flaky:m1" in result.reason and "rate_limit" in result.reason
    finished = events[-1]
    assert isinstance(finished, AttemptFinished)
    assert (finished.status, finished.reason) == ("infra_failure", result.reason)
    assert [e.next_action for e in events if isinstance(e, ModelError)] == ["fallback", "retry", "raise"]


async def test_context_too_long_in_a_run(nats_url: str) -> None:
    config = chain({"always": "context_length"}, {})
    result, events = await attempt(nats_url, config, "too-long")
    assert result.status == "infra_failure" and "prompt is too long" in result.reason
    assert not [e for e in events if isinstance(e, ModelRequest) and e.model == "flaky:m1"]
