"""The rule-induction claim's own figures (issue 39), read from its conclusion and its evolutions' ledgers.

Beside the spec runner's table, ``bench/evolution_efficacy.py --suite rules`` prints:

- per game, each arm's pass@2 with its interval, the gains ``both - starter`` and ``both - catalog`` with theirs,
  and whether ``both - starter`` meets the bar (+0.15 or more, interval above 0);
- the goal as pre-registered in ``bench/specs/rule_induction.yaml``: at least 3 of the named games (cookingworld,
  sorting, arithmetic, twc and every ScienceWorld task of the run) meet the bar; no game loses (the interval of
  ``both - starter`` or of ``both - catalog`` lies entirely below 0); on coin and mapreader ``both - catalog`` is not
  shown below 0;
- per evolution run (ledger): rounds and their outcomes, ``no_candidate`` rounds (and those whose notes still
  count untried rules), the propose stage's time against the run's wall time, attempts, held-out pass@2 before and
  after, and the rules it shipped as sentences; per arm, the gate's verdicts on processor edits and on rule edits
  (shipped, forked, or the check that turned them down), which says where a null arm's candidates stopped.

The propose stage's time of a round is the ledger's clock (``at_ns``) from its ``LandscapePlanned`` to its first
``CandidateProposed`` (to its ``RoundDecided`` when it proposed none): the evolver's work, catalog and induction
together, so in the ``both`` arm it bounds induction's time from above.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hx.experiment.procedure import procedure_run_id
from projections.ledger import RunLedger
from projections.ledger_reader import read_run_ledger
from schemas.edits import AddRule, DropRule
from schemas.rules import sentence
from streams.config import NatsSettings
from streams.connection import connect

BAR = 0.15
"""The gain (pass@2, both - starter) a named game must reach, its interval above 0."""
GOAL_GAMES = 3
"""How many named games must meet the bar."""
NAMED = ("twx:cookingworld", "twx:sorting", "twx:arithmetic", "twx:twc")
"""The TextWorldExpress games the issue names (the ScienceWorld tasks of the run are named too)."""
CATALOG_GAMES = ("twx:coin", "twx:mapreader")
"""Where the catalog evolver's processors fit: the both arm must keep its gains there."""
ARMS = ("starter", "catalog", "both")
UNTRIED = re.compile(r"(\d+) untried")
VARIABLE = "pass_at_k"


def games_of(spec: Mapping[str, Any]) -> list[str]:
    """The spec's games (``bench:game``), in the order its tasks name them."""
    return list(dict.fromkeys(":".join(str(t).split(":")[:2]) for t in spec["tasks"]))


def named_games(games: Sequence[str]) -> list[str]:
    """The games the goal counts, of those in the run: the named TextWorldExpress games and every ScienceWorld task."""
    return [g for g in games if g in NAMED or g.startswith("sciworld:")]


def _label(game: str, games: Sequence[str]) -> str:
    # one game: the conclusion has no per-game figures, its pooled ones are that game's
    return VARIABLE if len(games) == 1 else f"{VARIABLE} {game}"


def _shown(b: Mapping[str, float] | None) -> str:
    return "-" if b is None else f"{b['estimate']:6.3f} [{b['low']:6.3f}, {b['high']:6.3f}]"


@dataclass
class GameFigures:
    """One game: each arm's pass@2 and the two gains, as the conclusion has them (None: not measured)."""

    game: str
    means: dict[str, dict[str, float]]
    gain: dict[str, float] | None
    """both - starter."""
    over_catalog: dict[str, float] | None
    """both - catalog."""

    @property
    def meets_bar(self) -> bool:
        """A gain of at least ``BAR`` whose interval lies above 0."""
        return self.gain is not None and self.gain["estimate"] >= BAR and self.gain["low"] > 0

    @property
    def losses(self) -> list[str]:
        """The comparisons whose interval lies entirely below 0."""
        return [name for name, d in (("both - starter", self.gain), ("both - catalog", self.over_catalog))
                if d is not None and d["high"] < 0]


