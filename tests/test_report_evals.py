"""``hx report``'s "Eval suite" and "Experiments" sections over a real nats-server with hand-appended events.

Two evolution ledgers (just opened) and, on the trace, suite scores, task scores and experiment
conclusions: some about the first run, some about nothing of it. The page shows what is about
the run (everything with ``--evals``), with the figures the events hold, and a run that nothing
judged gets neither section.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from hx_cli import hx, ok

from hx.aegis.ledger import Ledger
from hx.harness.config import HarnessConfig
from schemas.evaluation import Bounds, SuiteScored, TaskScored
from schemas.event import Event
from schemas.experiment import EffectSummary, ExperimentConcluded, ExperimentStarted, LevelSummary
from schemas.ledger import LedgerOpened
from streams.config import NatsSettings
from streams.connection import connect
from streams.topology import trace_subject

RUN, PLAIN = "evolve-judged", "evolve-plain"


def b(estimate: float, low: float, high: float) -> Bounds:
    """An estimate and its interval."""
    return Bounds(estimate=estimate, low=low, high=high, method="bootstrap tasks+attempts")


def suite(eval_run: str, composite: Bounds, judged: str, *, against: str = "") -> SuiteScored:
    """An eval's suite score over two tasks."""
    return SuiteScored(run_id=eval_run, suite="default", suite_digest="sha256:1", mode="fast", tasks=2, attempts=6,
                       success=b(0.5, 0.2, 0.8), criteria=b(0.75, 0.5, 0.9), composite=composite,
                       judged_runs=(judged,), against=against, verdict="keep" if against else "")


def task(eval_run: str, name: str, passes: int, composite: Bounds) -> TaskScored:
    """A suite task's scores in an eval, three attempts."""
    return TaskScored(run_id=eval_run, suite_task=name, task=f"toyworld:rooms:dev:{len(name)}", attempts=3,
                      passes=passes, criteria_checked=6, criteria_passed=4, success=b(passes / 3, 0.1, 0.9),
                      criteria=b(4 / 6, 0.3, 0.9), composite=composite)


def concluded(exp_run: str) -> ExperimentConcluded:
    """An experiment's conclusion: two levels, one effect kept, not falsified."""
    levels = (LevelSummary(variable="passed", level="off", n=12, mean=b(0.25, 0.1, 0.45)),
              LevelSummary(variable="passed", level="on", n=12, mean=b(0.625, 0.4, 0.8)))
    effect = EffectSummary(variable="passed", factor="trim", level="on", reference="off",
                           difference=b(0.375, 0.125, 0.6), effect_size=b(0.9, 0.3, 1.5), verdict="keep")
    return ExperimentConcluded(run_id=exp_run, spec_digest="sha256:2", units=24, levels=levels, effects=(effect,),
                               falsified="not_falsified", detail="diff_high(passed, 'on', 'off') = 0.6 <= 0")


def started(exp_run: str, title: str, harness_from: str) -> ExperimentStarted:
    """An experiment's start, its spec naming the run its harness comes from."""
    return ExperimentStarted(run_id=exp_run, spec={"title": title, "hypothesis": "trimming helps",
                                                   "controlled_variables": {"harness": {"run": harness_from}}},
                             spec_digest="sha256:2")


async def _write(url: str, *, scores: bool = True) -> None:
    async with connect(NatsSettings(url=url)) as c:
        harness = HarnessConfig()
        for run_id in (RUN, PLAIN):
            ledger = Ledger(c, run_id)
            try:
                await ledger.start(LedgerOpened(run_id=run_id, strategy="global", harness=harness.spec(),
                                                digest=harness.digest))
            finally:
                await ledger.close()
        events: list[tuple[str, Event]] = [
            (trace_subject("eval-1"), suite("eval-1", b(0.55, 0.41, 0.7), RUN)),
            (trace_subject("eval-1", 0), task("eval-1", "rooms", 1, b(0.4, 0.2, 0.6))),
            (trace_subject("eval-x"), suite("eval-x", b(0.9, 0.8, 0.95), "someone-else")),
            (trace_subject("eval-2"), suite("eval-2", b(0.625, 0.5, 0.75), RUN, against="eval-1")),
            (trace_subject("eval-2", 0), task("eval-2", "rooms", 2, b(0.7, 0.5, 0.85))),
            (trace_subject("eval-2", 0), task("eval-2", "bell", 1, b(0.55, 0.3, 0.7))),
            (trace_subject("exp-1"), started("exp-1", "Trim on or off", RUN)),
            (trace_subject("exp-1"), concluded("exp-1")),
            (trace_subject("exp-2"), started("exp-2", "Someone else's", "other-run")),
            (trace_subject("exp-2"), concluded("exp-2")),
        ]
        for subject, event in events if scores else ():
            await c.log.append(subject, event)


