"""The deterministic gate: ordered checks, first failure wins, every verdict on the ledger.

1. ``manifest``: the manifest says what it does, what it addresses, which tasks flip, on
   what evidence and by which processor's trigger.
2. ``config``: the operations build a valid harness, in canonical form, whose digest is
   the one proposed and differs from the base (a no-op edit is rejected).
3. ``smoke``: new processor code instantiates and runs in a sandboxed subprocess.
4. ``leakage``: no asset of the candidate (parameters, code) holds a task id, two
   consecutive actions of a gold solution, or a verifier's answer.
5. ``counterfactual``: the candidate's processors, replayed over recorded attempts of
   solved tasks (no model, no environment: ``hx.aegis.counterfactual``), change nothing
   that happens while the model's input stays the same.
6. ``seesaw`` (k-aware, per variant): the candidate runs the variant's solved tasks and
   its predicted flips with the seeds of the variant's own rollout (``k`` paired attempts
   each). A solved task that fails all ``k`` is retried on fresh seeds, up to ``2k`` times,
   stopping at the first pass: it *regresses* only if it fails them all. No solved task may
   regress, and the tasks lost on the paired seeds may not outnumber those gained (so the
   next round's rollout, on those seeds, cannot score lower).
7. ``effect``: at least one predicted flip passes.

A candidate that fails only the seesaw yet, in some clusters, gains at least ``FORK_MARGIN``
more tasks than it loses and regresses none becomes a variant of its own under the
ensemble strategy (``fork``) serving those clusters; otherwise it is rejected with the
first failing check. A fork never takes a cluster where a solved task regressed, so it
cannot be a ship that regresses by another name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, Protocol

import msgspec

from hx.aegis.digester import cluster_of
from hx.aegis.operations import strings_in
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from schemas.ledger import CandidateProposed, GateCheck, GateJudged, TaskFlip

Outcome = Literal["ship", "fork", "reject"]
CHECKS = ("manifest", "config", "smoke", "leakage", "counterfactual", "seesaw", "effect")
FORK_MARGIN = 2
"""A fork must gain at least this many more tasks than it loses in a cluster it takes over."""


@dataclass(frozen=True)
class Tries:
    """Fresh attempts of one task: how many ran, how many passed."""

    attempts: int
    passes: int


@dataclass(frozen=True)
class Fresh:
    """The candidate's attempts: on the variant's solved tasks and predicted flips, and the retries of losses."""

    solved: dict[str, Tries]
    """Solved tasks, with the seeds of the variant's own rollout (paired)."""
    flips: dict[str, Tries]
    """Predicted flips, with the same seeds."""
    retries: dict[str, Tries] = field(default_factory=dict)
    """Solved tasks that failed every paired attempt, retried on fresh seeds (stopping at the first pass)."""
    trace_rounds: tuple[int, ...] = ()


class Trials(Protocol):
    """What the gate needs run: replays and fresh attempts (``hx.aegis.trials.Trials`` provides them)."""

    async def counterfactual(self, harness: HarnessConfig, variant: str) -> list[tuple[str, str, str]]:
        """(attempt, ``same``/``diverged``/``changed``, where) for solved attempts replayed under ``harness``."""

    async def fresh(self, harness: HarnessConfig, variant: str, candidate: str, flips: Sequence[str]) -> Fresh:
        """Fresh seeded attempts of the candidate on the variant's solved tasks and its predicted flips."""



class CodeCheck(Protocol):
    """Builds and smoke-tests a candidate that brings new code, in a sandbox (the main process imports none of it)."""

    async def __call__(self, base: HarnessConfig, candidate: CandidateProposed) -> tuple[str, str, str]:
        """(the candidate's digest, why its config does not build or "", why its smoke test failed or "")."""


