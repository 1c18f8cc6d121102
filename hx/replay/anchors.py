"""Evidence anchors resolved: what a candidate's cited trace events are, fetched one message at a time.

``AnchorResolver`` turns an evidence ``Anchor`` (a message sequence and an index in its
frame on ``HX_TRACE``) into the trace event it points to by fetching exactly that message
(one direct get per distinct sequence, cached), never by reading the trace stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from nats.js.errors import NotFoundError

from schemas.edits import Anchor
from schemas.envelope import OpenedMessage
from schemas.errors import DecodeError
from schemas.event import Event
from schemas.hooks import ProcessorTriggered
from schemas.ledger import CandidateProposed, CandidateRevised, LedgerEvent
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.tools import EnvObservation, ToolInvoked
from streams.channels import attempt_subject
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress

SUMMARY_WIDTH = 100
IN_FLIGHT = 16
"""Trace messages an anchor resolver asks for at once (each a direct get)."""


def anchors_of(event: LedgerEvent) -> tuple[Anchor, ...]:
    """The evidence anchors a candidate's manifest cites (none for other events)."""
    if isinstance(event, CandidateProposed | CandidateRevised):
        return event.manifest.evidence
    return ()


@dataclass(frozen=True)
class ResolvedAnchor:
    """An anchor and what it points to: the trace event's subject, type and a summary, or why it points to nothing."""

    anchor: Anchor
    subject: str = ""
    type: str = ""
    summary: str = ""
    problem: str = ""
    """Empty when resolved; else why the anchor is unresolved."""

    @property
    def resolved(self) -> bool:
        """True when the anchor names an event of the run on ``HX_TRACE``."""
        return not self.problem

    def as_dict(self) -> dict[str, object]:
        """The JSON form ``hx ledger --json`` writes."""
        out: dict[str, object] = {"seq": self.anchor.seq, "index": self.anchor.index, "note": self.anchor.note,
                                  "resolved": self.resolved}
        if self.resolved:
            out |= {"subject": self.subject, "type": self.type, "summary": self.summary}
        else:
            out["problem"] = self.problem
        return out


class AnchorResolver:
    """Resolves anchors of one run by fetching exactly the trace messages they name (each once)."""

    def __init__(self, log: EventLog, run_id: str) -> None:
        self.log = log
        self.run_id = run_id
        self._messages: dict[int, OpenedMessage | str] = {}
        self.fetched = 0
        """Trace messages fetched so far (what the resolution cost)."""

    async def _fetch(self, seq: int) -> None:
        self.fetched += 1
        got: OpenedMessage | str
        try:
            msg = await self.log.js.get_msg(TRACE.name, seq=seq)
            got = OpenedMessage(attempt_subject(msg.subject or ""), seq, msg.headers, msg.data or b"")
        except NotFoundError:
            got = f"no message at sequence {seq} on {TRACE.name}"
        except DecodeError as exc:
            got = f"the message at sequence {seq} does not decode: {exc}"
        self._messages[seq] = got

    async def prefetch(self, seqs: Iterable[int]) -> None:
        """Fetch the messages of ``seqs`` not fetched yet, ``IN_FLIGHT`` requests at a time (a round trip each)."""
        todo = sorted({s for s in seqs if s >= 1 and s not in self._messages})
        for i in range(0, len(todo), IN_FLIGHT):
            await asyncio.gather(*(self._fetch(s) for s in todo[i:i + IN_FLIGHT]))

    async def resolve(self, anchor: Anchor) -> ResolvedAnchor:
        """What ``anchor`` points to, or why it is unresolved."""
        if anchor.seq < 1:
            return ResolvedAnchor(anchor, problem=f"sequence {anchor.seq} is no position on {TRACE.name}")
        if anchor.seq not in self._messages:
            await self._fetch(anchor.seq)
        message = self._messages[anchor.seq]
        if isinstance(message, str):
            return ResolvedAnchor(anchor, problem=message)
        if not 0 <= anchor.index < len(message):
            return ResolvedAnchor(anchor, problem=f"message {anchor.seq} holds {len(message)} event(s): "
                                                  f"no index {anchor.index}")
        try:
            record = message.record(anchor.index)  # only the cited event is decoded, not its frame
        except DecodeError as exc:
            return ResolvedAnchor(anchor, problem=f"event {anchor.index} of message {anchor.seq} does not decode: "
                                                  f"{exc}")
        run = TraceAddress.parse(record.subject).run
        if run != self.run_id:
            return ResolvedAnchor(anchor, problem=f"message {anchor.seq} ({record.subject}) belongs to run "
                                                  f"{run!r}, not {self.run_id!r}")
        return ResolvedAnchor(anchor, record.subject, record.type, summary(record.event))

    async def resolve_all(self, anchors: Iterable[Anchor]) -> list[ResolvedAnchor]:
        """Every anchor resolved, in order (their messages fetched together first)."""
        anchors = list(anchors)
        await self.prefetch(a.seq for a in anchors)
        return [await self.resolve(a) for a in anchors]


def _cut(text: str, width: int = SUMMARY_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(event: Event) -> str:
    """A trace event in a few words: what an auditor needs to see that it is the evidence claimed."""
    if isinstance(event, EnvObservation):
        return _cut(f"step {event.step}: {event.observation}")
    if isinstance(event, ToolInvoked):
        return _cut(f"step {event.step}: {event.call.name} {event.call.input}")
    if isinstance(event, ProcessorTriggered):
        return _cut(f"step {event.step}: {event.group} {event.action} at {event.hook}: {event.reason}")
    if isinstance(event, AttemptFinished):
        return _cut(f"{'passed' if event.passed else 'failed'}: {event.status} after {event.steps} steps "
                    f"{event.reason}".strip())
    if isinstance(event, AttemptStarted):
        return _cut(f"{event.task_id} attempt {event.attempt} under {event.harness_digest[:19]}")
    return _cut(type(event).TYPE)
