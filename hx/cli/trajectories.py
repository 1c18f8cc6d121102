"""``hx export --trajectories``: each main-rollout attempt as one file, its conversation written once.

A step's conversation appears in up to seven events (the step_start, before_model and step_end
hook records, as emitted and as returned, and the model request), each mostly the one before.
Written in full, an attempt's file grows with the square of its length (7 MB for one 100-step
attempt). So a file ``R<n>/trajectories/TASK.ATTEMPT.jsonl`` holds, as JSON lines:

- first, one ``conversation`` line: ``{"type": "conversation", "subject": S, "messages": [...]}``,
  every message of the attempt's conversations once, in the order the attempt first used them;
- then one line per event, in log order, as ``hx log dump`` writes it, except that each
  conversation (``event.messages`` of a ``model.request``, ``event.event.messages`` of a ``hook``
  record) is a reference ``{"spans": [[start, stop], ...]}``: the conversation is
  ``messages[start:stop]`` of the conversation line, span after span.

``read_trajectory`` puts the conversations back. A ``messages`` that is a list is the conversation
itself: an event whose conversation could not be resolved from the log (it keeps the log's
``history``), or one read after its attempt's file was written (none in practice).

>>> lines = [b'{"type":"conversation","subject":"s","messages":[{"role":"user","content":"hi"}]}',
...          b'{"seq":7,"index":0,"subject":"s","type":"model.request","event":{"messages":{"spans":[[0,1]]}}}']
>>> [line["event"]["messages"] for line in read_trajectory(lines)]
[[{'role': 'user', 'content': 'hi'}]]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from hx.cli._app import iso_time
from hx.cli.log import DumpLine, json_line
from hx.environments.splits import round_roles
from hx.report.export_rounds import trajectory_name
from projections.ledger import RunLedger
from schemas.envelope import Record
from schemas.history import conversation, packed, resolve_async
from schemas.hooks import HookRecord
from schemas.lifecycle import AttemptFinished
from schemas.messages import Message
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter

CONVERSATION = "conversation"
"""The ``type`` of a trajectory file's first line, the attempt's messages."""

_replace = msgspec.structs.replace
_json = msgspec.json.Encoder()


class ConversationLine(msgspec.Struct, frozen=True):
    """The first line of a trajectory file: each message of the attempt, once, in order of first use."""

    type: str
    """Always ``conversation``."""
    subject: str
    """The attempt's trace subject."""
    messages: tuple[Message, ...]
    """The messages the event lines' ``{"spans": ...}`` references index into."""


class Spans(msgspec.Struct, frozen=True):
    """A conversation as a reference: ``messages[start:stop]`` of the conversation line, span after span."""

    spans: list[list[int]]


