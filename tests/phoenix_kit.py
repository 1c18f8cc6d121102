"""A real Arize Phoenix server on loopback, and what it stored, asked through Phoenix's own client.

Phoenix cannot live in hx's environment (arize-phoenix pins anthropic<2), so it runs from its
own venv: the python named by ``HX_PHOENIX_PYTHON``, else the one ``.ci/phoenix-venv`` prints
(the script makes the venv when it is missing). The server gets a temporary working dir (its
SQLite database lives there), free HTTP and gRPC ports on 127.0.0.1, and every switch that
makes it reach the network on its own turned off. Queries run a short script under that venv's
python, through ``phoenix.client``, and come back as JSON.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON_VARIABLE = "HX_PHOENIX_PYTHON"
READY_WITHIN_S = 300.0
"""Phoenix imports a large app and migrates a fresh SQLite database: ~30 s on a busy 2-core machine."""
STOP_WITHIN_S = 20.0

QUIET = {
    "PHOENIX_TELEMETRY_ENABLED": "false",  # FullStory and Scarf.sh pixels
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",  # web fonts, the sandbox binary download, any own-initiative call
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_AGENTS_DISABLE_WEB_ACCESS": "true",
    "PHOENIX_AGENTS_DISABLE_BASH": "true",
    "PHOENIX_AGENTS_DISABLE_GITHUB": "true",
    "PHOENIX_ENABLE_MCP_SERVER": "false",
    "PHOENIX_LOG_MIGRATIONS": "false",
}
"""Environment that keeps a test's Phoenix to itself: no telemetry, no outbound calls, no agent tools."""

QUERY = r"""
import json, sys
import httpx
from phoenix.client import Client

base_url, project = sys.argv[1], sys.argv[2]
client = Client(base_url=base_url)
out = {"projects": [p["name"] for p in client.projects.list()], "spans": [], "sessions": []}
if project in out["projects"]:
    for s in client.spans.get_spans(project_identifier=project, limit=100_000):
        out["spans"].append({
            "name": s["name"], "span_kind": s["span_kind"], "trace_id": s["context"]["trace_id"],
            "span_id": s["context"]["span_id"], "parent_id": s.get("parent_id") or "",
            "start_time": s["start_time"], "end_time": s["end_time"], "status_code": s["status_code"],
            "status_message": s.get("status_message") or "", "attributes": s.get("attributes") or {}})
    for session in client.sessions.list(project_name=project):
        out["sessions"].append({"session_id": session["session_id"],
                                "trace_ids": sorted(t["trace_id"] for t in session["traces"])})
json.dump(out, sys.stdout)
"""
"""Prints what Phoenix holds for one project: its spans, its sessions, and every project's name."""


@dataclass(frozen=True)
class StoredSpan:
    """One span as Phoenix stored and classified it."""

    name: str
    span_kind: str
    """Phoenix's kind (AGENT, LLM, TOOL, CHAIN, ...), inferred from the span's attributes."""
    trace_id: str
    span_id: str
    parent_id: str
    start: datetime
    end: datetime
    status_code: str
    status_message: str
    attributes: dict[str, Any]

    @property
    def duration_s(self) -> float:
        """End minus start, in seconds (Phoenix keeps microseconds)."""
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Stored:
    """What Phoenix answered for one project."""

    projects: list[str]
    spans: list[StoredSpan]
    sessions: dict[str, list[str]]
    """Trace ids by session id."""


def phoenix_python() -> str:
    """The python of Phoenix's venv: ``HX_PHOENIX_PYTHON``, else what ``.ci/phoenix-venv`` prints (making it)."""
    if named := os.environ.get(PYTHON_VARIABLE):
        return named
    made = subprocess.run([str(REPO / ".ci" / "phoenix-venv")], capture_output=True, text=True, check=False)
    assert made.returncode == 0, f".ci/phoenix-venv failed:\n{made.stderr[-3000:]}"
    return made.stdout.strip().splitlines()[-1]


def free_port() -> int:
    """A port nothing listens on now (bound to 0, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class Phoenix:
    """A running Phoenix: where it listens, and the python whose ``phoenix.client`` asks it."""

    url: str
    """``http://127.0.0.1:PORT``: the UI, the REST API, and OTLP/HTTP at ``/v1/traces``."""
    python: str

    def stored(self, project: str) -> Stored:
        """The project's spans and sessions and every project's name, through Phoenix's client."""
        done = subprocess.run([self.python, "-c", QUERY, self.url, project], capture_output=True, text=True,
                              env=_own_env(), timeout=120, check=False)
        assert done.returncode == 0, f"phoenix.client query failed:\n{done.stderr[-3000:]}"
        raw = json.loads(done.stdout)
        spans = [StoredSpan(name=s["name"], span_kind=s["span_kind"], trace_id=s["trace_id"], span_id=s["span_id"],
                            parent_id=s["parent_id"], start=datetime.fromisoformat(s["start_time"]),
                            end=datetime.fromisoformat(s["end_time"]), status_code=s["status_code"],
                            status_message=s["status_message"], attributes=s["attributes"])
                 for s in raw["spans"]]
        return Stored(projects=raw["projects"], spans=spans,
                      sessions={s["session_id"]: s["trace_ids"] for s in raw["sessions"]})

    def wait_for_spans(self, project: str, count: int, within_s: float = 120.0) -> Stored:
        """Ask until the project holds ``count`` spans (Phoenix ingests asynchronously); fail past ``within_s``."""
        deadline = time.monotonic() + within_s
        while True:
            stored = self.stored(project)
            if len(stored.spans) >= count or time.monotonic() > deadline:
                assert len(stored.spans) == count, (
                    f"Phoenix holds {len(stored.spans)} spans in {project!r} after {within_s} s, expected {count}; "
                    f"projects {stored.projects}")
                return stored


def _own_env() -> dict[str, str]:
    """The caller's environment without its Phoenix and OpenTelemetry settings (an API key, another endpoint)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def phoenix_server(workdir: Path, python: str | None = None) -> Iterator[Phoenix]:
    """Serve Phoenix from its venv on free loopback ports, SQLite in ``workdir``, until the block ends."""
    python = python or phoenix_python()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = _own_env()
    env.update(QUIET, PHOENIX_WORKING_DIR=str(workdir), PHOENIX_HOST="127.0.0.1", PHOENIX_PORT=str(port),
               PHOENIX_GRPC_PORT=str(free_port()))
    log = workdir / "phoenix.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], env=env, cwd=workdir,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while not _ready(url):
            try:
                code = proc.wait(timeout=0.2)  # the pause between polls, and a check that it still runs
            except subprocess.TimeoutExpired:
                assert time.monotonic() < deadline, f"Phoenix not ready within {READY_WITHIN_S} s:\n{_tail(log)}"
                continue
            raise AssertionError(f"Phoenix exited ({code}) before it was ready:\n{_tail(log)}")
        yield Phoenix(url=url, python=python)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
