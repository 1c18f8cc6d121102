"""Splits: adaptation and held-out task ids kept apart, and the only reader evolution may use.

Every round of a run is tagged with a role, ``adaptation`` or ``heldout``
(``RoundStarted.split``). Evolution (AEGIS) reads task history only through
``adaptation_history``, which reads nothing but adaptation rounds and never returns a task
that any held-out round of the run evaluated; a held-out split is run only through
``hx.environments.heldout.evaluate_heldout``, which hands back aggregate scores and no per-task detail.

>>> Splits(adaptation=("mybench:game:dev:0",), heldout=("mybench:game:test:0",)).role_of("mybench:game:test:0")
'heldout'
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from hx.environments.errors import SplitViolation
from hx.environments.registry import TaskId
from projections.runner import ProjectionRunner
from projections.task_history import TaskHistory, TaskRound
from schemas.lifecycle import AttemptFinished, RoundStarted
from streams.log import EventLog
from streams.topology import NO_TOKEN, TRACE, subject_token, trace_filter

SplitRole = Literal["adaptation", "heldout"]
ROLES: tuple[SplitRole, ...] = ("adaptation", "heldout")


def _ids(values: Iterable[TaskId | str], what: str) -> tuple[str, ...]:
    out = tuple(str(v) for v in values)
    if len(set(out)) != len(out):
        dupe = next(t for i, t in enumerate(out) if t in out[:i])
        raise SplitViolation(f"the {what} split lists task {dupe!r} more than once")
    return out


@dataclass(frozen=True)
class Splits:
    """Adaptation and held-out task ids, disjoint by construction.

    Evolution may look at the adaptation split; the held-out split is frozen and only
    ever evaluated (``evaluate_heldout``). ``heldout_digest`` names the held-out set, so
    a later run can show it evaluated the very same tasks.
    """

    adaptation: tuple[str, ...]
    heldout: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        adaptation = _ids(self.adaptation, "adaptation")
        heldout = _ids(self.heldout, "held-out")
        shared = sorted(set(adaptation) & set(heldout))
        if shared:
            raise SplitViolation(f"{len(shared)} task id(s) are in both the adaptation and the held-out split, "
                                 f"e.g. {shared[0]!r}: a held-out task must never be shown to evolution")
        object.__setattr__(self, "adaptation", adaptation)
        object.__setattr__(self, "heldout", heldout)

    @classmethod
    def of(cls, adaptation: Iterable[TaskId | str], heldout: Iterable[TaskId | str] = ()) -> Splits:
        """Splits from task ids or ``TaskId`` values; raises ``SplitViolation`` on any overlap."""
        return cls(tuple(str(t) for t in adaptation), tuple(str(t) for t in heldout))

    def role_of(self, task_id: TaskId | str) -> SplitRole | None:
        """Which split a task belongs to (None: neither)."""
        text = str(task_id)
        if text in self.heldout:
            return "heldout"
        return "adaptation" if text in self.adaptation else None

    def check(self, task_ids: Iterable[str], role: SplitRole) -> None:
        """Refuse a round of ``role`` over any task outside that role's split."""
        allowed = set(self.adaptation if role == "adaptation" else self.heldout)
        stray = [t for t in task_ids if t not in allowed]
        if stray:
            where = self.role_of(stray[0]) or "no split"
            raise SplitViolation(f"a {role} round may only run {role} tasks; {len(stray)} are not, "
                                 f"e.g. {stray[0]!r} ({where})")

    @property
    def heldout_digest(self) -> str:
        """sha256 over the sorted held-out task ids."""
        return "sha256:" + hashlib.sha256("\n".join(sorted(self.heldout)).encode()).hexdigest()




def _round_level_filter(run_id: str) -> str:
    return f"hx.trace.{subject_token(run_id)}.*.{NO_TOKEN}.{NO_TOKEN}"


async def round_roles(log: EventLog, run_id: str) -> dict[int, RoundStarted]:
    """The ``RoundStarted`` of each round of a run (its role is ``split``)."""
    rounds: dict[int, RoundStarted] = {}
    async for record in log.read(TRACE.name, subjects=[_round_level_filter(run_id)], types=[RoundStarted.TYPE]):
        event = record.event
        if isinstance(event, RoundStarted) and event.run_id == run_id:
            rounds.setdefault(event.round, event)
    return rounds


async def adaptation_history(log: EventLog, run_id: str) -> list[TaskRound]:
    """Task history of a run's adaptation rounds only: what evolution may read.

    Reads only the subjects of rounds tagged ``adaptation``; a task that any held-out
    round of the run evaluated is left out even if an adaptation round listed it, so
    nothing that edits the harness ever sees a held-out verdict.
    """
    rounds = await round_roles(log, run_id)
    adaptation = sorted(r for r, ev in rounds.items() if ev.split == "adaptation")
    heldout = {t for ev in rounds.values() if ev.split == "heldout" for t in ev.task_ids}
    if not adaptation:
        return []
    runner: ProjectionRunner[dict[str, TaskRound]] = ProjectionRunner(log, TaskHistory())
    subjects = [trace_filter(run_id, r) for r in adaptation]
    async for record in log.read(TRACE.name, subjects=subjects, types=[AttemptFinished.TYPE]):
        runner.apply(record)
    allowed = {r: set(rounds[r].task_ids) for r in adaptation}
    return sorted((tr for tr in runner.state.values()
                   if tr.run == run_id and tr.round in allowed and tr.task in allowed[tr.round]
                   and tr.task not in heldout), key=lambda tr: (tr.round, tr.task))