def game_figures(conclusion: Mapping[str, Any], games: Sequence[str]) -> list[GameFigures]:
    """Per game, the arms' pass@2 and the gains of ``both`` over ``starter`` and over ``catalog``."""
    means = {(s["variable"], s["level"]): s["mean"] for s in conclusion["levels"]}
    effects = {(e["variable"], e["level"], e["reference"]): e["difference"] for e in conclusion["effects"]}
    out = []
    for game in games:
        label = _label(game, games)
        out.append(GameFigures(game, {arm: means[(label, arm)] for arm in ARMS if (label, arm) in means},
                               effects.get((label, "both", "starter")), effects.get((label, "both", "catalog"))))
    return out


def print_games(figures: Sequence[GameFigures]) -> None:
    """The per-game table, then the goal, the losses and the catalog games' verdicts."""
    width = max(len(f.game) for f in figures) + 2
    print(f"\n== per game: pass@2 [95%], gains of both (bar: both - starter >= +{BAR:.2f}, interval above 0) ==")
    print(f"{'game':<{width}}" + "".join(f"{arm:>25}" for arm in ARMS) + f"{'both - starter':>25}  bar "
          f"{'both - catalog':>25}")
    for f in figures:
        print(f"{f.game:<{width}}" + "".join(f"{_shown(f.means.get(arm)):>25}" for arm in ARMS)
              + f"{_shown(f.gain):>25}  {'met' if f.meets_bar else '-  '} {_shown(f.over_catalog):>25}")
    named = [f for f in figures if f.game in named_games([g.game for g in figures])]
    met = [f.game for f in named if f.meets_bar]
    verdict = "MET" if len(met) >= GOAL_GAMES else "NOT MET"
    print(f"goal: {len(met)} of {len(named)} named games meet the bar (needs {GOAL_GAMES}): {verdict}"
          + (f" ({', '.join(met)})" if met else ""))
    nulls = [f.game for f in named if not f.meets_bar]
    if nulls:
        print(f"  nulls (bar missed): {', '.join(nulls)}")
    lost = [(f.game, loss) for f in figures for loss in f.losses]
    print("no game loses: " + ("yes" if not lost else "NO, " + "; ".join(f"{g}: {what} below 0" for g, what in lost)))
    for f in figures:
        if f.game in CATALOG_GAMES:
            kept = f.over_catalog is not None and f.over_catalog["high"] >= 0
            print(f"{f.game}: both - catalog {_shown(f.over_catalog)}: "
                  f"{'kept (not shown below the catalog arm)' if kept else 'LOST against the catalog arm'}")


@dataclass
class RunFigures:
    """One evolution run as its ledger has it."""

    run_id: str
    arm: str
    rounds: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    untried_idle: int = 0
    """``no_candidate`` rounds whose notes still count untried rules."""
    wall_s: float = 0.0
    propose_s: float = 0.0
    attempts: int = 0
    heldout: tuple[float | None, float | None] = (None, None)
    rules: list[str] = field(default_factory=list)
    """The rules it shipped, as sentences."""
    verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Gate verdicts by (what the candidate edits: ``rule`` or ``processor``, its outcome or first failed check)."""


def run_figures(ledger: RunLedger, arm: str) -> RunFigures:
    """Rounds, outcomes, the propose stage's time, wall time, attempts, held-out pass@2 and shipped rules of a run."""
    out = RunFigures(ledger.run_id, arm)
    for rnd in ledger.ordered():
        if rnd.decided is None:
            continue
        out.rounds += 1
        out.outcomes[rnd.decided.outcome] += 1
        out.attempts += rnd.decided.metrics.rollouts
        if rnd.decided.outcome == "no_candidate" and any(int(n) > 0 for n in UNTRIED.findall(rnd.decided.reason)):
            out.untried_idle += 1
        if rnd.landscape is not None and rnd.landscape.at_ns:
            end = rnd.proposed[0].at_ns if rnd.proposed else rnd.decided.at_ns
            out.propose_s += max(0, end - rnd.landscape.at_ns) / 1e9
    if ledger.opened is not None and ledger.finished is not None and ledger.opened.at_ns:
        out.wall_s = (ledger.finished.at_ns - ledger.opened.at_ns) / 1e9
    if ledger.heldout:
        out.heldout = (ledger.heldout[0].pass_at_2, ledger.heldout[-1].pass_at_2)
    for cand in ledger.candidates.values():
        if cand.gate is not None:
            kind = "rule" if any(isinstance(op, AddRule | DropRule) for op in cand.proposal.operations) else "processor"
            out.verdicts[kind, cand.gate.first_failure or cand.gate.outcome] += 1
        if cand.shipped_position:
            out.rules += [sentence(op.rule, op.support) for op in cand.proposal.operations if isinstance(op, AddRule)]
    return out


