"""What a stopped ``hx evolve`` or ``hx coevolve`` says last: what its ledger keeps, and the command that resumes it.

The ledger is read (its one fold, ``projections.ledger``) as the command stops, not guessed
from memory: ``on_stop`` reads it when the run is cancelled (Ctrl-C, SIGTERM), and the note
says what is decided and what the next round already recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import nats.errors

from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from projections.ledger_records import RoundRecords
from schemas.errors import HxError
from streams.connection import Connection

STOP_READ_S = 10.0
"""How long a stopping command waits to read its ledger for the note (a second SIGTERM ends it at once)."""


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _counted(n: int, one: str, many: str) -> list[str]:
    return [] if not n else [f"1 {one}" if n == 1 else f"{n} {many}"]


def round_parts(rnd: RoundRecords) -> list[str]:
    """What a round not yet decided has recorded, in the order the loop records it."""
    ships = sum(s.kind == "ship" for s in rnd.ships)
    return [*(["model change"] if rnd.model else []), *(["digest"] if rnd.digested else []),
            *(["plan"] if rnd.landscape else []), *_counted(len(rnd.proposed), "candidate", "candidates"),
            *_counted(len(rnd.revised), "revision", "revisions"), *(["critic's verdict"] if rnd.critic else []),
            *_counted(len(rnd.approvals), "approval request", "approval requests"),
            *_counted(len(rnd.gates), "gate verdict", "gate verdicts"), *_counted(ships, "ship", "ships"),
            *_counted(len(rnd.ships) - ships, "fork", "forks"),
            *_counted(len(rnd.retired), "retired variant", "retired variants")]


def ledger_holds(ledger: RunLedger) -> str:
    """What an unfinished run's ledger keeps, in words: held-out scores, rounds decided, the next round's records."""
    decided = sorted(ledger.decisions)
    upcoming = decided[-1] + 1 if decided else 0
    when = [f"after round {r}" if r >= 0 else "before round 0" for r in sorted({h.round for h in ledger.heldout})]
    kept = [f"the held-out scores ({', '.join(when)})" if len(when) > 1 else f"the held-out score {when[0]}"
            ] if when else []
    if decided:
        kept.append(f"rounds 0..{decided[-1]} decided" if decided[-1] else "round 0 decided")
    rnd = ledger.rounds.get(upcoming)
    parts = round_parts(rnd) if rnd is not None else []
    if parts:
        kept.append(f"round {upcoming}'s {_and(parts)}")
    return _and(kept) if kept else "nothing of round 0 yet"


@dataclass
class StopNote:
    """What a stopped ``hx evolve`` (Ctrl-C, SIGTERM) says on stderr: what its ledger keeps and how to resume."""

    run_id: str
    command: str
    """``hx evolve`` or ``hx coevolve``: the command that resumes the run."""
    ledger: RunLedger | None = None
    read: bool = False
    """Whether the ledger was read (``ledger`` None then means the run has no ledger)."""

    async def read_ledger(self, conn: Connection) -> None:
        """Read the run's ledger as it stands now; on failure the note says it could not."""
        try:
            self.ledger = await asyncio.wait_for(read_run_ledger(conn.log, self.run_id), STOP_READ_S)
            self.read = True
        except (HxError, nats.errors.Error, TimeoutError):
            self.read = False  # the note then says so rather than guess

    def line(self, why: str) -> str:
        """The one line: ``stopped by <why>: the ledger of RUN keeps ...; resume with: hx evolve --resume RUN``."""
        resume = f"resume with: {self.command} --resume {self.run_id}"
        if not self.read:
            return (f"stopped by {why}; the ledger of {self.run_id} could not be read (`hx ledger {self.run_id}` "
                    f"shows what it keeps); {resume}")
        if self.ledger is None:
            return f"stopped by {why} before run {self.run_id} opened its ledger: nothing to resume"
        finished = self.ledger.finished
        if finished is not None:
            return (f"stopped by {why} after run {self.run_id} finished ({finished.rounds} round(s) on its ledger): "
                    "nothing to resume")
        return f"stopped by {why}: the ledger of {self.run_id} keeps {ledger_holds(self.ledger)}; {resume}"


@contextlib.asynccontextmanager
async def on_stop(conn: Connection, note: StopNote) -> AsyncIterator[None]:
    """On Ctrl-C or SIGTERM (a cancellation), read what the ledger keeps into ``note``, then go on stopping."""
    try:
        yield
    except asyncio.CancelledError:
        if conn.log.gone is None:  # a server that died has nothing to read from: its own error line says so
            await note.read_ledger(conn)
        raise
