"""The report's figures, drawn with matplotlib's Agg canvas into PNG bytes.

Each figure is a ``Plot``: a file stem, a title, a caption saying what is drawn, and the
PNG. Figures are drawn on ``matplotlib.figure.Figure`` with an explicit Agg canvas (no
pyplot, no display, no global figure state), under matplotlib's default style (a user's
matplotlibrc changes nothing), at a fixed size and dpi, with no software tag in the PNG:
the same data gives the same bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import matplotlib
import matplotlib.style
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from hx.report.data import LearnerRecord, ReportData, RoundFigures
from hx.report.evals import EVAL_FIGURE, EvalData
from schemas.edits import BUCKETS
from schemas.learn import PolicyUpdated

DPI = 100
HEIGHT = 4.2
BUCKET_COLOURS = {"prompt": "#4c72b0", "tools": "#dd8452", "config": "#55a868", "processor": "#c44e52"}
ANNOTATE_MAX = 20
"""Rounds up to which heatmap cells and ships carry their numbers and names (beyond, they would overlap)."""
NAMES_SHOWN = 3


@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file stem, title, caption and PNG bytes."""

    name: str
    title: str
    caption: str
    png: bytes


def _width(rounds: int) -> float:
    return min(16.0, max(8.0, 2.0 + 0.5 * rounds))


def _draw(width: float, height: float, paint: Callable[[Figure], None]) -> bytes:
    with matplotlib.style.context("default"):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        paint(fig)
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=DPI, metadata={"Software": None})
    return out.getvalue()


def _round_axis(ax: Axes, rounds: Sequence[int], *, before: bool = False) -> None:
    ticks = ([-1] if before else []) + list(rounds)
    ax.set_xticks(ticks, ["before" if t < 0 else str(t) for t in ticks])
    ax.set_xlabel("round")
    if ticks:
        ax.set_xlim(min(ticks) - 0.6, max(ticks) + 0.6)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


# --- evolution curves ----------------------------------------------------------------------------------------


