"""``hx report`` on real runs: a toy ``hx evolve`` and a tiny ``hx coevolve`` on a real nats-server, their reports
written, the PNGs decoded, the page opened in headless Chromium, the bytes reproducible, the log untouched."""

from __future__ import annotations

import asyncio
import base64
import io
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
from hx_cli import error_line, hx, ok
from ledger_run import LedgerRun, attach, task
from matplotlib.image import imread

from hx.aegis import levers
from hx.aegis.ledger import read_records
from hx.aegis.metrics import metrics
from hx.harness.config import HarnessConfig
from hx.report.data import ReportData, learner_records
from hx.report.export import scoreboard, ship_outcome
from hx.report.export_fold import RunFold
from hx.report.figures import BUCKET_COLOURS, figures, hit_cell, ship_cell
from hx.report.html import page
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.ledger import HarnessShipped, HeldoutScored, LedgerOpened, RoundDecided, RoundTokens, VariantForked
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess
from streams.topology import LEARN, LEDGER

EVOLVE, COEVOLVE = "report-evolve", "report-coevolve"
EVOLVE_FIGURES = ["evolution", "lever_mix", "hit_rate", "ship_rate", "timeline"]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@dataclass(frozen=True)
class Log:
    """The module's nats-server and a data dir for the commands' results files."""

    url: str
    data: Path

    def hx(self, *args: str) -> list[str]:
        """The root options that point a command at this log."""
        return ["--nats-url", self.url, "--data-dir", str(self.data), *args]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Log]:
    """One real nats-server for the module's runs (each run has its own id)."""
    root = tmp_path_factory.mktemp("report")
    proc = NatsProcess(root / "nats")
    proc.start(detach=False)
    try:
        yield Log(proc.url, root / "data")
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def evolved(log: Log) -> str:
    """A real three-round evolution of the toy world (two games, so variants can fork), held-out every round."""
    ok(hx(*log.hx("evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8",
                  "--heldout-tasks", "2", "--rounds", "3", "--max-steps", "30", "--seed", "3", "--concurrency", "2",
                  "--heldout-every", "1", "--run-id", EVOLVE)))
    return EVOLVE


@pytest.fixture(scope="module")
def coevolved(log: Log) -> str:
    """A tiny real co-evolution (harness and policy) of the toy world: learner records on HX_LEARN."""
    ok(hx(*log.hx("coevolve", "--mode", "both", "--bench", "toyworld:rooms", "--tasks", "4", "--heldout-tasks", "2",
                  "--rounds", "2", "--max-steps", "30", "--concurrency", "2", "--policy-gate", "--run-id", COEVOLVE)))
    return COEVOLVE


def on_log(url: str, run_id: str) -> tuple[ReportData, int, int]:
    """The run's report data read back in-process, and the last sequences of HX_LEDGER and HX_LEARN."""
    async def go() -> tuple[ReportData, int, int]:
        async with connect(NatsSettings(url=url)) as conn:
            records = await read_records(conn, run_id)
            assert records is not None
            learner = await learner_records(conn.log, run_id)
            return (ReportData.of(records, learner), await conn.log.last_seq(LEDGER.name),
                    await conn.log.last_seq(LEARN.name))
    return asyncio.run(go())


# --- what the page and the PNGs must be ----------------------------------------------------------------------


class Images(HTMLParser):
    """The ``<img>`` elements of a page: (data-figure, src)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            a = dict(attrs)
            self.found.append((a.get("data-figure") or "", a.get("src") or ""))


def images(html: str) -> list[tuple[str, str]]:
    """A page's images in order."""
    parser = Images()
    parser.feed(html)
    return parser.found


def pixels(png: bytes) -> np.ndarray:
    """A PNG decoded to an RGB(A) array, checked to be a real picture: a sensible size and many colours."""
    image = imread(io.BytesIO(png), format="png")
    height, width = image.shape[:2]
    assert 300 <= height <= 4000 and 500 <= width <= 2000, image.shape
    # One integer per pixel: np.unique over rows (axis=0) sorts tuples and takes seconds on a screenshot.
    channels = np.rint(image.reshape(-1, image.shape[2]) * 255).astype(np.uint32)
    colours = np.unique(sum(channels[:, i] << (8 * i) for i in range(channels.shape[1])))
    assert len(colours) > 50, f"only {len(colours)} colours: blank or flat"
    return image


def holds(image: np.ndarray, hex_colour: str, at_least: int = 200) -> bool:
    """True when at least ``at_least`` pixels are (within anti-aliasing) the colour ``#rrggbb``."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    close = np.all(np.abs(image[..., :3] - rgb) < 0.02, axis=-1)
    return int(close.sum()) >= at_least


def check_report(out: Path, run_id: str, names: list[str]) -> str:
    """The report's files: the page embeds exactly the PNG files written beside it, each a real picture."""
    assert sorted(p.name for p in out.iterdir()) == sorted(["report.html", *(f"{n}.png" for n in names)])
    html = (out / "report.html").read_text()
    found = images(html)
    assert [name for name, _ in found] == names
    for name, src in found:
        assert src.startswith("data:image/png;base64,")
        png = (out / f"{name}.png").read_bytes()
        assert base64.b64decode(src.split(",", 1)[1]) == png
        pixels(png)
    assert f"<code>{run_id}</code>" in html and "Held-out (frozen test split)" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html  # self-contained, no network
    return html


