"""Secrets: a password in a model URL, or an API key, appears in no output hx writes (grepped for, everywhere)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import msgspec
import pytest
from hx_cli import hx, ok
from model_server import model_server
from nats.js.errors import NotFoundError

from hx.aegis.job import EvolveJob
from hx.aegis.ledger import Ledger
from hx.aegis.session import recorded_job as read_job
from hx.runtime.errors import ModelSpecError
from hx.runtime.models import restore_spec
from hx.runtime.providers.base import CallContext, make_provider
from schemas.envelope import HX_ENCODING, inflate
from schemas.harness import HarnessSpec
from schemas.ledger import LedgerOpened, ledger_digest
from schemas.lifecycle import RunStarted
from schemas.messages import Message
from streams.config import NatsSettings
from streams.connection import connect
from streams.outgoing import Entry
from streams.redaction import MASK, SECRET_ENV, mask_url, needs_scrub, register, scrub, scrub_body, secrets
from streams.topology import LEDGER, SPECS, TRACE, trace_subject

PASSWORD = "S3cret-Passw0rd-in-the-url"
API_KEY = "sk-test-key-that-must-not-leak-0123"
QUERY_KEY = "qk-in-the-query-string-5d2b8f"
META_PASSWORD = "Meta-Passw0rd-3f9a0c"
META_TOKEN = "meta-token-in-the-query-b71d44"
TASK = "twx:coin:dev:0"
KEY_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "HX_OPENAI_API_KEY", "HX_OPENAI_BASE_URL")


async def every_stored_message(data_dir: Path) -> list[bytes]:
    """Headers and (inflated) bodies of every message of every stream on the data directory's server."""
    out: list[bytes] = []
    async with connect(NatsSettings(data_dir=data_dir), apply=False) as conn:
        for info in await conn.js.streams_info():
            name = info.config.name
            assert name is not None
            for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
                try:
                    msg = await conn.js.get_msg(name, seq)
                except NotFoundError:  # a key-value update replaced it
                    continue
                headers = msg.headers or {}
                body = msg.data or b""
                if headers.get(HX_ENCODING):
                    body = inflate(headers[HX_ENCODING], body)
                out.append(repr(headers).encode() + body)
    return out


def grep_everything(tmp_path: Path, data_dir: Path, done: subprocess.CompletedProcess[str], *secrets: str) -> None:
    """No secret in stdout, stderr, any file under ``tmp_path`` (results, server log) or any stored message."""
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and "store" not in p.parts}
    assert files, "nothing was written"
    messages = asyncio.run(every_stored_message(data_dir))
    assert len(messages) > 5
    for secret in secrets:
        assert secret not in done.stdout and secret not in done.stderr, secret
        for path, data in files.items():
            if path.name != "credentials.json" and path.name != "server.conf":  # the server's own, mode 0600
                assert secret.encode() not in data, (secret, path)
        leaking = [m[:200] for m in messages if secret.encode() in m]
        assert not leaking, (secret, leaking)


def run_hx(data_dir: Path, out: Path, *args: str,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HX_DATA_DIR": str(data_dir), **(env or {})}
    full.pop("HX_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "hx", "run", "--tasks", "2", "--attempts", "1", "--max-steps", "4",
                           "--out", str(out), *args], env=full, capture_output=True, text=True, timeout=180,
                          check=False)


@pytest.mark.slow
def test_a_password_in_the_model_url_is_nowhere(tmp_path: Path) -> None:
    data_dir = tmp_path / "hx"
    with model_server("play") as server:
        done = run_hx(data_dir, tmp_path / "results" / "ok.json", "--model",
                      f"openai:m@http://hxuser:{PASSWORD}@{server.url}/v1", "--run-id", "with-password")
    assert done.returncode == 0, done.stderr
    assert server.authorizations and all(a.startswith("Basic ") for a in server.authorizations)  # it was used
    assert f"openai:m@http://{MASK}@{server.url}/v1" in done.stderr  # shown masked, where it is shown
    grep_everything(tmp_path, data_dir, done, PASSWORD)