def evolution(data: ReportData) -> Plot:
    """Adaptation pass@k per round (all tasks, and per variant when there are several) and held-out pass@1/@2."""
    rounds = [r.round for r in data.rounds]
    variants = data.variant_names()

    def paint(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.plot(rounds, [_nan(r.pass_at_k) for r in data.rounds], "o-", color="#333333", lw=2,
                label="adaptation pass@k (all tasks)")
        if len(variants) > 1:
            for v in variants:
                ax.plot(rounds, [r.variants.get(v, math.nan) for r in data.rounds], "o--", lw=1, ms=4,
                        label=f"adaptation pass@k, variant {v}")
        held = data.heldout
        if held:
            xs = [h.round for h in held]
            ax.plot(xs, [_nan(h.pass_at_2) for h in held], "s-", color="#2a9d8f", lw=2, label="held-out pass@2")
            ax.plot(xs, [_nan(h.pass_at_1) for h in held], "s:", color="#2a9d8f", lw=1, ms=4,
                    label="held-out pass@1")
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("pass rate")
        ax.grid(alpha=0.3)
        _round_axis(ax, rounds, before=any(h.round < 0 for h in held))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    caption = ("Adaptation pass@k per round (k = attempts per task; the share of the round's adaptation tasks "
               "solved by at least one attempt)"
               + (", overall and per variant" if len(variants) > 1 else "")
               + "; held-out pass@2 (solid) and pass@1 (dotted) on the frozen test split, before the first round "
               "and after each round that evaluated it.")
    return Plot("evolution", "Evolution curves", caption, _draw(_width(len(rounds)) + 2.5, HEIGHT, paint))


# --- lever mix -----------------------------------------------------------------------------------------------


def lever_mix(data: ReportData) -> Plot:
    """Shipped edits so far per bucket, as each round's decision recorded them, stacked."""
    rounds = [r.round for r in data.rounds]

    def paint(fig: Figure) -> None:
        ax = fig.add_subplot()
        bottom = [0.0] * len(rounds)
        for b in BUCKETS:
            counts = [float(r.lever_mix.get(b, 0)) for r in data.rounds]
            ax.bar(rounds, counts, 0.6, bottom=bottom, color=BUCKET_COLOURS[b], label=b)
            bottom = [x + y for x, y in zip(bottom, counts, strict=True)]
        if not any(bottom):
            ax.text(0.5, 0.5, "no edit shipped", transform=ax.transAxes, ha="center", va="center", color="#777777")
        ax.set_ylim(0, max([*bottom, 1.0]) * 1.15)
        ax.set_ylabel("shipped edits (cumulative)")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(axis="y", alpha=0.3)
        _round_axis(ax, rounds)
        ax.legend(title="bucket", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    caption = ("The lever mix: shipped edits (ships and forks) so far per bucket (prompt, tools, config, processor), "
               "as recorded by each round's decision (RoundMetrics.lever_mix), stacked.")
    return Plot("lever_mix", "Lever mix by bucket", caption, _draw(_width(len(rounds)) + 1.5, HEIGHT, paint))


# --- ship-rate and hit-rate heatmaps -------------------------------------------------------------------------


def _heatmap(data: ReportData, cell: Callable[[RoundFigures, str], tuple[float, str]], label: str) -> bytes:
    """Bucket x round, each cell coloured by its share (NaN: grey) and, when they fit, labelled with its text."""
    rounds = [r.round for r in data.rounds]

    def paint(fig: Figure) -> None:
        ax = fig.add_subplot()
        if not rounds:  # an image of no column has no extent: say so instead
            ax.text(0.5, 0.5, "no round yet", transform=ax.transAxes, ha="center", va="center", color="#777777")
            ax.set_yticks([i / (len(BUCKETS) - 1) for i in range(len(BUCKETS))], list(reversed(BUCKETS)))
            ax.set_xticks([])
            ax.set_xlabel("round")
            return
        cells = [[cell(r, b) for r in data.rounds] for b in BUCKETS]
        grid = [[share for share, _ in row] for row in cells]
        cmap: Colormap = matplotlib.colormaps["YlGn"].with_extremes(bad="#eeeeee")
        image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(BUCKETS)), list(BUCKETS))
        ax.set_xticks(range(len(rounds)), [str(n) for n in rounds])
        ax.set_xlabel("round")
        if len(rounds) <= ANNOTATE_MAX:
            for i, row in enumerate(cells):
                for j, (share, text) in enumerate(row):
                    dark = not math.isnan(share) and share > 0.6
                    ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "#222222")
        bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
        bar.set_label(label)

    return _draw(_width(len(rounds)), 3.6, paint)


def ship_cell(r: RoundFigures, bucket: str) -> tuple[float, str]:
    """One ship-rate cell: shipped over proposed candidates touching ``bucket`` (NaN: none proposed), and its text."""
    if not r.proposed[bucket]:
        return math.nan, "-"
    return r.shipped[bucket] / r.proposed[bucket], f"{r.shipped[bucket]}/{r.proposed[bucket]}\ngate {r.passed[bucket]}"


def ship_rate(data: ReportData) -> Plot:
    """Bucket x round: the ship rate, the share of proposed candidates that shipped, with gate passes."""
    caption = ("Ship rate (shipped / proposed candidates) per bucket and round: each cell is coloured by the share "
               "of the round's proposed candidates touching that bucket that shipped (or forked a variant); the "
               "numbers are shipped/proposed and, below, how many passed the gate. Grey cells: nothing proposed in "
               "that bucket. A candidate touching several buckets counts in each. Not the hit rate, which is "
               "realised over predicted flips.")
    return Plot("ship_rate", "Ship rate (shipped / proposed), bucket x round", caption,
                _heatmap(data, ship_cell, "shipped / proposed"))


def hit_cell(r: RoundFigures, bucket: str) -> tuple[float, str]:
    """One hit-rate cell: realised over predicted flips of ships touching ``bucket`` (NaN: none tested), its text."""
    if not r.predicted[bucket]:
        return math.nan, f"{r.shipped[bucket]} shipped" if r.shipped[bucket] else "-"
    return r.realised[bucket] / r.predicted[bucket], f"{r.realised[bucket]}/{r.predicted[bucket]}"


