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
   that happens while the model's input stays the same, and close no recorded winning path
   (every winning action still offered and run as it ran).
6. ``seesaw`` and 7. ``effect``, on the candidate's fresh attempts (``GateTrials.fresh``), and a
   fork for a split edit: the rule itself is ``hx.gate.rule``, which the audit applies again to
   every recorded verdict. Between the two, when the run asks for it, ``interval``: the paired
   attempts by the keep rule (``hx.gate.interval``), then ``suite``: the eval suite played by the
   variant's harness and the candidate's, by the keep rule (``hx.gate.suite``). A fork never takes a
   cluster where a solved task regressed, so it cannot be a ship that regresses by another name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

import msgspec

from hx.aegis.counterfactual import Replayed, decide
from hx.aegis.operations import strings_in
from hx.gate.interval import IntervalMode
from hx.gate.rule import Fresh, Verdict, effect, paired
from hx.gate.sequential import SequentialRule
from hx.gate.suite import SuiteFigures, suite_detail, suite_passes
from hx.harness.config import HarnessConfig
from hx.harness.errors import CompositionError
from schemas.ledger import CandidateProposed


class GateTrials(Protocol):
    """What the gate needs run: replays and fresh attempts (``hx.aegis.trials.Trials`` provides them)."""

    async def counterfactual(self, harness: HarnessConfig, variant: str) -> list[Replayed]:
        """Solved attempts replayed under ``harness``: each one's verdict and winning path."""

    async def fresh(self, harness: HarnessConfig, variant: str, candidate: str, flips: Sequence[str], *,
                    base_harness: HarnessConfig | None = None, rule: SequentialRule | None = None) -> Fresh:
        """Fresh seeded attempts of the candidate on the variant's solved tasks and its predicted flips (and, by the
        seesaw rule, retries or sequential waves)."""



class SuiteCheck(Protocol):
    """Plays the eval suite with the base's harness and the candidate's (``hx.aegis.suite_gate.SuiteGate``)."""

    async def __call__(self, base: HarnessConfig, candidate: HarnessConfig,
                       proposal: CandidateProposed) -> SuiteFigures:
        """The two eval runs' figures and the keep rule's verdict on candidate - base."""


class CodeCheck(Protocol):
    """Builds and smoke-tests a candidate that brings new code, in a sandbox (the main process imports none of it)."""

    async def __call__(self, base: HarnessConfig, candidate: CandidateProposed) -> tuple[str, str, str]:
        """(the candidate's digest, why its config does not build or "", why its smoke test failed or "")."""


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
                trials: GateTrials, forbidden: Forbidden, *, allow_fork: bool, code_check: CodeCheck | None = None,
                sources: Sequence[str] = (), interval: IntervalMode = "off",
                suite: SuiteCheck | None = None, rule: SequentialRule | None = None) -> Verdict:
    """Run the checks in order; the first that fails decides (a seesaw failure may still fork).

    ``build`` makes the candidate's harness (``CompositionError`` when it cannot). A
    candidate with new code is first built and smoke-tested by ``code_check`` in a sandbox
    (the ``config`` and ``smoke`` checks): only then may the main process import its code
    and ``build`` it. ``sources`` are its code's texts, for the leakage scan; ``interval`` the
    mode of the optional interval check; ``suite`` plays the optional suite check; ``rule`` is the
    seesaw's sequential rule (None: the ``retry`` rule).
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
    if not v.add("counterfactual", *decide(await trials.counterfactual(harness, candidate.variant))):
        return v
    return await _seesaw(v, candidate, base, harness, trials, allow_fork, interval, suite, rule)


def _config(v: Verdict, candidate: CandidateProposed, digest: str, base: HarnessConfig, error: str) -> bool:
    if error or not digest:
        return v.add("config", False, error or "does not build")
    if digest == base.digest:
        return v.add("config", False, "changes nothing: the digest equals the current harness's")
    if digest != candidate.digest:
        return v.add("config", False, f"digest {digest[:19]} differs from the proposed {candidate.digest[:19]}")
    return v.add("config", True, f"normalised, {digest[:19]}")


async def _seesaw(v: Verdict, candidate: CandidateProposed, base: HarnessConfig, harness: HarnessConfig,
                  trials: GateTrials, allow_fork: bool, interval: IntervalMode, suite: SuiteCheck | None,
                  rule: SequentialRule | None) -> Verdict:
    fresh = await trials.fresh(harness, candidate.variant, candidate.candidate, candidate.manifest.predicted_flips,
                               base_harness=base, rule=rule)
    v.trace_rounds = fresh.trace_rounds
    if not paired(v, fresh, allow_fork=allow_fork, interval=interval, rule=rule):
        return v
    if suite is not None:
        # only a candidate the paired attempts let through costs two plays of the suite (the base's once a round)
        figures = await suite(base, harness, candidate)
        if not v.add("suite", suite_passes(figures.verdict), suite_detail(figures)):
            return v
    return effect(v, fresh)