@pytest.mark.slow
def test_credentials_echoed_by_a_failing_server_are_nowhere(tmp_path: Path) -> None:
    data_dir = tmp_path / "hx"
    with model_server("refuse") as server:
        done = run_hx(data_dir, tmp_path / "results" / "refused.json", "--model",
                      f"openai:m@http://hxuser:{PASSWORD}@{server.url}/v1", "--run-id", "echoed",
                      env={"HX_OPENAI_API_KEY": API_KEY})
    assert done.returncode == 1, done.stderr
    assert "invalid credentials" in done.stderr  # the server's words reach the user, its echo of the secret not
    grep_everything(tmp_path, data_dir, done, PASSWORD, API_KEY, f"hxuser:{PASSWORD}")


async def test_the_log_masks_a_registered_secret_in_any_event(nats_url: str) -> None:
    """The last line of defence: whatever event carries a secret, the stored body does not."""
    register("a-registered-secret-value")
    event = RunStarted(run_id="r", config={"note": "token a-registered-secret-value and http://u:pw@h/x"})
    async with connect(NatsSettings(url=nats_url)) as conn:
        ack = await conn.log.append(trace_subject("r"), event)
        msg = await conn.js.get_msg("HX_TRACE", ack.seq)
        [record] = [r async for r in conn.log.read()]
    assert msg.data is not None
    assert b"a-registered-secret-value" not in msg.data and b"u:pw" not in msg.data
    assert isinstance(record.event, RunStarted)
    assert record.event.config["note"] == f"token {MASK} and http://{MASK}@h/x"


def test_scrub_masks_url_credentials_of_any_length_and_leaves_the_rest() -> None:
    assert scrub("GET http://a:b@host/v1 ok") == f"GET http://{MASK}@host/v1 ok"
    assert scrub("nats://u:p@ss@h:4222") == f"nats://{MASK}@h:4222"
    assert scrub("openai:m@http://host/v1") == "openai:m@http://host/v1"  # no credentials: unchanged
    assert scrub("mail me@example.com") == "mail me@example.com"
    body = b"\x81\xa4note\xa3abc"
    assert scrub_body(body) is body  # nothing to mask: the very same bytes, no re-encoding


@pytest.mark.parametrize(("text", "shown"), [
    ("openai:m@http://h/v1?api_key=K1", f"openai:m@http://h/v1?api_key={MASK}"),
    ("http://h/v1?api-version=2024-06&X-Api-Key=K2&n=1", f"http://h/v1?api-version=2024-06&X-Api-Key={MASK}&n=1"),
    ("GET /v1?apikey=K3 refused", f"GET /v1?apikey={MASK} refused"),
    ("http://h/?API_KEY=K4#access_token=K5", f"http://h/?API_KEY={MASK}#access_token={MASK}"),
    ("?token=K6&client_secret=K7&password=K8&pwd=K9", f"?token={MASK}&client_secret={MASK}&password={MASK}&pwd={MASK}"),
    ("s3://b/o?X-Amz-Credential=K/1&X-Amz-Security-Token=K&X-Amz-Signature=K&sig=K",
     f"s3://b/o?X-Amz-Credential={MASK}&X-Amz-Security-Token={MASK}&X-Amz-Signature={MASK}&sig={MASK}"),
    ("at http://h/v1?key=K10: ConnectError", f"at http://h/v1?key={MASK}: ConnectError"),
    ("http://u:p@h/v1?auth=K11", f"http://{MASK}@h/v1?auth={MASK}"),
    ("http://h/v1?model=m&keyword=k&api_key=", "http://h/v1?model=m&keyword=k&api_key="),  # nothing secret
    ("sorted(tasks, key=len)", "sorted(tasks, key=len)"),  # not a query
])
def test_scrub_masks_query_values_whose_name_says_secret(text: str, shown: str) -> None:
    assert scrub(text) == shown
    assert scrub(shown) == shown  # masking again changes nothing
    assert mask_url(text) == shown