@dataclass
class Verdict:
    """The gate's verdict on one candidate."""

    checks: list[GateCheck] = field(default_factory=list)
    flips: list[TaskFlip] = field(default_factory=list)
    outcome: Outcome = "reject"
    clusters: tuple[str, ...] = ()
    """For a fork: the clusters the new variant serves."""
    trace_rounds: tuple[int, ...] = ()

    @classmethod
    def of(cls, judged: GateJudged) -> Verdict:
        """The verdict a ``GateJudged`` recorded (a resumed round, an approval answered later)."""
        return cls(list(judged.checks), list(judged.flips), judged.outcome, judged.clusters, judged.trace_rounds)

    @property
    def passed(self) -> bool:
        """True when the candidate ships or forks."""
        return self.outcome != "reject"

    @property
    def first_failure(self) -> str:
        """The name of the first failing check ("" when all passed)."""
        return next((c.name for c in self.checks if not c.passed), "")

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        """Record a check; return whether it passed."""
        self.checks.append(GateCheck(name=name, passed=passed, detail=detail))
        return passed


@dataclass(frozen=True)
class Forbidden:
    """What no candidate asset may contain: task ids, gold-action pairs, verifier answers (lower-cased)."""

    texts: tuple[str, ...]
    """Longest first, then alphabetical: the text a verdict names never depends on the process (hash seeds)."""

    @classmethod
    def of(cls, task_ids: Sequence[str], gold: Sequence[Sequence[str]], answers: Sequence[str]) -> Forbidden:
        """Build the list from the run's tasks (both splits), their gold solutions and answers."""
        texts = {t.lower() for t in task_ids}
        for actions in gold:
            for a, b in pairwise(actions):
                texts.update(f"{a}{sep}{b}".lower() for sep in ("\n", ", ", "; ", " then ", " and "))
        texts.update(a.lower() for a in answers if len(a.strip()) >= 4)
        return cls(tuple(sorted(texts - {""}, key=lambda t: (-len(t), t))))

    def found(self, assets: Sequence[str]) -> str:
        """The longest forbidden text in the first asset that holds one ("" when none)."""
        for asset in assets:
            low = asset.lower()
            for text in self.texts:
                if text in low:
                    return text
        return ""


async def judge(candidate: CandidateProposed, build: Callable[[], HarnessConfig], base: HarnessConfig,
                trials: Trials, forbidden: Forbidden, *, allow_fork: bool, code_check: CodeCheck | None = None,
                sources: Sequence[str] = ()) -> Verdict:
    """Run the checks in order; the first that fails decides (a seesaw failure may still fork).

    ``build`` makes the candidate's harness (``CompositionError`` when it cannot). A
    candidate with new code is first built and smoke-tested by ``code_check`` in a sandbox
    (the ``config`` and ``smoke`` checks): only then may the main process import its code
    and ``build`` it. ``sources`` are its code's texts, for the leakage scan.
    """
    v = Verdict()
    m = candidate.manifest
    missing = [n for n, ok in (("intended effect", m.intended_effect), ("predicted flips", m.predicted_flips),
                               ("evidence", m.evidence), ("attribution", m.attribution)) if not ok]
    if not v.add("manifest", not missing, f"missing: {', '.join(missing)}" if missing else "complete"):
        return v
    harness: HarnessConfig | None = None
    if candidate.code:
        if code_check is None:
            v.add("config", False, "the candidate brings new code and no sandbox is configured to check it")
            return v
        digest, config_error, smoke_error = await code_check(base, candidate)
        if not _config(v, candidate, digest, base, config_error):
            return v
        if not v.add("smoke", not smoke_error, smoke_error or f"{len(candidate.code)} module(s) passed"):
            return v
        harness = build()  # the sandbox vouched for the code: the main process may import it now
    else:
        try:
            harness = build()
        except CompositionError as exc:
            v.add("config", False, candidate.build_error or str(exc))
            return v
        if not _config(v, candidate, harness.digest, base, candidate.build_error):
            return v
        v.add("smoke", True, "no new code")
    assets = [s for op in candidate.operations for s in strings_in(msgspec.to_builtins(op))] + list(sources)
    leak = forbidden.found(assets)
    if not v.add("leakage", not leak, f"an asset holds {leak!r}" if leak else "clean"):
        return v
    replayed = await trials.counterfactual(harness, candidate.variant)
    changed = [(a, where) for a, verdict, where in replayed if verdict == "changed"]
    kept = sum(1 for _, verdict, _ in replayed if verdict == "same")
    if not v.add("counterfactual", not changed,
                 f"{len(changed)} of {len(replayed)} replayed attempts may change outcome, e.g. {changed[0][0]} "
                 f"({changed[0][1]})" if changed else
                 f"{len(replayed)} replayed: {kept} unchanged, {len(replayed) - kept} diverge (the model's input "
                 "changes: no evidence either way)"):
        return v
    return await _seesaw(v, candidate, harness, trials, allow_fork)