def evolution_runs(spec: Mapping[str, Any], run_id: str) -> list[tuple[str, str]]:
    """(arm, run id) of every evolution the experiment made, as ``hx experiment run`` names them."""
    seeds = spec.get("procedure_seeds") or []
    out = []
    for factor in spec["factors"]:
        for level, options in factor["scope"]["levels"].items():
            if isinstance(options, Mapping) and "evolver" in options:
                base = procedure_run_id(run_id, factor["name"], level)
                out += [(level, f"{base}-s{s}") for s in seeds] if seeds else [(level, base)]
    return out


async def _read(settings: NatsSettings, runs: Sequence[tuple[str, str]]) -> list[RunFigures]:
    async with connect(settings) as conn:
        out = []
        for arm, rid in runs:
            ledger = await read_run_ledger(conn.log, rid)
            out.append(run_figures(ledger, arm) if ledger is not None else RunFigures(rid, arm))
        return out


def read_runs(settings: NatsSettings, spec: Mapping[str, Any], run_id: str) -> list[RunFigures]:
    """The figures of every evolution of the experiment, read from its ledger (``NatsSettings(data_dir=...)``: the
    embedded server of the run's data directory)."""
    return asyncio.run(_read(settings, evolution_runs(spec, run_id)))


def _rate(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


def print_runs(runs: Sequence[RunFigures]) -> None:
    """Per run, then per arm: no_candidate rounds, and the propose stage's share of the wall time."""
    print("\n== evolution runs (their ledgers) ==")
    width = max(len(r.run_id) for r in runs) + 2
    print(f"{'run':<{width}}{'rounds':>7}  {'outcomes':<44}{'wall s':>9}{'propose s':>11}{'share':>8}{'attempts':>10}"
          "  held-out pass@2 (train) before -> after")
    for r in runs:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items()))
        share = f"{r.propose_s / r.wall_s:.1%}" if r.wall_s else "-"
        print(f"{r.run_id:<{width}}{r.rounds:>7}  {outcomes:<44}{r.wall_s:>9.1f}{r.propose_s:>11.2f}{share:>8}"
              f"{r.attempts:>10}  {_rate(r.heldout[0])} -> {_rate(r.heldout[1])}")
    for arm in dict.fromkeys(r.arm for r in runs):
        mine = [r for r in runs if r.arm == arm]
        idle = sum(r.outcomes["no_candidate"] for r in mine)
        wall, propose = sum(r.wall_s for r in mine), sum(r.propose_s for r in mine)
        print(f"{arm}: no_candidate rounds {idle} (while untried rules remained: {sum(r.untried_idle for r in mine)});"
              f" propose stage {propose:.1f} s of {wall:.1f} s wall"
              + (f" = {propose / wall:.2%}" if wall else ""))
        verdicts: Counter[tuple[str, str]] = sum((r.verdicts for r in mine), Counter())
        for kind in ("processor", "rule"):
            said = ", ".join(f"{why} {n}" for (k, why), n in sorted(verdicts.items()) if k == kind)
            if said:
                print(f"  gate verdicts on {kind} edits: {said}")
    both = [r for r in runs if r.arm == "both"]
    wall = sum(r.wall_s for r in both)
    if wall:
        part = sum(r.propose_s for r in both) / wall
        print(f"induction's share of the evolution's wall time (both arm; its propose stage, catalog evolver included: "
              f"an upper bound): {part:.2%} ({'under' if part < 0.10 else 'NOT under'} the 10% goal)")
    for r in both:
        if r.rules:
            print(f"rules {r.run_id} shipped:")
            for said in r.rules:
                print(f"  - {said}")
