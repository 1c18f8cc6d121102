"""The loop's settings and its progress callbacks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from hx.aegis.errors import GateSettingsInvalid, InductionSettingsInvalid
from hx.aegis.variants import Strategy
from hx.eval.suite import default_suite, load_suite, suite_digest
from hx.gate.interval import INTERVAL_MODES, IntervalMode
from hx.gate.sequential import SEESAW_MODES, SeesawMode, SequentialRule
from projections.ledger import ROUTING, Routing
from schemas.ledger import HeldoutScored, RoundDecided
from schemas.suite import Suite

CoevolveMode = Literal["harness", "model", "both"]
COEVOLVE_MODES: tuple[CoevolveMode, ...] = ("harness", "model", "both")
"""What co-evolution moves: the harness only (policy frozen), the model only (harness frozen), or both."""


class GateSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The gate's seesaw rule and optional checks (a job's ``loop.gate``): the optional checks are off by default.

    ``seesaw`` defaults to ``retry`` *here* so that a job recorded before the sequential rule
    (``gate: {}``) still means what it ran with; a new run's settings come from ``of`` (the
    command line), whose default is ``sequential``, and record it. A job records them through
    ``recorded``: the sequential rule's three numbers always written, defaults or not.
    """

    seesaw: SeesawMode = "retry"
    """How the seesaw decides a solved task regressed: ``sequential`` or ``retry`` (``hx.gate.sequential``)."""
    drop: float = 0.25
    """``sequential``: the smallest fall in a solved task's pass rate that counts as a regression (0 < drop <= 1)."""
    alpha: float = 0.05
    """``sequential``: the one-sided level of the exact test that calls a regression (0 < alpha <= 0.5)."""
    waves: int = 3
    """``sequential``: the most waves of k paired seeds a trailing task plays (1 to 10)."""
    interval: IntervalMode = "off"
    """The ``interval`` check between ``seesaw`` and ``effect``: ``off``, ``no_discard`` or ``keep``."""
    suite: str = ""
    """The ``suite`` check after ``interval``: a suite file's path, ``default`` (hx's suite) or "" (off)."""
    suite_digest: str = ""
    """The digest of the suite the check plays (``hx.eval.suite.suite_digest``), so the audit knows which."""

    def recorded(self) -> dict[str, Any]:
        """These settings as a job records them: the fields off their defaults, and under the sequential rule its
        ``drop``, ``alpha`` and ``waves`` always, so the audit reads the numbers the gate ran with, not a later hx's
        defaults (a job recorded without them, before this, still reads them as the defaults); ``retry`` uses none.

        Compared by value: msgspec's ``omit_defaults`` compares a float by identity, so whether a default number
        was written depended on where it came from (the command line's parsed 0.25 was, the literal was not).
        """
        numbers = ("drop", "alpha", "waves")
        sequential = self.seesaw == "sequential"
        return {f.name: getattr(self, f.name) for f in msgspec.structs.fields(self)
                if (sequential if f.name in numbers else getattr(self, f.name) != f.default)}

    @property
    def rule(self) -> SequentialRule | None:
        """The sequential rule's numbers, or None for the ``retry`` rule."""
        return SequentialRule(self.drop, self.alpha, self.waves) if self.seesaw == "sequential" else None

    @classmethod
    def of(cls, interval: str, suite: str = "", *, seesaw: str = "sequential", drop: float = 0.25,
           alpha: float = 0.05, waves: int = 3, where: str = "--gate-interval",
           suite_where: str = "--gate-suite") -> GateSettings:
        """Settings from the options' texts (the suite loaded, its path made absolute); ``GateSettingsInvalid`` or
        the suite's ``EvalError`` naming the option for a mode the gate lacks, a number out of its range or a
        suite that does not load."""
        if interval not in INTERVAL_MODES:
            raise GateSettingsInvalid(f"{where}: unknown interval mode {interval!r}; the modes are "
                                      f"{', '.join(INTERVAL_MODES)}")
        rule = check_rule(seesaw, drop, alpha, waves) or SequentialRule()  # retry: the numbers are not used
        mode: SeesawMode = "sequential" if seesaw == "sequential" else "retry"
        numbers = cls(seesaw=mode, drop=rule.drop, alpha=rule.alpha, waves=rule.waves, interval=interval)
        if not suite:
            return numbers
        if suite != "default" and not Path(suite).is_file():
            raise GateSettingsInvalid(f"{suite_where}: no suite file {suite!r} (a path, or 'default' for hx's suite)")
        name = suite if suite == "default" else str(Path(suite).resolve())
        return msgspec.structs.replace(numbers, suite=name, suite_digest=suite_digest(gate_suite(name)))