def _config(v: Verdict, candidate: CandidateProposed, digest: str, base: HarnessConfig, error: str) -> bool:
    if error or not digest:
        return v.add("config", False, error or "does not build")
    if digest == base.digest:
        return v.add("config", False, "changes nothing: the digest equals the current harness's")
    if digest != candidate.digest:
        return v.add("config", False, f"digest {digest[:19]} differs from the proposed {candidate.digest[:19]}")
    return v.add("config", True, f"normalised, {digest[:19]}")


async def _seesaw(v: Verdict, candidate: CandidateProposed, harness: HarnessConfig, trials: Trials,
                  allow_fork: bool) -> Verdict:
    fresh = await trials.fresh(harness, candidate.variant, candidate.candidate, candidate.manifest.predicted_flips)
    v.trace_rounds = fresh.trace_rounds
    return seesaw(v, fresh, allow_fork=allow_fork)


def seesaw(v: Verdict, fresh: Fresh, *, allow_fork: bool) -> Verdict:
    """The ``seesaw`` and ``effect`` checks (or a fork) from the candidate's fresh attempts: pure, no rollout."""
    lost = sorted(t for t, tries in fresh.solved.items() if tries.passes == 0)
    regressed = [t for t in lost if fresh.retries.get(t, Tries(0, 0)).passes == 0]
    won = sorted(t for t, tries in fresh.flips.items() if tries.passes > 0)
    for t, tries in sorted(fresh.solved.items()):
        more = fresh.retries.get(t, Tries(0, 0))
        v.flips.append(TaskFlip(task=t, before=True, after=tries.passes + more.passes > 0,
                                attempts=tries.attempts + more.attempts, passes=tries.passes + more.passes))
    v.flips += [TaskFlip(task=t, before=False, after=tries.passes > 0, attempts=tries.attempts, passes=tries.passes)
                for t, tries in sorted(fresh.flips.items())]
    holds = not regressed and len(won) >= len(lost)
    detail = (f"{len(regressed)} solved task(s) failed every paired attempt and every retry, e.g. {regressed[0]!r}"
              if regressed else f"{len(lost)} solved task(s) lost on the paired seeds against {len(won)} gained"
              if len(won) < len(lost) else
              f"{len(fresh.solved)} solved task(s) hold ({len(lost)} only on retries), {len(won)} gained")
    if not v.add("seesaw", holds, detail):
        # Isolation is for conflicting clusters: the fork takes only clusters where it gains clearly and
        # no solved task regressed, so the variant it leaves behind keeps every regressed task solved.
        gains, losses = Counter(cluster_of(t) for t in won), Counter(cluster_of(t) for t in lost)
        hurt = {cluster_of(t) for t in regressed}
        clusters = tuple(sorted(c for c in gains if gains[c] - losses[c] >= FORK_MARGIN and c not in hurt))
        if allow_fork and clusters:
            v.outcome, v.clusters = "fork", clusters
        return v
    if v.add("effect", bool(won), f"{len(won)} of {len(fresh.flips)} predicted flip(s) realised"):
        v.outcome = "ship"
    return v