class AttemptFile:
    """One attempt's file in the making: its message table and its event lines, written when the attempt ends."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.messages: list[Message] = []
        self._index: dict[int, int] = {}
        """id(message) -> its place in ``messages``, which keeps every such message alive (no id is reused)."""
        self.lines: list[bytes] = []
        self._last: tuple[tuple[Message, ...], list[list[int]]] = ((), [])
        """The last conversation and its spans."""

    def add(self, record: Record) -> None:
        """Keep ``record`` as a line, its conversation (if any) as a reference into the table."""
        messages = conversation(record.event)
        if messages is None or packed(record.event) is not None:
            self.lines.append(json_line(record))  # no conversation, or one the log could not give back
            return
        self.lines.append(_referring_line(record, Spans(self.spans(messages))))

    def spans(self, messages: tuple[Message, ...]) -> list[list[int]]:
        """``messages`` as spans of the table, adding the messages it has not seen.

        Messages are matched by identity: a resolved conversation reuses its predecessor's message
        objects wherever the log stored a span, so a growing conversation is one span, and the table
        holds at most what the log holds.
        """
        last, n = self._last, len(self._last[0])
        if n and len(messages) >= n and messages[:n] == last[0]:
            # The common case (the last conversation, or it plus new messages), compared in C: tuple
            # equality tests identity before ==, and resolved conversations share their message objects.
            out = [list(span) for span in last[1]]
            rest = messages[n:]
        else:
            out, rest = [], messages
        out = self._extend(out, rest)
        self._last = (messages, out)
        return out

    def _extend(self, out: list[list[int]], messages: tuple[Message, ...]) -> list[list[int]]:
        index, table = self._index, self.messages
        for m in messages:
            i = index.get(id(m))
            if i is None:
                i = index[id(m)] = len(table)
                table.append(m)
            if out and out[-1][1] == i:
                out[-1][1] = i + 1
            else:
                out.append([i, i + 1])
        return out

    def content(self) -> bytes:
        """The file: the conversation line, then the event lines."""
        head = _json.encode(ConversationLine(CONVERSATION, self.subject, tuple(self.messages))) + b"\n"
        return head + b"".join(self.lines)


def _referring_line(record: Record, ref: Spans) -> bytes:
    """``record`` as ``json_line`` writes it, its conversation replaced by ``ref``."""
    event = record.event
    if type(event) is HookRecord:
        body = msgspec.to_builtins(_replace(event, event=_replace(event.event, messages=())))
        body["event"]["messages"] = ref
    else:
        body = msgspec.to_builtins(_replace(event, messages=()))
        body["messages"] = ref
    line = DumpLine(record.seq, record.index, record.subject, record.type, record.version,
                    iso_time(record.time_ns), body, record.took_ns / 1e6 if record.took_ns else None)
    return _json.encode(line) + b"\n"


class TrajectoryFiles:
    """The trajectory files of one folder: each written whole when its attempt finishes (or at ``close``).

    Only the attempts in flight on the log are held (about the rollout's concurrency), each
    about the size of its file.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pending: dict[Path, AttemptFile] = {}
        self.written: set[Path] = set()

    def add(self, path: Path, record: Record) -> None:
        """Add ``record`` to the file at ``path``; write the file when ``record`` ends its attempt."""
        if path in self.written:
            # read after its file was written (none in practice): appended with its conversation in full
            with path.open("ab") as f:
                f.write(json_line(record))
            return
        attempt = self.pending.get(path)
        if attempt is None:
            attempt = self.pending[path] = AttemptFile(record.subject)
        attempt.add(record)
        if isinstance(record.event, AttemptFinished):
            self._write(path)

    def close(self) -> None:
        """Write the files of attempts that never finished on the log."""
        for path in list(self.pending):
            self._write(path)

    def _write(self, path: Path) -> None:
        attempt = self.pending.pop(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(attempt.content())
        self.written.add(path)


async def write_trajectories(log: EventLog, run_id: str, ledger: RunLedger,
                             root: Path) -> dict[int, dict[str, list[str]]]:
    """Each round's main-rollout attempts as trajectory files under ``root/R<n>/trajectories/``; round -> task -> files.

    Reads only the subjects of the trace rounds the round's digest names (and the
    round-level ``round.started`` events, to keep the main rollouts), in log order, with
    every conversation resolved and then written once per attempt (see the module).
    """
    roles = await round_roles(log, run_id)
    out: dict[int, dict[str, list[str]]] = {}
    for digested in (r.digested for r in ledger.ordered() if r.digested is not None):
        rounds = [t for t in digested.trace_rounds if t in roles and roles[t].purpose == "main"]
        if not rounds:
            continue
        folder = root / f"R{digested.round}" / "trajectories"
        found: dict[str, set[int]] = {}
        files = TrajectoryFiles(folder)
        reads = log.read(TRACE.name, subjects=[trace_filter(run_id, t) for t in rounds])
        async for record in resolve_async(reads, strict=False):
            addr = TraceAddress.parse(record.subject)
            if addr.task is None or addr.attempt is None:
                continue
            files.add(folder / trajectory_name(addr.task, addr.attempt), record)
            found.setdefault(addr.task, set()).add(addr.attempt)
        files.close()
        out[digested.round] = {task: [trajectory_name(task, a) for a in sorted(attempts)]
                               for task, attempts in sorted(found.items())}
    return out


def read_trajectory(lines: Iterable[bytes | str]) -> Iterator[dict[str, Any]]:
    """The event lines of a trajectory file (its lines, in order) with every conversation in full.

    Each line comes out as ``hx log dump`` writes the event, as a dict; the conversation line is
    consumed, not yielded.
    """
    table: list[Any] = []
    for raw in lines:
        line = msgspec.json.decode(raw)
        if line.get("type") == CONVERSATION:
            table = line["messages"]
            continue
        holder = line.get("event")
        if line.get("type") == HookRecord.TYPE and isinstance(holder, dict):
            holder = holder.get("event")  # a hook record's conversation is in its hook event
        if isinstance(holder, dict) and isinstance(ref := holder.get("messages"), dict):
            holder["messages"] = [m for start, stop in ref["spans"] for m in table[start:stop]]
        yield line