def check_rule(seesaw: str, drop: float, alpha: float, waves: int) -> SequentialRule | None:
    """The seesaw rule the options name (None: ``retry``); ``GateSettingsInvalid`` naming the option out of range."""
    if seesaw not in SEESAW_MODES:
        raise GateSettingsInvalid(f"--gate-seesaw: unknown seesaw rule {seesaw!r}; the rules are "
                                  f"{', '.join(SEESAW_MODES)}")
    if not 0 < drop <= 1:
        raise GateSettingsInvalid(f"--gate-drop: {drop:g} is not a fall in pass rate in (0, 1]")
    if not 0 < alpha <= 0.5:
        raise GateSettingsInvalid(f"--gate-alpha: {alpha:g} is not an error rate in (0, 0.5]")
    if not 1 <= waves <= 10:
        raise GateSettingsInvalid(f"--gate-waves: {waves} is not a number of waves from 1 to 10")
    return SequentialRule(drop, alpha, waves) if seesaw == "sequential" else None


def gate_suite(name: str) -> Suite:
    """The suite a gate setting names (``default``: hx's own), loaded and checked."""
    return default_suite() if name == "default" else load_suite(name)


class InductionSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The rule induction's thresholds (the ``induced`` evolver's): the defaults were chosen on the validation split
    (``bench/induction_thresholds.py``: every setting of its grid tied, its tie rule took the smallest)."""

    min_support: int = 2
    """Fewest tasks a rule must rest on (attempts of one task are not independent evidence of a rule)."""
    max_against: float = 0.1
    """Most steps speaking against a rule, as a fraction of the tasks it rests on."""
    min_lift: float = 1.5
    """How many times more often a preferred action must be useful than the others."""

    def __post_init__(self) -> None:
        if self.min_support < 1:
            raise ValueError(f"--induce-support: {self.min_support} is not a number of tasks (1 or more)")
        if not 0 <= self.max_against <= 1:
            raise ValueError(f"--induce-against: {self.max_against:g} is not a fraction in [0, 1]")
        if self.min_lift < 1:
            raise ValueError(f"--induce-lift: {self.min_lift:g} is not a ratio of 1 or more")

    @classmethod
    def of(cls, support: int, lift: float, against: float) -> InductionSettings:
        """The thresholds the options name; ``InductionSettingsInvalid`` naming the option out of range."""
        try:
            return cls(min_support=support, min_lift=lift, max_against=against)
        except ValueError as exc:
            raise InductionSettingsInvalid(str(exc)) from None


class EvolveSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Algorithm 1's knobs and the strategy (a job's ``loop``)."""

    rounds: int = 6
    """T: the most rounds to run."""
    patience: int = 3
    """P: rounds in a row without a ship that end the run."""
    alpha: float = 0.05
    """Actionability below which a round is a no-op."""
    candidates: int = 3
    """K: candidates the evolver may propose per round."""
    strategy: Strategy = "ensemble"
    max_variants: int = 3
    heldout_every: int = 0
    """Also evaluate the held-out split after every N-th round (0: only before and after)."""
    risk_threshold: float = 0.7
    """Candidates riskier than this wait for a human."""
    gate: GateSettings = GateSettings(seesaw="sequential")
    """The gate's seesaw rule and optional checks (a new job's: the sequential rule)."""
    induction: InductionSettings = InductionSettings()
    """The ``induced`` evolver's thresholds (a job recorded before it had them: these defaults)."""
    routing: Routing = ROUTING
    """How a cluster no fork serves is routed (``RunLedger.unserved``): the one rule today, recorded so that an
    audit of this run's held-out scores applies it (a job recorded before it: the routing is not checked)."""


@dataclass
class Progress:
    """Callbacks the command line uses to show a run as it goes (all optional)."""

    round: Callable[[int], None] = lambda t: None
    stage: Callable[[int, str], None] = lambda t, what: None
    decided: Callable[[RoundDecided], None] = lambda d: None
    heldout: Callable[[HeldoutScored], None] = lambda h: None
    shown: Callable[[int, str, str], None] = lambda t, stage, line: None
    """A stage's output in one line (``Stage.show``), once it ran or was found recorded."""