def browser() -> str:
    """The headless browser on this machine; a clear failure (not a skip) when there is none."""
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.fail("no headless Chromium on PATH (looked for chromium, chromium-browser, google-chrome): install it "
                    "with `apt-get install chromium` (.ci/run does this)")
    return found


def chromium(path: Path, profile: Path, *args: str) -> str:
    """Run headless Chromium on a local page; its stdout."""
    done = subprocess.run([browser(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                           f"--user-data-dir={profile}", *args, path.resolve().as_uri()],
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def check_renders(path: Path, tmp: Path, names: list[str]) -> np.ndarray:
    """The page opened in Chromium: its DOM holds every figure as a data URI, and the screenshot shows them."""
    dom = chromium(path, tmp / "profile-dom", "--dump-dom")
    found = images(dom)
    assert [name for name, _ in found] == names and all(s.startswith("data:image/png;base64,") for _, s in found)
    shot = tmp / "screenshot.png"
    chromium(path, tmp / "profile-shot", f"--screenshot={shot}", "--window-size=1200,4000")
    return pixels(shot.read_bytes())


# --- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_report_of_an_evolution_run(log: Log, evolved: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data, ledger_before, learn_before = on_log(log.url, evolved)
    # The data the figures plot is the ledger's: rounds, held-out every round, ships and forks per round.
    async def ledger() -> list[object]:
        async with connect(NatsSettings(url=log.url)) as conn:
            return list(await read_records(conn, evolved) or [])
    records = asyncio.run(ledger())
    decided = [r for r in records if isinstance(r, RoundDecided)]
    assert [r.round for r in data.rounds] == [d.round for d in decided] == [0, 1, 2]
    assert [r.pass_at_k for r in data.rounds] == [d.metrics.pass_at_k for d in decided]
    assert [h.round for h in data.heldout] == [h.round for h in records if isinstance(h, HeldoutScored)]
    assert [h.round for h in data.heldout] == [-1, 0, 1, 2]  # before, and after every round (--heldout-every 1)
    assert sum(r.ships for r in data.rounds) == sum(isinstance(r, HarnessShipped) for r in records)
    assert sum(r.forks for r in data.rounds) == sum(isinstance(r, VariantForked) for r in records)
    assert all(sum(r.shipped.values()) <= sum(r.proposed.values()) for r in data.rounds)
    assert not data.coevolution and data.benches == ("toyworld:rooms", "toyworld:bell")
    # each round's wall time, from one signed decision time to the next
    opened = next(r for r in records if isinstance(r, LedgerOpened))
    since = [opened.at_ns, *(d.at_ns for d in decided[:-1])]
    assert [r.took_s for r in data.rounds] == [(d.at_ns - s) / 1e9 for d, s in zip(decided, since, strict=True)]
    assert all(t is not None and t > 0 for t in (r.took_s for r in data.rounds))

    # The default directory is ./reports/RUN.
    monkeypatch.chdir(tmp_path)
    result = ok(hx(*log.hx("report", evolved)))
    out = tmp_path / "reports" / evolved
    assert str(out.relative_to(tmp_path) / "report.html") in result.stdout
    html = check_report(out, evolved, EVOLVE_FIGURES)
    assert "toyworld:rooms, toyworld:bell" in html and "learner" not in html.lower()
    for d, r in zip(decided, data.rounds, strict=True):
        assert f"<td>{d.round}</td><td class=\"text\">{d.outcome}</td>" in html
        assert f"<td>{r.took_s:.1f} s</td></tr>" in html

    # The same log gives the same bytes; reading it wrote nothing to it.
    again = tmp_path / "again"
    ok(hx(*log.hx("report", evolved, "--out", str(again))))
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {p.name: p.read_bytes() for p in out.iterdir()}
    assert on_log(log.url, evolved)[1:] == (ledger_before, learn_before)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = error_line(hx(*log.hx("report", evolved, "--out", str(blocker / "out"))))
    assert line == f"error: cannot write the report to {blocker / 'out'}: {blocker} is not a directory"

    # Chromium renders the page with its figures: the DOM has them, and the screenshot shows their colours.
    shot = check_renders(out / "report.html", tmp_path, EVOLVE_FIGURES)
    assert holds(shot, "#2a9d8f")  # the held-out curve of the evolution figure
    if any(sum(r.lever_mix.values()) for r in data.rounds):
        assert any(holds(shot, c) for c in BUCKET_COLOURS.values())  # the lever-mix bars


@pytest.mark.slow
def test_the_report_of_a_coevolution_run_has_the_learner_curves(log: Log, coevolved: str, tmp_path: Path) -> None:
    data, _, _ = on_log(log.url, coevolved)
    assert data.coevolution and all(isinstance(u, PolicyUpdated | UpdateSkipped) for u in data.learner)
    gates = [g for g in data.summary.learner if isinstance(g, PolicyGated)]
    assert gates and len(gates) == sum(isinstance(u, PolicyUpdated) for u in data.learner)  # --policy-gate
    assert data.rejected == [g.through_round for g in gates if not g.adopted]
    last = gates[-1]  # the policy the report names is the one the last verdict left in use
    assert data.summary.policy == (last.candidate if last.adopted else last.parent)
    ok(hx(*log.hx("report", coevolved, "--out", str(tmp_path / "out"))))
    names = [*EVOLVE_FIGURES, "learner"]
    html = check_report(tmp_path / "out", coevolved, names)
    assert f"learner passes</dt><dd>{len(data.learner)};" in html
    learner_png = pixels((tmp_path / "out" / "learner.png").read_bytes())
    assert holds(learner_png, "#1f77b4", at_least=50)  # the learner's lines (matplotlib's first colour)
    check_renders(tmp_path / "out" / "report.html", tmp_path, names)


def test_a_run_that_does_not_exist_is_a_one_line_error(nats_url: str, tmp_path: Path) -> None:
    line = error_line(hx("--nats-url", nats_url, "--data-dir", str(tmp_path), "report", "no-such-run",
                         "--out", str(tmp_path / "out")))
    assert "no-such-run" in line and "no ledger" in line
    assert not (tmp_path / "out").exists()
    bad = hx("--nats-url", nats_url, "report", "../etc")
    assert bad.exit_code == 2 and "run id" in bad.stderr


def test_a_run_with_no_round_yet_still_has_every_figure() -> None:
    """A ledger just opened (a run that has not finished its first round) reports empty axes, not a failure."""
    harness = HarnessConfig()
    data = ReportData.of([LedgerOpened(run_id="just-opened", strategy="global", harness=harness.spec(),
                                       digest=harness.digest)])
    plots = figures(data)
    assert [p.name for p in plots] == EVOLVE_FIGURES and data.rounds == [] and data.heldout == []
    for p in plots:
        pixels(p.png)
    assert [name for name, _ in images(page(data, plots))] == EVOLVE_FIGURES


def test_hit_rate_is_realised_over_predicted_flips_everywhere_and_ship_rate_is_its_own_figure() -> None:
    """Round 0 proposes three candidates and ships one predicting four flips; round 1 runs three of those tasks and
    solves two: the hit rate is 2/3 in every place that names one, the ship rate (1/3) only in its own figure."""
    run = LedgerRun()
    run.ship(0, "C-R0-01", (attach("undo_guard"),), ["twx:a:1", "twx:a:2", "twx:a:3", "twx:a:9"])
    run.proposed(0, "C-R0-02", (attach("explore_untried"),))
    run.proposed(0, "C-R0-03", (attach("visited_states"),))
    run.digested(1, [task("twx:a:1", passes=1), task("twx:a:2"), task("twx:a:3", passes=2), task("twx:b:1")])
    (bucket,) = run.state.candidates["C-R0-01"].proposal.buckets
    assert all(run.state.candidates[c].proposal.buckets == (bucket,) for c in ("C-R0-02", "C-R0-03"))
    data = ReportData.of(run.records)
    first = data.rounds[0]
    assert (first.proposed[bucket], first.shipped[bucket], first.predicted[bucket], first.realised[bucket]) == (
        3, 1, 3, 2)
    assert hit_cell(first, bucket) == (2 / 3, "2/3") and ship_cell(first, bucket) == (1 / 3, "1/3\ngate 1")
    assert hit_cell(data.rounds[1], bucket)[1] == "-"  # round 1 shipped nothing
    plots = {p.name: p for p in figures(data)}
    assert "realised / predicted flips" in plots["hit_rate"].title and "shipped / proposed" in plots["ship_rate"].title
    assert "Not the hit rate" in plots["ship_rate"].caption
    # the same number wherever a hit rate is named: the levers, the round's metrics, the scoreboard, the ship outcomes
    state = run.state
    assert levers.hit_rates(state, "undo_guard") == {0: 2 / 3}
    (lever,) = levers.records(state, ["undo_guard"])
    assert lever.hit_rate == 2 / 3
    assert metrics(state, 1, 0, RoundTokens()).hit_rate == 2 / 3
    fold = RunFold.of(run.records)
    board = scoreboard(fold)
    assert board["buckets"][bucket]["hit_rate"] == board["levers"]["undo_guard"]["hit_rate"] == 0.6667
    assert ship_outcome(fold, state.ships[0])["hit_rate"] == 0.6667