@pytest.fixture
def url(nats_url: str) -> str:
    """The test's own nats-server, with the two ledgers and the eval and experiment events on it."""
    asyncio.run(_write(nats_url))
    return nats_url


def report(url: str, out: Path, run_id: str, *extra: str) -> str:
    """``hx report RUN`` into ``out``; the page."""
    ok(hx("--nats-url", url, "--data-dir", str(out.parent / "data"), "report", run_id, "--out", str(out), *extra))
    return (out / "report.html").read_text()


def section(html: str, anchor: str) -> str:
    """The page from the section's heading to the next section's (``<h2``)."""
    start = html.index(f'<h2 id="{anchor}">')
    end = html.find("<h2", start + 1)
    return html[start:end if end >= 0 else len(html)]


def rows(html: str) -> list[list[str]]:
    """Every table body row's cell texts."""
    body = "".join(re.findall(r"<tbody>(.*?)</tbody>", html, re.S))
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def no_sections(html: str, out: Path) -> None:
    """Neither section, no empty heading, no eval figure: the run's own report as before."""
    assert "Eval suite" not in html and "Experiments" not in html and 'id="eval_suite"' not in html
    assert not (out / "eval_suite.png").exists() and "<h2>Rounds</h2>" in html


def test_the_report_shows_the_evals_and_experiments_about_the_run(url: str, tmp_path: Path) -> None:
    """The evals that judged RUN over time, the latest's tasks, the experiment naming RUN; ``--evals`` all of them;
    a run nothing judged gets neither section."""
    html = report(url, tmp_path / "judged", RUN)
    evals = section(html, "eval_suite")
    assert 'data-figure="eval_suite"' in evals and (tmp_path / "judged" / "eval_suite.png").stat().st_size > 0
    per_eval, per_task = evals.split("<h3>")
    assert rows(per_eval) == [
        ["eval-1", "default", "2", "6", "0.500 [0.200, 0.800]", "0.750 [0.500, 0.900]", "0.550 [0.410, 0.700]", "–",
         RUN],
        ["eval-2", "default", "2", "6", "0.500 [0.200, 0.800]", "0.750 [0.500, 0.900]", "0.625 [0.500, 0.750]",
         "keep vs eval-1", RUN]]
    assert "latest eval <code>eval-2</code>" in per_task
    assert rows(per_task) == [
        ["bell", "toyworld:rooms:dev:4", "1", "1/3", "4/6", "0.333 [0.100, 0.900]", "0.667 [0.300, 0.900]",
         "0.550 [0.300, 0.700]"],
        ["rooms", "toyworld:rooms:dev:5", "1", "2/3", "4/6", "0.667 [0.100, 0.900]", "0.667 [0.300, 0.900]",
         "0.700 [0.500, 0.850]"]]
    experiments = section(html, "experiments")
    assert experiments.count("<h3 ") == 1 and ">Trim on or off</h3>" in experiments
    assert "not_falsified" in experiments and "not reviewed" in experiments and "24" in experiments
    assert rows(experiments) == [["passed", "off", "12", "0.250 [0.100, 0.450]"],
                                 ["passed", "on", "12", "0.625 [0.400, 0.800]"],
                                 ["passed", "trim", "on vs off", "0.375 [0.125, 0.600]", "0.900 [0.300, 1.500]",
                                  "keep"]]

    everything = report(url, tmp_path / "all", RUN, "--evals")
    assert [r[0] for r in rows(section(everything, "eval_suite").split("<h3>")[0])] == ["eval-1", "eval-x", "eval-2"]
    # A run no eval judged and no experiment names, on the same log: neither section.
    no_sections(report(url, tmp_path / "plain", PLAIN), tmp_path / "plain")
    assert section(everything, "experiments").count('<h3 data-experiment="exp-2">Someone else&#x27;s</h3>') == 1


def test_a_log_with_no_eval_or_experiment_has_neither_section_even_with_evals(nats_url: str, tmp_path: Path) -> None:
    """``--evals`` on a log holding no suite score and no experiment: no empty section."""
    asyncio.run(_write(nats_url, scores=False))
    no_sections(report(nats_url, tmp_path / "bare", RUN, "--evals"), tmp_path / "bare")