def hit_rate(data: ReportData) -> Plot:
    """Bucket x round: the hit rate of the round's ships, realised over predicted flips (as ``levers.hit_rates``)."""
    caption = ("Hit rate (realised / predicted flips) per bucket and shipping round: of the flips the round's ships "
               "touching that bucket predicted, on tasks the next round ran, the share that happened (the task was "
               "solved); the numbers are realised/predicted. The same definition as the levers' hit rate, the "
               "critic's, scoreboard.json's and each round's metrics (where round t reports round t-1's ships). "
               "Grey cells: no predicted flip was tested (nothing shipped, or the next round has not run). A ship "
               "touching several buckets counts in each.")
    return Plot("hit_rate", "Hit rate (realised / predicted flips), bucket x round", caption,
                _heatmap(data, hit_cell, "realised / predicted flips"))


# --- timeline ------------------------------------------------------------------------------------------------


def _names(names: Sequence[str]) -> str:
    shown = list(names[:NAMES_SHOWN])
    return "\n".join(shown + ([f"+{len(names) - NAMES_SHOWN}"] if len(names) > NAMES_SHOWN else []))


def timeline(data: ReportData) -> Plot:
    """Per round: ships, forks and retirements upwards, regressions downwards, the shipped candidates named."""
    rounds = [r.round for r in data.rounds]

    def paint(fig: Figure) -> None:
        ax = fig.add_subplot()
        bottom = [0.0] * len(rounds)
        for label, colour, values in (("ships", "#4c72b0", [r.ships for r in data.rounds]),
                                      ("forks", "#8172b3", [r.forks for r in data.rounds]),
                                      ("retirements", "#937860", [r.retirements for r in data.rounds])):
            ax.bar(rounds, values, 0.6, bottom=bottom, color=colour, label=label)
            bottom = [x + y for x, y in zip(bottom, values, strict=True)]
        ax.bar(rounds, [-r.regressions for r in data.rounds], 0.6, color="#c44e52", label="regressions")
        top = max([*bottom, 1.0])
        low = max([r.regressions for r in data.rounds] + [1])
        if len(rounds) <= ANNOTATE_MAX:
            for r, height in zip(data.rounds, bottom, strict=True):
                if r.shipped_names:
                    ax.text(r.round, height + 0.05 * top, _names(r.shipped_names), ha="center", va="bottom",
                            fontsize=7)
        ax.axhline(0, color="#333333", lw=0.8)
        ax.set_ylim(-low * 1.3, top * 1.9)
        ax.set_ylabel("count")
        ax.text(0.01, 0.98, "above 0: ships, forks, retirements", transform=ax.transAxes, va="top", fontsize=8,
                color="#555555")
        ax.text(0.01, 0.02, "below 0: regressions", transform=ax.transAxes, va="bottom", fontsize=8,
                color="#555555")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{abs(v):g}"))  # regressions count down from 0
        ax.grid(axis="y", alpha=0.3)
        _round_axis(ax, rounds)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    caption = ("Ships and regressions on the timeline: per round, harness ships, variant forks and retirements "
               "(stacked, upwards; the candidates shipped or forked are named above), and the tasks that regressed "
               "against the previous round (downwards).")
    return Plot("timeline", "Ships and regressions", caption, _draw(_width(len(rounds)) + 1.5, HEIGHT, paint))


# --- the learner ---------------------------------------------------------------------------------------------


def _series(updates: Sequence[LearnerRecord], value: Callable[[PolicyUpdated], float]) -> list[float]:
    return [value(u) if isinstance(u, PolicyUpdated) else math.nan for u in updates]


