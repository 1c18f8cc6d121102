"""A malformed ledger, made by hand on a finished run: every command names the event and what is wrong, and stops.

Three ways a ledger goes bad outside hx: an event published again on the subject of a position
it already has; a well-formed event of another kind (``attempt.finished``) on a ledger subject;
one byte of a JetStream block file of ``HX_LEDGER`` edited (the server then serves that message
to no one, and counts nothing as lost). Each command that reads a run's ledger (the writers
``evolve --resume``, ``approve``, ``export``, ``report``; the readers ``replay --stage``,
``regressions``, ``diff``, ``bisect``, ``ledger``, ``state``; the auditors ``audit verify`` and
``log verify``) exits non-zero, names the event, and writes nothing: no stream grows, no
directory appears. Before this, they raised ``OriginatorVersionError``, ``KeyError`` or
``AttributeError``, or went on silently with part of the ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import toyworld  # noqa: F401 - registers the toyworld benchmark the run evolves on
from hx_cli import hx
from ledger_forger import append, ledger_of

from schemas.ledger import GateJudged
from schemas.lifecycle import AttemptFinished
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import LEDGER, SPECS

RUN = "evo-malformed"
EXIT_NOT_VERIFIED = 3


@dataclass
class Finished:
    """A finished run on a server of its own, which a case may stop and start again."""

    root: Path
    server: NatsProcess
    data: Path

    @property
    def url(self) -> str:
        """The server's URL (it changes when the server starts again)."""
        return self.server.url

    def hx(self, *args: str) -> Any:
        """``hx`` on this run's server and data dir."""
        return hx("--nats-url", self.url, "--data-dir", str(self.data), *args)

    def restart(self) -> None:
        """Stop the server and start it again on the same store."""
        self.server.stop()
        self.server = NatsProcess(self.root / "nats")
        self.server.start(detach=False)


@pytest.fixture
def finished(tmp_path: Path) -> Iterator[Finished]:
    server = NatsProcess(tmp_path / "nats")
    server.start(detach=False)
    run = Finished(tmp_path, server, tmp_path / "data")
    try:
        result = run.hx("evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8",
                        "--heldout-tasks", "2", "--rounds", "2", "--max-steps", "20", "--seed", "3", "--run-id", RUN)
        assert result.exit_code == 0, result.output
        yield run
    finally:
        run.server.stop()


def last_seqs(url: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        async with connect(NatsSettings(url=url), apply=False) as conn:
            return {name: await conn.log.last_seq(name) for name in SPECS}
    return asyncio.run(read())


def republished(run: Finished) -> tuple[int, str]:
    """A gate verdict published again on the subject of its own position."""
    ledger = asyncio.run(ledger_of(run.url, RUN))
    entry = next(e for e in ledger.entries if isinstance(e.event, GateJudged))
    asyncio.run(append(run.url, RUN, entry.event, position=entry.position, prev=entry.event.prev))
    return entry.position, f"event {entry.position} (ledger.gate_judged): written again on the subject of event"


def foreign(run: Finished) -> tuple[int, str]:
    """A well-formed attempt.finished on the subject of the ledger's next position."""
    at = asyncio.run(append(run.url, RUN, AttemptFinished(run_id=RUN, round=0, task_id="toyworld:rooms:dev:0",
                                                          attempt=0, passed=True)))
    return at, f"event {at} (attempt.finished): message"


def damaged(run: Finished) -> tuple[int, str]:
    """One byte of a gate verdict's body edited in HX_LEDGER's block file, the server stopped meanwhile."""
    ledger = asyncio.run(ledger_of(run.url, RUN))
    entry = next(e for e in ledger.entries if isinstance(e.event, GateJudged))

    async def body() -> bytes:
        async with connect(NatsSettings(url=run.url), apply=False) as conn:
            return bytes((await conn.js.get_msg(LEDGER.name, entry.seq)).data or b"")
    data = asyncio.run(body())
    run.server.stop()
    [block] = (run.root / "nats" / "jetstream" / "$G" / "streams" / LEDGER.name / "msgs").glob("*.blk")
    raw = bytearray(block.read_bytes())
    at = raw.find(data)
    assert at >= 0 and raw.find(data, at + 1) < 0
    raw[at + len(data) // 2] ^= 0x01
    block.write_bytes(bytes(raw))
    run.restart()
    return entry.position, f"event {entry.position} missing"


COMMANDS: tuple[tuple[str, ...], ...] = (
    ("evolve", "--resume", RUN), ("approve", RUN, "C-R0-02"), ("export", RUN, "{tmp}/export"),
    ("report", RUN, "--out", "{tmp}/report"), ("replay", RUN, "--stage", "0"), ("regressions", RUN, "--round", "1"),
    ("diff", RUN, "toyworld:rooms:dev:0", "--rounds", "0", "1"),
    ("bisect", RUN, "toyworld:rooms:dev:0", "--from", "0", "--to", "1"), ("ledger", RUN),
    ("state", RUN, "--as-of", "r1"), ("audit", "verify", RUN), ("log", "verify"))


@pytest.mark.slow
@pytest.mark.parametrize("make", [republished, foreign, damaged], ids=["republished", "foreign", "damaged"])
def test_every_command_names_the_bad_event_and_writes_nothing(finished: Finished, tmp_path: Path, make: Any) -> None:
    position, named = make(finished)
    before = last_seqs(finished.url)
    for command in COMMANDS:
        args = [a.format(tmp=tmp_path) for a in command]
        result = finished.hx(*args)
        out = result.stdout + result.stderr
        assert result.exit_code in (1, EXIT_NOT_VERIFIED), (command, out)
        assert "Traceback" not in out and isinstance(result.exception, SystemExit), (command, out)
        assert named in " ".join(out.split()), (command, out)
        if command[0] not in ("audit", "log"):  # the auditors report; every other command is one error line
            assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), (command, out)
    assert last_seqs(finished.url) == before
    assert not (tmp_path / "export").exists() and not (tmp_path / "report").exists()
    assert position > 1
