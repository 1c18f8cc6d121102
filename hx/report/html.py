"""A run's report as one self-contained HTML page: inline CSS, figures as base64 PNG data URIs, no network.

``page(data, plots)`` writes the header (run, benchmarks, model, rounds, status), the
held-out table before and after, a row per round, the rules shipped (when any), the tokens per round, and each
figure with its caption; then, when
there are any, the eval suite's scores (figure, a row per eval, the latest per-task table) and
the experiments' results. It
reads no clock: the same data and figures give the same bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING

from hx.report.data import ReportData
from hx.report.evals import EVAL_FIGURE, EvalData, bounds_text
from schemas.evaluation import Bounds
from schemas.ledger import GameScore
from schemas.rules import sentence, support_phrase

if TYPE_CHECKING:  # the figures module imports matplotlib (0.2 s); the page only takes its drawn plots
    from hx.report.figures import Plot

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1180px;
       padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h1 code { font-size: 1.5rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 0.2rem 1rem; margin: 1rem 0; }
dl.meta dt { font-weight: 600; color: #555; } dl.meta dd { margin: 0; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.92rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
th { background: #f4f4f4; } td.text, th.text { text-align: left; }
figure { margin: 1.2rem 0 2rem; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9rem; color: #444; margin-top: 0.4rem; max-width: 60rem; }
.up { color: #2a7a2a; } .down { color: #b03030; } .muted { color: #777; }
"""


