"""Evidence: the facts of a round's attempts, read from the trace, and only from adaptation rounds.

Every stage of AEGIS sees the log through ``Evidence``: it reads the trace rounds it is
given, checks each is an adaptation round of the run (``RoundStarted.split``), and
raises ``HeldoutAccess`` for any other, so the frozen held-out split cannot reach a stage
even by mistake. Reading costs what is read: one subject filter per trace round, and
only the event types the facts need.

``AttemptFacts`` keeps what the taxonomy and the digester need of one attempt: its
verdict, the actions and (hashed) observations in order, the score path, refusals and
invalid actions, which processors acted on it, and evidence anchors (log positions).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from hx.aegis.errors import HeldoutAccess
from hx.environments.splits import round_roles
from schemas.edits import Anchor
from schemas.envelope import Record
from schemas.hooks import ProcessorTriggered
from schemas.lifecycle import AttemptFinished, AttemptStarted, RoundStarted
from schemas.tools import EnvObservation, ToolInvoked
from streams.log import EventLog
from streams.topology import TRACE, TraceAddress, trace_filter

REFUSAL = re.compile(r"\b(?:can't|cannot|can not|already|nothing happens|not possible|don't see|do not see|"
                     r"no such|not able|unable|don't understand|you see no)\b", re.IGNORECASE)
"""Generic English phrasing of an environment refusing an action (the taxonomy's ``refused``)."""
FACT_TYPES = (AttemptStarted.TYPE, AttemptFinished.TYPE, EnvObservation.TYPE, ToolInvoked.TYPE,
              ProcessorTriggered.TYPE)


def _digest(text: str) -> str:
    return hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=8).hexdigest()


@dataclass
class AttemptFacts:
    """One attempt as the taxonomy sees it."""

    task: str
    attempt: int
    trace_round: int
    harness_digest: str = ""
    passed: bool = False
    status: str = ""
    steps: int = 0
    reason: str = ""
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    """Digests of the normalised observation after each action (the first: the task's opening)."""
    scores: list[float] = field(default_factory=list)
    refused: int = 0
    invalid: int = 0
    env_done: bool = False
    env_failure: bool = False
    triggers: Counter[str] = field(default_factory=Counter)
    """Singleton group -> how often it changed, split or intercepted an event."""
    interrupts: list[tuple[str, str]] = field(default_factory=list)
    """(group, reason) of processors that ended the attempt."""
    anchors: dict[str, Anchor] = field(default_factory=dict)
    """The first log position of each notable thing: ``refused``, ``invalid``, ``interrupt``, ``finished``."""

    def anchor(self, what: str, record: Record, note: str) -> None:
        """Remember the first position showing ``what``."""
        if what not in self.anchors:
            self.anchors[what] = Anchor(seq=record.seq, index=record.index, note=note)


class Evidence:
    """Read access to a run's adaptation rounds, and nothing else."""

    def __init__(self, log: EventLog, run_id: str) -> None:
        self.log = log
        self.run_id = run_id
        self._roles: dict[int, RoundStarted] = {}

    async def check(self, trace_rounds: list[int]) -> None:
        """Raise ``HeldoutAccess`` unless every trace round is an adaptation round of the run."""
        missing = [r for r in trace_rounds if r not in self._roles]
        if missing:
            self._roles = await round_roles(self.log, self.run_id)
        for r in trace_rounds:
            started = self._roles.get(r)
            if started is None:
                raise HeldoutAccess(f"trace round {r} of run {self.run_id!r} does not exist")
            if started.split != "adaptation":
                raise HeldoutAccess(f"trace round {r} of run {self.run_id!r} is a {started.split} round: "
                                    "no AEGIS stage may read it")

    async def records(self, trace_rounds: list[int], types: tuple[str, ...]
                      ) -> AsyncIterator[tuple[tuple[int, str, int], Record]]:
        """Each record of ``types`` on the given adaptation trace rounds, in log order, with its attempt's
        (trace round, task, attempt) (``HeldoutAccess`` for any other round)."""
        await self.check(trace_rounds)
        subjects = [trace_filter(self.run_id, r) for r in trace_rounds]
        if not subjects:
            return
        async for record in self.log.read(TRACE.name, subjects=subjects, types=types):
            addr = TraceAddress.parse(record.subject)
            if addr.round is not None and addr.task is not None and addr.attempt is not None:
                yield (addr.round, addr.task, addr.attempt), record

    async def attempts(self, trace_rounds: list[int]) -> list[AttemptFacts]:
        """The facts of every attempt of the given adaptation trace rounds, in log order."""
        facts: dict[tuple[int, str, int], AttemptFacts] = {}
        async for key, record in self.records(trace_rounds, FACT_TYPES):
            fact = facts.get(key)
            if fact is None:
                fact = facts[key] = AttemptFacts(key[1], key[2], key[0])
            _fold(fact, record)
        return list(facts.values())


def _fold(fact: AttemptFacts, record: Record) -> None:
    event = record.event
    if isinstance(event, EnvObservation):
        fact.observations.append(_digest(event.observation))
        fact.scores.append(event.score)
        fact.env_done = fact.env_done or event.done
        fact.env_failure = fact.env_failure or event.failure
        if event.info.get("invalid"):
            fact.invalid += 1
            fact.anchor("invalid", record, f"step {event.step}: an action outside the offered ones")
        if event.step and REFUSAL.search(event.observation):
            fact.refused += 1
            fact.anchor("refused", record, f"step {event.step}: {event.observation.strip()[:80]}")
    elif isinstance(event, ToolInvoked):
        values = list(event.call.input.values())
        fact.actions.append(values[0] if len(values) == 1 and isinstance(values[0], str) else
                            f"{event.call.name}({sorted(event.call.input.items())})")
    elif isinstance(event, ProcessorTriggered):
        if event.action == "interrupted":
            fact.interrupts.append((event.group, event.reason))
            fact.anchor("interrupt", record, f"{event.group} at {event.hook}: {event.reason[:80]}")
        else:
            fact.triggers[event.group] += 1
    elif isinstance(event, AttemptStarted):
        fact.harness_digest = event.harness_digest
    elif isinstance(event, AttemptFinished):
        fact.passed, fact.status, fact.steps, fact.reason = event.passed, event.status, event.steps, event.reason
        fact.anchor("finished", record, f"{event.status} after {event.steps} steps")
