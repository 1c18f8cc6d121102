"""Model specs are checked before a run starts; a run whose every attempt failed for infrastructure exits non-zero."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import Result
from hx_cli import error_line, hx
from model_server import model_server

from hx.runtime.errors import ModelSpecError
from hx.runtime.models import ModelConfig
from schemas.lifecycle import RunFinished
from streams.config import NatsSettings
from streams.connection import connect
from streams.processes import free_port
from streams.topology import TRACE, trace_subject

KEY_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "HX_OPENAI_API_KEY",
           "HX_OPENAI_BASE_URL")


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KEY_ENV:
        monkeypatch.delenv(name, raising=False)


def refused_before_anything(result: Result, data_dir: Path, message: str) -> None:
    """Exit 1 with one ``error:`` line, and nothing started, claimed or appended."""
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in result.output
    assert message in result.stderr
    assert not (data_dir / "nats").exists() and not (data_dir / "results").exists()


@pytest.mark.parametrize(("spec", "message"), [
    ("foo:bar",
     "unknown model provider 'foo' in 'foo:bar'; known: anthropic, fork, openai, policy, random, replay, script"),
    ("nocolon", "model spec 'nocolon' needs a scheme"),
    ("anthropic:claude-sonnet-4-6", "no API key: set ANTHROPIC_API_KEY"),
    ("anthropic:", "no model name"),
    ("openai:", "no model name"),
    ("openai:m@http://", "is not an http:// or https:// URL with a host"),
    ("openai:m@http://127.0.0.1:99999/v1", "malformed URL"),
    ("openai:m@ftp://files.example/v1", "must start with http:// or https://"),
])
def test_a_model_spec_that_cannot_work_is_refused_before_the_run(tmp_path: Path, spec: str, message: str) -> None:
    result = hx("--data-dir", str(tmp_path), "run", "--tasks", "1", "--attempts", "1", "--model", spec)
    refused_before_anything(result, tmp_path, message)


@pytest.mark.parametrize(("command", "option"), [
    (("run",), "--model"), (("evolve",), "--model"), (("evolve",), "--meta-model"), (("coevolve",), "--meta-model"),
    (("fork", "some-run", "--task", "t", "--attempt", "0", "--step", "0"), "--model"),
    (("bisect", "some-run", "t", "--from", "0", "--to", "1"), "--model"),
])
@pytest.mark.parametrize(("spec", "problem"), [
    ("openai:gpt-x@not a url", "model 'openai:gpt-x@not a url': 'not a url' after '@' is not a server URL"),
    ("openai:gpt-x@127.0.0.1:8000/v1", "'127.0.0.1:8000/v1' after '@' is not a server URL"),
    ("openai:gpt-x@http://host/v 1", "'http://host/v 1' is not a URL: it holds a space"),
])
def test_a_spec_whose_server_part_is_not_a_url_is_refused_naming_the_option(
        tmp_path: Path, command: tuple[str, ...], option: str, spec: str, problem: str) -> None:
    line = error_line(hx("--data-dir", str(tmp_path), *command, option, spec))
    assert line.startswith(f"error: {option}: ") and problem in line, line
    assert not any(tmp_path.iterdir())  # refused before anything started or was written


def test_a_fallback_model_is_checked_too() -> None:
    config = ModelConfig(main="random:", fallback={"main": ["openai:m@ftp://x/v1"]})
    with pytest.raises(ModelSpecError, match="role main: model 'openai:m@ftp://x/v1'"):
        config.check()
    with pytest.raises(ModelSpecError, match="fallback models for role"):
        ModelConfig(fallback={"judge": ["random:"]}).check()


@pytest.mark.parametrize("spec", [
    "random:", "random:act", "replay:", "anthropic:claude-sonnet-4-6", "openai:qwen3-8b",
    "openai:MODEL@http://host/v1", "openai:qwen3-8b@http://127.0.0.1:8000/v1", "openai:m@https://api.example.com/v1",
    "openai:m@http://user:pw@host/v1", "openai:org/model@http://host:8000/v1",
])
def test_every_documented_spec_form_passes_the_check(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    config = ModelConfig(main=spec)
    config.check()
    shown = config.public().main
    assert "pw@" not in shown and (shown == spec or "***@" in shown)


def test_script_completions_are_checked() -> None:
    ModelConfig(main="script:demo", provider_options={"script:demo": {"completions": [{"content": "hi"}]}}).check()
    with pytest.raises(ModelSpecError, match="bad completions"):
        ModelConfig(main="script:demo", provider_options={"script:demo": {"completions": [{"content": 3}]}}).check()


def test_the_url_form_of_hx_run_help_runs(tmp_path: Path) -> None:
    """``openai:MODEL@http://host/v1`` used to crash in URL redaction (IndexError) before the first attempt."""
    with model_server("play") as server:
        result = hx("--data-dir", str(tmp_path), "run", "--tasks", "1", "--attempts", "1", "--max-steps", "3",
                    "--model", f"openai:m@http://{server.url}/v1", "--run-id", "url-form")
    assert result.exit_code == 0, result.output
    assert "IndexError" not in result.output and len(server.authorizations) == 3


def test_every_attempt_failing_for_infrastructure_fails_the_run(tmp_path: Path, nats_url: str) -> None:
    with model_server("refuse") as server:
        result = hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "2", "--attempts", "1",
                    "--model", f"openai:m@http://{server.url}/v1", "--run-id", "all-infra")
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: run all-infra: all 2 attempts failed for infrastructure reasons; 2 of them: "
                           "model call failed: openai:m at http://"), last
    assert "HTTP 401" in last and "Traceback" not in result.output
    assert (tmp_path / "results" / "all-infra.json").exists()  # the table and results are still there to read

    async def finished() -> RunFinished:
        async with connect(NatsSettings(url=nats_url)) as conn:
            [record] = [r async for r in conn.log.read(TRACE.name, subjects=[trace_subject("all-infra")],
                                                       types=[RunFinished.TYPE])]
            assert isinstance(record.event, RunFinished)
            return record.event
    event = asyncio.run(finished())
    assert event.status == "failed" and "all 2 attempts failed for infrastructure reasons" in event.reason


def test_some_attempts_failing_is_not_a_failed_run(tmp_path: Path, nats_url: str) -> None:
    """Only a run with no attempt that reached its verdict fails as a whole."""
    result = hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "2", "--attempts", "1",
                "--max-steps", "3", "--run-id", "fine")
    assert result.exit_code == 0, result.output


def test_an_unreachable_model_server_fails_the_run(tmp_path: Path, nats_url: str) -> None:
    port = free_port()  # nothing listens there
    result = hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "run", "--tasks", "1", "--attempts", "1",
                "--model", f"openai:m@http://127.0.0.1:{port}/v1", "--run-id", "unreachable")
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert "all 1 attempts failed for infrastructure reasons" in last and "ConnectError" in last, last
