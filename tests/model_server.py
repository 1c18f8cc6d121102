"""A loopback stand-in for an OpenAI-compatible model server (no real one can run here).

``play`` answers every chat-completions request the way a dull but valid policy would: a
tool call choosing the first action the ``act`` tool enumerates. ``refuse`` answers 401
and, as real servers do in their error text, echoes the credentials it was sent: the
test then checks they appear nowhere hx writes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol

Mode = Literal["play", "refuse"]


@dataclass
class ModelServer:
    """What the server saw: the Authorization header and the path (with its query) of each request."""

    url: str = ""
    authorizations: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    """A completion calling ``act`` with its first enumerated action (or stopping when there is none)."""
    for tool in request.get("tools") or ():
        function = tool.get("function") or {}
        action = ((function.get("parameters") or {}).get("properties") or {}).get("action") or {}
        if function.get("name") == "act" and action.get("enum"):
            call = {"id": "call_0", "type": "function",
                    "function": {"name": "act", "arguments": json.dumps({"action": action["enum"][0]})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return {"model": "stand-in", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    message = {"role": "assistant", "content": "done"}
    return {"model": "stand-in", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


class RecordedReplies(BaseHTTPRequestHandler):
    """A request handler that answers with bytes it is given and keeps the test's output quiet."""

    def reply(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Send one response: status, headers (JSON unless told otherwise), a content length, the body."""
        self.send_response(status)
        for name, value in (headers or {"content-type": "application/json"}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: the tests assert on what was sent, not on access logs."""


@contextmanager
def model_server(mode: Mode, latency_s: float = 0.0) -> Iterator[ModelServer]:
    """Serve chat completions on a free loopback port until the block ends, each answer ``latency_s`` late."""
    seen = ModelServer()

    class Handler(RecordedReplies):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            auth = self.headers.get("authorization", "")
            seen.authorizations.append(auth)
            seen.paths.append(self.path)
            if latency_s:
                time.sleep(latency_s)  # the model's own latency, which span and event times must show
            if mode == "play":
                status, body = 200, _answer(json.loads(raw))
            else:
                sent = base64.b64decode(auth.removeprefix("Basic ")).decode() if auth.startswith("Basic ") else auth
                status, body = 401, {"error": {"message": f"invalid credentials {sent!r}"}}
            self.reply(status, json.dumps(body).encode())

    with serving(Handler) as url:
        seen.url = url.removeprefix("http://")
        yield seen


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on a free loopback port until the block ends; yield ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    # A short poll interval: shutdown() waits for the serving loop's next poll.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class Replayer(Protocol):
    """What ``replaying`` serves: the next recorded answer for a request, and where it is served."""

    url: str

    def next(self, request: Any) -> dict[str, Any]:
        """The recorded answer (status, headers, body) to ``request``."""


@contextmanager
def replaying(recorded: Replayer) -> Iterator[str]:
    """Serve ``recorded``'s answers to POSTed requests on loopback (``recorded.url`` set) until the block ends."""

    class Handler(RecordedReplies):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            answer = recorded.next(json.loads(raw or b"null"))
            self.reply(answer["status"], json.dumps(answer["body"]).encode(), answer["headers"])

    with serving(Handler) as url:
        recorded.url = url
        yield url