def data_uri(png: bytes) -> str:
    """A PNG as a ``data:`` URI.

    >>> data_uri(b"\\x89PNG")
    'data:image/png;base64,iVBORw=='
    """
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _change(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "<td>–</td>"
    points = 100 * (after - before)
    kind = "up" if points > 0 else "down" if points < 0 else "muted"
    return f'<td class="{kind}">{points:+.1f} pts</td>'


def _table(headers: Sequence[str], rows: Iterable[str], text_columns: int = 1) -> str:
    head = "".join(f'<th class="text">{escape(h)}</th>' if i < text_columns else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = "".join(rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>" if body else (
        '<p class="muted">(none)</p>')


def heldout_table(data: ReportData) -> str:
    """Held-out pass@1 and pass@2 per game and overall, before the first round and after the last evaluation."""
    s = data.summary
    rows = []

    def row(name: str, tasks: int, before: GameScore | None, after: GameScore | None) -> str:
        b2, a2 = (before.pass_at_2 if before else None), (after.pass_at_2 if after else None)
        return (f'<tr><td class="text">{escape(name)}</td><td>{tasks}</td>'
                f"<td>{_rate(before.pass_at_1 if before else None)}</td><td>{_rate(b2)}</td>"
                f"<td>{_rate(after.pass_at_1 if after else None)}</td><td>{_rate(a2)}</td>{_change(b2, a2)}</tr>")
    for game, before, after in s.games():
        known = before or after
        rows.append(row(game, known.tasks if known else 0, before, after))
    hb, ha = s.heldout_before, s.heldout_after
    if hb is not None or ha is not None:
        overall = [GameScore(game="all", tasks=h.tasks, pass_at_1=h.pass_at_1, pass_at_2=h.pass_at_2)
                   if h is not None else None for h in (hb, ha)]
        scored = hb or ha
        rows.append(row("all games", scored.tasks if scored else 0, overall[0], overall[1]))
    after_round = f"after round {ha.round}" if ha is not None else "after"
    return _table(["game", "tasks", "pass@1 before", "pass@2 before", f"pass@1 {after_round}",
                   f"pass@2 {after_round}", "pass@2 change"], rows)


def rounds_table(data: ReportData) -> str:
    """One row per round: outcome, adaptation pass@k (per variant), ships, forks, regressions, shipped candidates,
    and the round's wall time (from one signed decision time to the next)."""
    rows = []
    for r in data.rounds:
        per_variant = ", ".join(f"{v} {share:.2f}" for v, share in r.variants.items())
        rows.append(f'<tr><td>{r.round}</td><td class="text">{escape(r.outcome)}</td><td>{_rate(r.pass_at_k)}</td>'
                    f'<td class="text">{escape(per_variant) or "–"}</td><td>{r.ships}</td><td>{r.forks}</td>'
                    f"<td>{r.retirements}</td><td>{r.regressions}</td>"
                    f'<td class="text">{escape(", ".join(r.shipped_names)) or "–"}</td>'
                    f"<td>{'–' if r.took_s is None else f'{r.took_s:.1f} s'}</td></tr>")
    return _table(["round", "outcome", "pass@k", "per variant", "ships", "forks", "retired", "regressions",
                   "shipped or forked", "wall time"], rows, text_columns=1)


def tokens_table(data: ReportData) -> str:
    """One row per round: input / output tokens of each meta-model stage, of the task agent, and the cost the
    providers reported ("–" for a round decided before hx counted tokens)."""
    stages = list(dict.fromkeys(s for r in data.rounds if r.tokens is not None for s in r.tokens.meta))
    rows = []
    for r in data.rounds:
        t = r.tokens
        if t is None:
            cells = "<td>–</td>" * (len(stages) + 2)
        else:
            usages = [t.meta.get(s) for s in stages] + [t.agent]
            cells = "".join("<td>–</td>" if u is None else f"<td>{u.input_tokens:,} / {u.output_tokens:,}</td>"
                            for u in usages) + f"<td>{t.meta_total.cost_usd + t.agent.cost_usd:.4f}</td>"
        rows.append(f"<tr><td>{r.round}</td>{cells}</tr>")
    return _table(["round", *(f"{s} in / out" for s in stages), "task agent in / out", "cost (USD, reported)"],
                  rows)


def rules_section(data: ReportData) -> str:
    """The "Rules shipped" section: per variant, each rule a ship or fork put into its harness, as a sentence, its
    support, the round it shipped in, the candidate and whether the variant still holds it ("" when none shipped)."""
    if not data.rules:
        return ""
    parts = ['<h2 id="rules">Rules shipped</h2>\n']
    for variant in dict.fromkeys(r.variant for r in data.rules):
        rows = [f"<tr>{_text(sentence(r.rule))}{_text(support_phrase(r.support) if r.support else '')}"
                f"{_text(r.candidate)}{_text(r.status)}<td>{r.round}</td></tr>" for r in data.rules
                if r.variant == variant]
        parts.append(f'<h3 data-variant="{escape(variant)}">Variant <code>{escape(variant)}</code></h3>\n'
                     + _table(["rule", "support", "candidate", "status", "shipped in round"], rows, text_columns=4)
                     + "\n")
    return "".join(parts)


def _bounds(b: Bounds) -> str:
    return f"<td>{bounds_text(b.estimate, b.low, b.high)}</td>"


def _text(value: str) -> str:
    return f'<td class="text">{escape(value) or "–"}</td>'


def evals_table(evals: EvalData) -> str:
    """One row per eval shown: its run, suite, tasks and attempts, success, criteria and composite with intervals,
    and the keep rule's verdict against its base eval if it was compared."""
    rows = []
    for p in evals.evals:
        s = p.scored
        against = f"{s.verdict} vs {s.against}" if s.against else ""
        rows.append(f"<tr>{_text(s.run_id)}{_text(s.suite)}<td>{s.tasks}</td><td>{s.attempts}</td>"
                    f"{_bounds(s.success)}{_bounds(s.criteria)}{_bounds(s.composite)}{_text(against)}"
                    f"{_text(', '.join(s.judged_runs))}</tr>")
    return _table(["eval", "suite", "tasks", "attempts", "success", "criteria", "composite", "keep rule",
                   "judged runs"], rows, text_columns=2)


def tasks_table(evals: EvalData) -> str:
    """The latest eval's per-task scores: attempts, passes, criteria passed, success, criteria and composite."""
    rows = [f"<tr>{_text(t.suite_task)}{_text(t.task)}<td>{t.weight:g}</td><td>{t.passes}/{t.attempts}</td>"
            f"<td>{t.criteria_passed}/{t.criteria_checked}</td>{_bounds(t.success)}{_bounds(t.criteria)}"
            f"{_bounds(t.composite)}</tr>" for t in evals.tasks]
    return _table(["suite task", "task", "weight", "passed", "criteria passed", "success", "criteria", "composite"],
                  rows, text_columns=2)


def eval_section(evals: EvalData, plot: Plot | None) -> str:
    """The "Eval suite" section: the figure over time, a row per eval, the latest eval's per-task table."""
    latest = evals.latest
    if latest is None:
        return ""
    which = "every eval on the log" if evals.everything else "the evals that judged this run"
    return ((figure(plot) if plot is not None else '<h2 id="eval_suite">Eval suite</h2>\n')
            + f'<p class="muted">{escape(which)}</p>\n{evals_table(evals)}\n'
            + f"<h3>Per task, latest eval <code>{escape(latest.run_id)}</code></h3>\n{tasks_table(evals)}\n")


def experiments_section(evals: EvalData) -> str:
    """The "Experiments" section: per experiment its levels' means, its effects and verdicts, its falsification
    verdict and the panel's decision (when reviewed)."""
    if not evals.experiments:
        return ""
    parts = ['<h2 id="experiments">Experiments</h2>\n']
    for x in evals.experiments:
        c = x.concluded
        meta = [("run", f"<code>{escape(x.run_id)}</code>"), ("hypothesis", escape(x.hypothesis) or "–"),
                ("units", str(c.units)), ("falsification", escape(c.falsified) + (
                    f' <span class="muted">({escape(c.detail)})</span>' if c.detail else "")),
                ("panel decision", escape(x.decision) or '<span class="muted">not reviewed</span>')]
        levels = [f"<tr>{_text(v.variable)}{_text(v.level)}<td>{v.n}</td>{_bounds(v.mean)}</tr>" for v in c.levels]
        effects = [f"<tr>{_text(e.variable)}{_text(e.factor)}{_text(f'{e.level} vs {e.reference}')}"
                   f"{_bounds(e.difference)}{_bounds(e.effect_size)}{_text(e.verdict)}</tr>" for e in c.effects]
        interactions = [f"<tr>{_text(i.variable)}{_text(' x '.join(i.factors))}{_bounds(i.contrast)}</tr>"
                        for i in c.interactions]
        parts.append(f'<h3 data-experiment="{escape(x.run_id)}">{escape(x.title)}</h3>\n<dl class="meta">'
                     + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta) + "</dl>\n"
                     + _table(["variable", "level", "units", "mean"], levels, text_columns=2) + "\n"
                     + _table(["variable", "factor", "level", "difference", "effect size", "verdict"], effects,
                              text_columns=3) + "\n"
                     + (_table(["variable", "factors", "interaction contrast"], interactions, text_columns=2)
                        + "\n" if interactions else ""))
    return "".join(parts)


def figure(plot: Plot) -> str:
    """A figure: its title, the PNG inline, its caption (and the file the same PNG was written to)."""
    return (f'<h2 id="{escape(plot.name)}">{escape(plot.title)}</h2>\n<figure>'
            f'<img src="{data_uri(plot.png)}" alt="{escape(plot.title)}" data-figure="{escape(plot.name)}">'
            f"<figcaption>{escape(plot.caption)} <span class=\"muted\">({escape(plot.name)}.png)</span>"
            "</figcaption></figure>\n")


def page(data: ReportData, plots: Sequence[Plot]) -> str:
    """The whole report page."""
    s = data.summary
    status = escape(s.status) + (f" <span class=\"muted\">({escape(data.reason)})</span>" if data.reason else "")
    meta = [("benchmarks", escape(", ".join(data.benches)) or "–"), ("model", escape(data.model) or "–"),
            ("strategy", escape(data.strategy)), ("rounds", str(len(data.rounds))), ("status", status),
            ("live variants", escape(", ".join(f"{v} ({d[:19]})" for v, d in s.variants.items())) or "–"),
            ("ledger events", str(data.ledger_events))]
    if data.coevolution:
        meta.append(("learner passes", f"{len(data.learner)}; final policy {escape(s.policy[:12]) or '(unchanged)'}"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta)
    run_plots = [p for p in plots if p.name != EVAL_FIGURE]
    eval_plot = next((p for p in plots if p.name == EVAL_FIGURE), None)
    links = [("rules", "Rules shipped")] * bool(data.rules) + [(p.name, p.title) for p in run_plots] + [
        ("eval_suite", "Eval suite")] * bool(data.evals.evals) + [
        ("experiments", "Experiments")] * bool(data.evals.experiments)
    contents = " · ".join(f'<a href="#{escape(name)}">{escape(title)}</a>' for name, title in links)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>hx report: {escape(data.run_id)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>Evolution run <code>{escape(data.run_id)}</code></h1>\n<dl class=\"meta\">{dl}</dl>\n"
            f"<p>{contents}</p>\n"
            f"<h2>Held-out (frozen test split)</h2>\n{heldout_table(data)}\n"
            f"<h2>Rounds</h2>\n{rounds_table(data)}\n{rules_section(data)}"
            f"<h2 id=\"tokens\">Tokens per round</h2>\n{tokens_table(data)}\n"
            + "".join(figure(p) for p in run_plots)
            + eval_section(data.evals, eval_plot) + experiments_section(data.evals)
            + "</body>\n</html>\n")


def report_files(data: ReportData, plots: Sequence[Plot]) -> dict[str, bytes]:
    """The report's files by name: ``report.html`` and one ``<figure>.png`` per figure."""
    return {"report.html": page(data, plots).encode(), **{f"{p.name}.png": p.png for p in plots}}
