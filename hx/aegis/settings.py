"""The loop's settings and its progress callbacks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from hx.aegis.errors import GateSettingsInvalid
from hx.aegis.variants import Strategy
from hx.eval.suite import default_suite, load_suite, suite_digest
from hx.gate.interval import INTERVAL_MODES, IntervalMode
from schemas.ledger import HeldoutScored, RoundDecided
from schemas.suite import Suite

CoevolveMode = Literal["harness", "model", "both"]
COEVOLVE_MODES: tuple[CoevolveMode, ...] = ("harness", "model", "both")
"""What co-evolution moves: the harness only (policy frozen), the model only (harness frozen), or both."""


class GateSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The gate's optional checks (a job's ``loop.gate``): all off by default, so the gate is the seven checks."""

    interval: IntervalMode = "off"
    """The ``interval`` check between ``seesaw`` and ``effect``: ``off``, ``no_discard`` or ``keep``."""
    suite: str = ""
    """The ``suite`` check after ``interval``: a suite file's path, ``default`` (hx's suite) or "" (off)."""
    suite_digest: str = ""
    """The digest of the suite the check plays (``hx.eval.suite.suite_digest``), so the audit knows which."""

    @classmethod
    def of(cls, interval: str, suite: str = "", *, where: str = "--gate-interval",
           suite_where: str = "--gate-suite") -> GateSettings:
        """Settings from the options' texts (the suite loaded, its path made absolute); ``GateSettingsInvalid`` or
        the suite's ``EvalError`` naming the option for a mode the gate lacks or a suite that does not load."""
        if interval not in INTERVAL_MODES:
            raise GateSettingsInvalid(f"{where}: unknown interval mode {interval!r}; the modes are "
                                      f"{', '.join(INTERVAL_MODES)}")
        if not suite:
            return cls(interval=interval)
        if suite != "default" and not Path(suite).is_file():
            raise GateSettingsInvalid(f"{suite_where}: no suite file {suite!r} (a path, or 'default' for hx's suite)")
        name = suite if suite == "default" else str(Path(suite).resolve())
        return cls(interval=interval, suite=name, suite_digest=suite_digest(gate_suite(name)))


def gate_suite(name: str) -> Suite:
    """The suite a gate setting names (``default``: hx's own), loaded and checked."""
    return default_suite() if name == "default" else load_suite(name)


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
    gate: GateSettings = GateSettings()
    """The gate's optional checks."""


@dataclass
class Progress:
    """Callbacks the command line uses to show a run as it goes (all optional)."""

    round: Callable[[int], None] = lambda t: None
    stage: Callable[[int, str], None] = lambda t, what: None
    decided: Callable[[RoundDecided], None] = lambda d: None
    heldout: Callable[[HeldoutScored], None] = lambda h: None
    shown: Callable[[int, str, str], None] = lambda t, stage, line: None
    """A stage's output in one line (``Stage.show``), once it ran or was found recorded."""