@pytest.mark.parametrize("text", [
    "http://u:pw@h/x", "nats://u:p@ss@h:4222", "http://h/v1?api_key=k", "?X-Api-Key=k", "a&Token=k", "#access_token=k",
    "http://h?Client_Secret=k", "?sig=k",
])
def test_the_byte_check_finds_whatever_scrub_masks(text: str) -> None:
    """``needs_scrub`` is the log's only look at a body: all that ``scrub`` would mask must make it look closer."""
    body = msgspec.msgpack.encode({"note": f"before {text} after"})
    assert scrub(text) != text
    assert needs_scrub(body, ())
    assert needs_scrub(body[::-1] + body, ())  # wherever it sits


def test_the_byte_check_passes_ordinary_bodies() -> None:
    for text in ("numLocations=11, tasksuccess=False", "x = y == z", "http://h/v1?model=m", "mail me@example.com"):
        assert not needs_scrub(msgspec.msgpack.encode({"note": text}), ()), text


@pytest.fixture
def no_secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("no_secret_env")
@pytest.mark.parametrize("framed", [False, True], ids=["event", "frame"])
@pytest.mark.parametrize(("url", "shown"), [("http://admin:{}@host/x", f"http://{MASK}@host/x"),
                                           ("http://host/v1?api_key={}", f"http://host/v1?api_key={MASK}"),
                                           ("https://h/v1?X-Api-Key={}", f"https://h/v1?X-Api-Key={MASK}")])
async def test_the_log_masks_url_credentials_with_nothing_registered(nats_url: str, url: str, shown: str,
                                                                   framed: bool) -> None:
    """Only the URL rules can mask these: the secret is new, no environment variable holds one."""
    secret = f"never-registered-{uuid.uuid4().hex}"
    assert not any(secret in known for known in secrets())
    event = RunStarted(run_id="r", config={"note": f"served at {url.format(secret)} today"})
    async with connect(NatsSettings(url=nats_url)) as conn:
        if framed:
            [ack] = await conn.log.append_batch([Entry(trace_subject("r"), event), Entry(trace_subject("r"), event)],
                                                frame_size=8)
        else:
            ack = await conn.log.append(trace_subject("r"), event)
        msg = await conn.js.get_msg(TRACE.name, ack.seq)
        records = [r async for r in conn.log.read()]
    assert msg.data is not None and secret.encode() not in msg.data
    started = [r.event for r in records if isinstance(r.event, RunStarted)]
    assert len(started) == len(records) == (2 if framed else 1)
    assert {e.config["note"] for e in started} == {f"served at {shown} today"}


@pytest.mark.usefixtures("no_secret_env")
async def test_the_ledger_masks_a_secret_before_chaining_it(nats_url: str) -> None:
    """The ledger refuses delete and purge: a secret must never reach it, and the chain must still hold."""
    secret = f"never-registered-{uuid.uuid4().hex}"
    opened = LedgerOpened(run_id="led", strategy="ensemble", harness=HarnessSpec(), digest="sha256:0",
                          settings={"model": f"openai:m@http://u:{secret}@h/v1"})
    async with connect(NatsSettings(url=nats_url)) as conn:
        ledger = Ledger(conn, "led")
        try:
            await ledger.start(opened)
        finally:
            await ledger.close()
        info = await conn.js.stream_info(LEDGER.name)
        stored = [await conn.js.get_msg(LEDGER.name, seq) for seq in range(1, int(info.state.last_seq or 0) + 1)]
        again = Ledger(conn, "led")
        try:
            loaded = await again.load()
        finally:
            await again.close()
    assert stored and not any(secret.encode() in (m.data or b"") for m in stored)
    assert loaded is not None and loaded.opened.settings["model"] == f"openai:m@http://{MASK}@h/v1"
    assert loaded.head == ledger_digest(loaded.opened)


async def test_a_query_in_the_server_url_goes_with_every_request() -> None:
    """The provider gets the real key, in the place the server expects it, while every record masks it."""
    with model_server("play") as server:
        provider = make_provider(f"openai:m@http://{server.url}/v1/?api-version=2&api_key={QUERY_KEY}")
        try:
            for step in (1, 2):
                await provider.complete((Message(role="user", content="hi"),), (), {},
                                        CallContext(run_id="r", round=0, task_id="t", attempt=0, step=step))
        finally:
            await provider.aclose()
    assert server.paths == [f"/v1/chat/completions?api-version=2&api_key={QUERY_KEY}"] * 2
    assert QUERY_KEY not in repr(provider)