def learner(data: ReportData) -> Plot:
    """Co-evolution: loss, KL, entropy, clip fraction, groups used and samples per learner pass."""
    by_learner: dict[str, list[LearnerRecord]] = {}
    for u in data.learner:
        by_learner.setdefault(u.learner, []).append(u)
    panels: list[tuple[str, Callable[[PolicyUpdated], float]]] = [
        ("loss", lambda u: u.loss), ("KL to the reference", lambda u: u.kl), ("entropy", lambda u: u.entropy),
        ("clip fraction", lambda u: u.clip_fraction), ("groups used", lambda u: float(u.groups_used)),
        ("samples", lambda u: float(u.samples))]

    def paint(fig: Figure) -> None:
        axes = fig.subplots(2, 3, sharex=True)
        for ax, (title, value) in zip(axes.flat, panels, strict=True):
            for name, updates in by_learner.items():
                xs = [u.through_round for u in updates]
                ax.plot(xs, _series(updates, value), "o-", ms=4, label=name)
                skipped = [u.through_round for u in updates if not isinstance(u, PolicyUpdated)]
                for x in skipped:
                    ax.axvline(x, color="#999999", ls=":", lw=1)
            for x in data.rejected:
                ax.axvline(x, color="#c0392b", ls="--", lw=1)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        for ax in axes[1]:
            ax.set_xlabel("trace round trained through")
        for ax in axes.flat:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[0][0].legend(fontsize=8, title="learner", title_fontsize=8)

    caption = ("The learner's passes (co-evolution): GRPO loss, k3 KL to the reference policy, entropy, clip fraction, "
               "trajectory groups used and training samples, per pass, by the last trace round the pass trained "
               "through (trace rounds count every rollout of the run: main rounds, gate evaluations, held-out rounds). "
               "Dotted vertical lines: passes that kept the policy (nothing to learn from, or a non-finite loss); "
               "dashed red ones: passes whose new policy the policy gate rejected (it lost a solved task).")
    return Plot("learner", "Learner curves", caption, _draw(12.0, 6.0, paint))


# --- eval suite scores -----------------------------------------------------------------------------------------




def _when(time_ns: int) -> str:
    """A UTC minute from a log time: an eval's x label (in UTC, so no machine's time zone changes the bytes)."""
    return datetime.fromtimestamp(time_ns // 10**9, UTC).strftime("%Y-%m-%d\n%H:%M")


def eval_suite(evals: EvalData) -> Plot:
    """Each eval's suite composite with its interval, in the order the evals reached the log, one series per suite."""
    suites = list(dict.fromkeys(p.scored.suite for p in evals.evals))

    def paint(fig: Figure) -> None:
        ax = fig.subplots()
        for suite in suites:
            points = [(i, p.scored.composite) for i, p in enumerate(evals.evals) if p.scored.suite == suite]
            xs = [i for i, _ in points]
            ys = [b.estimate for _, b in points]
            err = [[b.estimate - b.low for _, b in points], [b.high - b.estimate for _, b in points]]
            ax.errorbar(xs, ys, yerr=err, fmt="o-", ms=5, capsize=4, label=suite)
        ax.set_xticks(range(len(evals.evals)), [_when(p.time_ns) for p in evals.evals], fontsize=8)
        ax.set_xlim(-0.6, len(evals.evals) - 0.4)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("suite composite")
        ax.set_xlabel("eval (UTC, when its score reached the log)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="suite", title_fontsize=8)

    caption = ("Each eval's suite composite (per attempt 0.7 x passed + 0.3 x the share of its criteria passed; a "
               "task's composite is the mean over its attempts, the suite's the weight-weighted mean over tasks) "
               "with its 95% interval (two-stage bootstrap: tasks, then attempts), in the order the evals reached "
               "the log; one line per suite (scores of different suites are not comparable).")
    return Plot(EVAL_FIGURE, "Eval suite", caption, _draw(_width(len(evals.evals)), HEIGHT, paint))


def figures(data: ReportData) -> list[Plot]:
    """Every figure of a run's report, in page order (the learner's only for a co-evolution run, the eval suite's
    only when evals are shown)."""
    plots = [evolution(data), lever_mix(data), hit_rate(data), ship_rate(data), timeline(data)]
    plots += [learner(data)] if data.coevolution else []
    return [*plots, eval_suite(data.evals)] if data.evals.evals else plots
