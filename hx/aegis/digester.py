"""The Digester: a round's attempts compressed into one ``TaskDigest`` per task, and the round's actionability.

Deterministic: each task's digest holds its pass@k state, the category of its failing
attempts (``taxonomy``; the most frequent, ties broken by the taxonomy's order), the
processors implicated (those that acted on its attempts, interrupting ones first), up to
three evidence anchors (log positions showing the failure), the mean trace features, and
its continuity with the task's earlier rounds (persistent failure, newly failing,
recovered, flaky). Actionability ``a_t`` is the share of the round's tasks that failed for
a reason a harness can address (anything but infrastructure); below ``alpha`` the round
ends as a no-op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from itertools import pairwise
from statistics import fmean

import msgspec

from hx.aegis.evidence import AttemptFacts
from hx.aegis.taxonomy import categorise, features
from hx.gate.rule import cluster_of
from schemas.edits import Anchor
from schemas.landscape import FAILURE_CATEGORIES, Continuity, TaskDigest

MAX_ANCHORS = 3
_ANCHOR_ORDER = ("interrupt", "refused", "invalid", "finished")


def continuity(history: Sequence[bool], solved: bool) -> Continuity:
    """A task's continuity from its earlier pass@k states (oldest first) and this round's."""
    if not history:
        return "solved" if solved else "new"
    states = [*history[-3:], solved]
    if len(states) >= 4 and sum(a != b for a, b in pairwise(states)) >= 2:
        return "flaky"
    last = history[-1]
    if solved:
        return "solved" if last else "recovered"
    return "newly_failing" if last else "persistent_failure"


def _category(facts: Sequence[AttemptFacts]) -> str:
    counts = Counter(c for c in (categorise(f) for f in facts) if c is not None)
    if not counts:
        return ""
    return min(counts, key=lambda c: (-counts[c], FAILURE_CATEGORIES.index(c)))


def _implicated(facts: Sequence[AttemptFacts]) -> tuple[str, ...]:
    interrupting = dict.fromkeys(group for f in facts for group, _ in f.interrupts)
    triggered: Counter[str] = Counter()
    for f in facts:
        triggered.update(f.triggers)
    return tuple(dict.fromkeys([*interrupting, *(g for g, _ in triggered.most_common())]))


def _anchors(facts: Sequence[AttemptFacts]) -> tuple[Anchor, ...]:
    out: list[Anchor] = []
    for what in _ANCHOR_ORDER:
        for f in facts:
            if not f.passed and what in f.anchors and len(out) < MAX_ANCHORS:
                out.append(f.anchors[what])
    return tuple(out)


def digest_task(task: str, facts: Sequence[AttemptFacts], variant: str, history: Sequence[bool]) -> TaskDigest:
    """The digest of one task from its attempts of the round."""
    passes = sum(f.passed for f in facts)
    feats = [features(f) for f in facts]
    means = {k: round(fmean(f[k] for f in feats), 4) for k in feats[0]} if feats else {}
    failing = [f for f in facts if not f.passed]
    return TaskDigest(task=task, cluster=cluster_of(task), variant=variant, attempts=len(facts), passes=passes,
                      category=_category(failing) if not passes else "", implicated=_implicated(facts),
                      evidence=_anchors(facts) if not passes else (), continuity=continuity(history, passes > 0),
                      features=means)


def digest_round(facts: Iterable[AttemptFacts], variants: Mapping[str, str],
                 history: Mapping[str, Sequence[bool]]) -> tuple[TaskDigest, ...]:
    """One digest per task of the round, sorted by task id (``variants``: task -> variant it ran under)."""
    by_task: dict[str, list[AttemptFacts]] = {}
    for f in facts:
        by_task.setdefault(f.task, []).append(f)
    return tuple(digest_task(t, sorted(fs, key=lambda f: f.attempt), variants.get(t, "v0"), history.get(t, ()))
                 for t, fs in sorted(by_task.items()))


def actionability(digests: Sequence[TaskDigest]) -> float:
    """The share of tasks that failed for a reason the harness can address (not infrastructure)."""
    if not digests:
        return 0.0
    return sum(1 for d in digests if not d.solved and d.category not in ("", "infrastructure")) / len(digests)


ProseWriter = Callable[[Sequence[TaskDigest], int], Awaitable[Mapping[str, str]]]
"""An optional LLM pass over a round's digests: task -> a prose summary (the deterministic fields stay as they are)."""


def with_prose(digests: Sequence[TaskDigest], prose: Mapping[str, str]) -> tuple[TaskDigest, ...]:
    """The digests with the LLM's summaries filled in where it gave one."""
    return tuple(msgspec.structs.replace(d, summary=prose[d.task]) if prose.get(d.task) else d for d in digests)