def test_a_masked_spec_is_resumed_only_with_its_credentials_given_back() -> None:
    recorded = f"openai:m@http://{MASK}@h/v1?api_key={MASK}"
    real = "openai:m@http://me:pw@h/v1?api_key=k"
    assert restore_spec(recorded, real, option="--model", what="run 'r'") == real
    with pytest.raises(ModelSpecError, match=r"run 'r' recorded --model .* with its credentials masked: pass it"):
        restore_spec(recorded, None, option="--model", what="run 'r'")
    other = f"--model 'openai:m@http://{MASK}@other/v1?api_key={MASK}' differs from the spec run 'r' recorded"
    with pytest.raises(ModelSpecError, match=re.escape(other)):
        restore_spec(recorded, "openai:m@http://me:pw@other/v1?api_key=k", option="--model", what="run 'r'")
    assert restore_spec("random:", None, option="--model", what="run 'r'") == "random:"
    job = EvolveJob(run_id="r", benches=("twx:coin",), adaptation=(), heldout=(), model=real, meta_model=real)
    recorded_job = read_job(msgspec.to_builtins(job.public()))  # what ledger.opened holds
    assert recorded_job.model == recorded and recorded_job.meta_model == recorded
    assert recorded_job.restored(real, real) == job  # the resumed run calls the real server
    with pytest.raises(ModelSpecError, match="may only give back"):
        restore_spec("random:", "random:act", option="--model", what="run 'r'")


