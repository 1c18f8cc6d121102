"""TaskHistory: per task and round, pass or fail of each attempt, and pass@k."""

from __future__ import annotations

from math import comb
from typing import ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` attempts with ``c`` passes (Chen et al., 2021).

    The probability that at least one of ``k`` attempts drawn without replacement from
    the ``n`` passes; attempts ended by infrastructure failures count as failures.
    """
    if k <= 0 or n <= 0:
        raise ValueError(f"pass@k needs n > 0 and k > 0, got n={n}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs between 0 and n={n} passes, got c={c}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


class TaskRound(msgspec.Struct):
    """One task in one round of one run: the verdict of each attempt."""

    run: str
    round: int
    task: str
    attempts: dict[str, bool] = {}
    """Attempt number (as text: canonical encoding sorts str keys only) to passed."""
    infra_attempts: list[str] = []
    """Attempts whose current verdict is an infrastructure failure (counted as failed)."""

    @property
    def infra_failures(self) -> int:
        """Attempts that ended in an infrastructure failure."""
        return len(self.infra_attempts)

    @property
    def n(self) -> int:
        """Attempts finished."""
        return len(self.attempts)

    @property
    def passes(self) -> int:
        """Attempts that passed."""
        return sum(self.attempts.values())

    def pass_at(self, k: int) -> float:
        """Unbiased pass@k of this task in this round."""
        return pass_at_k(self.n, self.passes, k)

    @property
    def solved(self) -> bool:
        """True when any attempt passed."""
        return self.passes > 0


def round_key(run: str, round: int, task: str) -> str:
    """The task history's key of one task in one round."""
    return f"{run}/{round}/{task}"


class TaskHistory(Projection[dict[str, TaskRound]]):
    """Per task and round: pass/fail per attempt, the input to pass@k and regression checks."""

    name: ClassVar[str] = "task_history"
    reads = frozenset({AttemptFinished.TYPE})
    state_type = dict[str, TaskRound]

    def initial(self) -> dict[str, TaskRound]:
        """No attempts yet."""
        return {}

    def fold(self, state: dict[str, TaskRound], record: Record) -> dict[str, TaskRound]:
        """Record an attempt's verdict; a repeated verdict for the same attempt replaces the old one."""
        event = record.event
        if not isinstance(event, AttemptFinished):
            return state
        key = round_key(event.run_id, event.round, event.task_id)
        entry = state.get(key)
        if entry is None:
            entry = state[key] = TaskRound(event.run_id, event.round, event.task_id)
        infra = event.status == "infra_failure"
        attempt = str(event.attempt)
        # A replaced verdict also replaces its infra-failure mark, so the count stays true.
        if infra and attempt not in entry.infra_attempts:
            entry.infra_attempts.append(attempt)
        elif not infra and attempt in entry.infra_attempts:
            entry.infra_attempts.remove(attempt)
        entry.attempts[attempt] = event.passed and not infra
        return state

    @staticmethod
    def rounds_of(state: dict[str, TaskRound], run: str, round: int) -> list[TaskRound]:
        """Every task of one round, sorted by task id."""
        return sorted((t for t in state.values() if t.run == run and t.round == round), key=lambda t: t.task)