class Commands:
    """``hx`` processes on one data directory (each its own process: no secret registered by an earlier one)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.outputs: dict[str, str] = {}

    def __call__(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in (*KEY_ENV, "HX_NATS_URL", "HX_DATA_DIR")}
        done = subprocess.run([sys.executable, "-m", "hx", "--data-dir", str(self.data_dir), *args], env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == code, (args, done.stdout[-2000:], done.stderr[-2000:])
        self.outputs[f"{' '.join(args)} ({len(self.outputs)})"] = done.stdout + done.stderr
        return done

    def read(self, *args: str) -> str:
        """A command that only reads, in-process (it is given no spec, so it registers no secret)."""
        out = ok(hx("--data-dir", str(self.data_dir), *args)).output
        self.outputs[" ".join(args)] = out
        return out

    def nowhere(self, root: Path, *secrets_: str) -> None:
        """No secret in any output so far, any file under ``root`` or any message stored (inflated)."""
        for name in sorted(SPECS):
            self.read("log", "dump", "--stream", name)
        stored = asyncio.run(every_stored_message(self.data_dir))
        files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        assert any(p.suffix == ".blk" for p in files)  # the JetStream store itself is searched
        for secret in secrets_:
            assert not [name for name, text in self.outputs.items() if secret in text], secret
            assert not [p for p, data in files.items() if secret.encode() in data], secret
            assert not [m[:200] for m in stored if secret.encode() in m], secret


SMALL = ("--bench", "twx:coin", "--tasks", "1", "--heldout-tasks", "1", "--rounds", "1", "--attempts", "1",
         "--max-steps", "4")
META = f"openai:meta@http://hxmeta:{META_PASSWORD}@127.0.0.1:9/v1?access_token={META_TOKEN}"
"""A meta-model nobody answers: the LLM stages fail and the run goes on without them."""


@pytest.mark.slow
def test_no_secret_of_hx_run_or_hx_fork_is_anywhere(tmp_path: Path) -> None:
    """``hx run --model`` and ``hx fork --model`` with a password in the URL and a key in its query."""
    commands = Commands(tmp_path / "hx")
    with model_server("play") as server:
        spec = f"openai:stand-in@http://hxuser:{PASSWORD}@{server.url}/v1?api_key={QUERY_KEY}"
        shown = f"openai:stand-in@http://{MASK}@{server.url}/v1?api_key={MASK}"
        run = commands("run", "--tasks", "1", "--attempts", "1", "--max-steps", "4", "--model", spec, "--run-id", "r1",
                       "--out", str(tmp_path / "out" / "r1.json"))
        assert shown in run.stderr  # shown masked, where it is shown
        fork = commands("fork", "r1", "--task", TASK, "--attempt", "0", "--step", "1", "--model", spec)
        assert shown in fork.stdout
        refused = commands("fork", "r1", "--task", TASK, "--attempt", "0", "--step", "1", code=1)
        assert f"recorded --model {shown!r} with its credentials masked" in refused.stderr
    # the server got the real secrets, in the URL's user part and in the query
    assert server.paths and all(path.endswith(f"?api_key={QUERY_KEY}") for path in server.paths)
    assert server.authorizations and all(a.startswith("Basic ") for a in server.authorizations)
    commands.read("trace", "r1", TASK)
    commands.nowhere(tmp_path, PASSWORD, QUERY_KEY)


@pytest.mark.slow
@pytest.mark.timeout(300)  # eleven hx processes, several of them games: minutes on a loaded machine
def test_no_secret_of_hx_evolve_is_anywhere_and_a_resume_takes_it_again(tmp_path: Path) -> None:
    """``hx evolve --model --meta-model``, its ``--resume`` and ``hx bisect``; then export, report, ledger, audit."""
    commands = Commands(tmp_path / "hx")
    with model_server("play") as server:
        spec = f"openai:stand-in@http://hxuser:{PASSWORD}@{server.url}/v1?api_key={QUERY_KEY}"
        shown = f"openai:stand-in@http://{MASK}@{server.url}/v1?api_key={MASK}"
        commands("evolve", *SMALL, "--model", spec, "--meta-model", META, "--evolver", "llm", "--run-id", "e1")
        calls = len(server.paths)
        for given, message in [((), f"recorded --model {shown!r} with its credentials masked"),
                               (("--model", spec), "recorded --meta-model 'openai:meta@http://***@127.0.0.1:9/v1?"),
                               (("--model", spec.replace("/v1", "/v2"), "--meta-model", META), "differs from")]:
            refused = commands("evolve", "--resume", "e1", *given, code=1)
            assert message in refused.stderr.strip().splitlines()[-1], refused.stderr
        assert len(server.paths) == calls  # refused before any rollout
        commands("evolve", "--resume", "e1", "--model", spec, "--meta-model", META)
        assert "recorded --model" in commands("bisect", "e1", TASK, "--from", "0", "--to", "1", code=1).stderr
        accepted = commands("bisect", "e1", TASK, "--from", "0", "--to", "1", "--model", spec, code=1)
        assert "--model" not in accepted.stderr  # past the spec: this run has no round 1 to bisect to
    assert calls and all(path.endswith(f"?api_key={QUERY_KEY}") for path in server.paths)
    commands.read("export", "e1", str(tmp_path / "export"))
    commands.read("report", "e1", "--out", str(tmp_path / "report"))
    commands.read("ledger", "e1")
    commands.read("audit", "verify", "e1")
    assert (tmp_path / "export" / "audit.jsonl").exists() and (tmp_path / "report" / "report.html").exists()
    commands.nowhere(tmp_path, PASSWORD, QUERY_KEY, META_PASSWORD, META_TOKEN)
    assert f'"model":"{shown}"' in commands.outputs["log dump --stream HX_LEDGER"].replace(" ", "")  # masked


@pytest.mark.slow
@pytest.mark.timeout(300)  # co-evolution loads the learner (JAX) in each of its three processes
def test_no_secret_of_hx_coevolve_is_anywhere_and_a_resume_takes_it_again(tmp_path: Path) -> None:
    """``hx coevolve --meta-model`` (its task agent is the trained policy) and its ``--resume``."""
    commands = Commands(tmp_path / "hx")
    commands("coevolve", *SMALL, "--meta-model", META, "--evolver", "llm", "--run-id", "c1")
    assert "recorded --meta-model" in commands("coevolve", "--resume", "c1", code=1).stderr
    commands("coevolve", "--resume", "c1", "--meta-model", META)
    commands.read("report", "c1", "--out", str(tmp_path / "report"))
    commands.nowhere(tmp_path, META_PASSWORD, META_TOKEN)
