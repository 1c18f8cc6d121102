"""``hx export``: the files rendered from a hand-built two-round ledger, and the command end to end on a real run.

The hand-built ledger (every kind of round outcome, a revision, a build error, a fork) is
rendered as ``hx export`` renders a run (``hx.report.export.render``) and read back; the command
itself, which first verifies the run's ledger against the trace, runs on a real evolution run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import msgspec
import pytest
from audit_kit import EvolvedRun, evolved_run
from hx_cli import error_line, ok
from ledger_forger import ledger_of
from ledger_run import attach

from hx.aegis.ledger import EvolutionLedger
from hx.aegis.operations import buckets_of, dimensions_of
from hx.cli import export as export_cli
from hx.cli.trajectories import CONVERSATION, read_trajectory
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import CompositionError
from hx.harnesses import starter_harness
from hx.replay.trace_rounds import trace_marks
from hx.report.export import render
from schemas.edits import Anchor, Attach, Manifest
from schemas.event import event_type
from schemas.landscape import Continuity, FailureGroup, Landscape, Regression, TaskDigest
from schemas.ledger import (
    CandidateConcern,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GameScore,
    GateCheck,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    LedgerOpened,
    RoundDecided,
    RoundDigested,
    RoundMetrics,
    TaskFlip,
    VariantForked,
    ledger_digest,
)
from schemas.lifecycle import AttemptFinished, AttemptStarted
from streams.config import NatsSettings
from streams.connection import connect

RUN = "evo-export"
A, B, C, D = "toy:walk:dev:100", "toy:walk:dev:101", "toy:easy:dev:100", "toy:easy:dev:101"
CHECKS = ("manifest", "config", "smoke", "leakage", "counterfactual", "seesaw", "effect")
MAIN_TRACE_ROUNDS = {0: 1, 1: 4}
"""Evolution round -> the trace round of its main rollout (0 is the held-out round before, 2, 3 gates)."""


def digest(task: str, solved: bool, *, category: str = "", continuity: Continuity = "new", variant: str = "v0",
           implicated: tuple[str, ...] = ()) -> TaskDigest:
    return TaskDigest(task=task, cluster=":".join(task.split(":")[:2]), variant=variant, attempts=2,
                      passes=1 if solved else 0, category="" if solved else category, continuity=continuity,
                      implicated=implicated, evidence=(Anchor(seq=10, index=2, note="step 3: refused"),),
                      features={"invalid_rate": 0.25, "steps": 12.0})


def checks(fail_at: str = "", detail: str = "") -> tuple[GateCheck, ...]:
    out = []
    for name in CHECKS:
        out.append(GateCheck(name=name, passed=name != fail_at, detail=detail if name == fail_at else "ok"))
        if name == fail_at:
            break
    return tuple(out)


def proposal(rnd: int, cid: str, base: HarnessConfig, ops: tuple[Attach, ...], manifest: Manifest,
             variant: str = "v0") -> CandidateProposed:
    return CandidateProposed(run_id=RUN, round=rnd, candidate=cid, variant=variant, evolver="offline",
                             operations=ops, buckets=buckets_of(ops), dimensions=dimensions_of(ops, base),
                             manifest=manifest, base_digest=base.digest, digest=apply(base, ops).digest, risk=0.1)


def build_ledger() -> tuple[list[LedgerEvent], dict[str, str]]:
    """A small realistic run: round 0 ships one candidate and rejects one, round 1 forks; held-out before/after.

    Its events, chained as the ledger aggregate chains them, and each candidate's harness digest.
    """
    h0 = starter_harness("textworld")
    pruner = (attach("action_pruner"),)
    h1 = apply(h0, pruner)
    objects = (attach("task_objects"),)
    objects_revised = (attach("task_objects", min_length=4),)
    h2 = apply(h1, objects)
    settings = {"run_id": RUN, "benches": ["toy:walk", "toy:easy"], "adaptation": [A, B, C, D],
                "heldout": [f"toy:walk:test:{200 + i}" for i in range(6)], "model": "random:", "attempts": 2,
                "settings": {"rounds": 2, "patience": 3, "strategy": "ensemble"}}
    r0 = (digest(A, True), digest(B, False, category="invalid_action"), digest(C, True),
          digest(D, False, category="no_progress"))
    r1 = (digest(A, False, category="loop", continuity="newly_failing", implicated=("action_pruner",)),
          digest(B, True, continuity="recovered", implicated=("action_pruner",)),
          digest(C, True, continuity="solved"), digest(D, False, category="no_progress",
                                                       continuity="persistent_failure"))
    m01 = Manifest(intended_effect="stop offering refused actions", categories=("invalid_action",),
                   predicted_flips=(B,), at_risk=(A,), evidence=(Anchor(seq=42, index=3, note="refused twice"),),
                   attribution="action_pruner")
    m02 = Manifest(intended_effect="go for the task's objects", categories=("no_progress",), predicted_flips=(D,),
                   attribution="task_objects")
    m02r = msgspec.structs.replace(m02, evidence=(Anchor(seq=77, index=0, note="wandered"),))
    c01 = proposal(0, "C-R0-01", h0, pruner, m01)
    c02 = proposal(0, "C-R0-02", h0, objects, m02)
    c11 = proposal(1, "C-R1-01", h1, objects, Manifest(
        intended_effect="go for the task's objects", categories=("no_progress", "loop"), predicted_flips=(A, D),
        evidence=(Anchor(seq=90, index=1, note="loop"),), attribution="task_objects"))
    broken = (Attach(processor="no_such_processor", hooks=("before_model",)),)
    with pytest.raises(CompositionError) as failed:
        apply(h1, broken)
    why = str(failed.value)
    c12 = CandidateProposed(run_id=RUN, round=1, candidate="C-R1-02", variant="v0", evolver="offline",
                            operations=broken, buckets=("processor",), manifest=Manifest(predicted_flips=(D,)),
                            base_digest=h1.digest, digest="", risk=0.1, build_error=why)
    games = (GameScore(game="toy:walk", tasks=6, pass_at_1=0.25, pass_at_2=0.5),)
    ledger = EvolutionLedger(LedgerOpened(run_id=RUN, strategy="ensemble", harness=h0.spec(), digest=h0.digest,
                                          settings=settings, heldout_digest="sha256:heldout"))

    def append(*events: LedgerEvent) -> None:
        for event in events:
            ledger.record(event)

    append(HeldoutScored(run_id=RUN, round=-1, trace_round=0, heldout_digest="sha256:heldout", tasks=6,
                         pass_at_1=0.25, pass_at_2=0.5, games=games))
    append(RoundDigested(run_id=RUN, round=0, actionability=0.5, digests=r0, trace_rounds=(MAIN_TRACE_ROUNDS[0],)))
    append(LandscapePlanned(run_id=RUN, round=0, landscape=Landscape(
        failures=(FailureGroup(category="invalid_action", tasks=(B,)), FailureGroup(category="no_progress",
                                                                                    tasks=(D,))),
        untried_buckets=("prompt", "tools", "config", "processor"))))
    append(c01, c02)
    append(CandidateRevised(run_id=RUN, round=0, candidate="C-R0-02", reason="a predicted flip has no evidence anchor",
                            operations=objects_revised, manifest=m02r, digest=apply(h0, objects_revised).digest))
    append(CriticJudged(run_id=RUN, round=0, ranking=("C-R0-02", "C-R0-01"), concerns=(
        CandidateConcern(candidate="C-R0-02", concerns=("no evidence anchor",)),), revisions=("C-R0-02",)))
    append(GateJudged(run_id=RUN, round=0, candidate="C-R0-02", variant="v0", passed=False,
                      checks=checks("seesaw", f"1 solved task(s) failed every retry, e.g. {C!r}"),
                      first_failure="seesaw", flips=(TaskFlip(task=C, before=True, after=False, attempts=6,
                                                              passes=0),), trace_rounds=(2,)))
    append(GateJudged(run_id=RUN, round=0, candidate="C-R0-01", variant="v0", passed=True, checks=checks(),
                      outcome="ship", trace_rounds=(3,), flips=(
                          TaskFlip(task=A, before=True, after=True, attempts=2, passes=2),
                          TaskFlip(task=B, before=False, after=True, attempts=2, passes=1))))
    append(HarnessShipped(run_id=RUN, round=0, variant="v0", candidates=("C-R0-01",), digest_before=h0.digest,
                          digest_after=h1.digest, operations=pruner, harness=h1.spec()))
    append(RoundDecided(run_id=RUN, round=0, outcome="shipped", reason="shipped C-R0-01", shipped=("C-R0-01",),
                        metrics=RoundMetrics(tasks=4, passes=2, pass_at_k=0.5, rollouts=18,
                                             lever_mix={"processor": 1})))
    append(RoundDigested(run_id=RUN, round=1, actionability=0.5, digests=r1, trace_rounds=(MAIN_TRACE_ROUNDS[1],)))
    append(LandscapePlanned(run_id=RUN, round=1, landscape=Landscape(
        regressions=(Regression(task=A, variant="v0", since_round=0, suspects=("C-R0-01",)),),
        failures=(FailureGroup(category="no_progress", tasks=(D,)),), tried_buckets=("processor",))))
    append(c11, c12)
    append(CriticJudged(run_id=RUN, round=1, ranking=("C-R1-01",), concerns=(
        CandidateConcern(candidate="C-R1-02", concerns=("does not build",)),),
        strategy_concern="every ship so far is a processor edit", banned=("action_pruner",)))
    append(GateJudged(run_id=RUN, round=1, candidate="C-R1-01", variant="v0", passed=True,
                      checks=checks("seesaw", "1 solved task(s) lost against 2 gained"), first_failure="seesaw",
                      outcome="fork", clusters=("toy:easy",), trace_rounds=(5,)))
    append(VariantForked(run_id=RUN, round=1, parent="v0", variant="v1", candidate="C-R1-01", digest=h2.digest,
                         operations=objects, harness=h2.spec(), clusters=("toy:easy",)))
    append(RoundDecided(run_id=RUN, round=1, outcome="shipped", reason="shipped a fork", metrics=RoundMetrics(
        tasks=4, passes=2, pass_at_k=0.5, predicted=1, realised=1, attribution=1.0, regressions=1, rollouts=12,
        lever_mix={"processor": 2})))
    append(HeldoutScored(run_id=RUN, round=1, trace_round=6, heldout_digest="sha256:heldout", tasks=6,
                         pass_at_1=0.5, pass_at_2=0.75, games=games))
    append(EvolutionFinished(run_id=RUN, rounds=2, reason="ran 2 round(s)"))
    return ledger.records, {"C-R0-01": c01.digest, "C-R0-02": apply(h0, objects_revised).digest,
                            "C-R1-01": c11.digest}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def links(md: Path) -> list[Path]:
    return [md.parent / unquote(target) for target in re.findall(r"\]\(([^)\s]+)\)", md.read_text())]


def written(root: Path, files: dict[str, bytes]) -> Path:
    """``files`` (by relative path) written under ``root``, as ``hx export`` writes them."""
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def evolved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvolvedRun]:
    """A real two-round evolution run (the tests export it, and write nothing to it)."""
    with evolved_run(tmp_path_factory.mktemp("export"), "evo-exported") as run:
        yield run


def test_export_writes_the_run_directory_from_the_ledger(tmp_path: Path) -> None:
    records, run_ledger = build_ledger()
    out = written(tmp_path / "export", render(records))
    files = tree(out)
    for name in ("INDEX.md", "journal.md", "curves.json", "scoreboard.json", "audit.jsonl", "data/task_history.jsonl",
                 "data/ship_outcomes.json", "data/rejected_candidates.jsonl", "R0/landscape.md", "R0/decision.md",
                 "R0/regressions.md", "R0/candidates/C-R0-01.md", "R0/candidates/C-R0-02.md",
                 "R0/applied/C-R0-01/config.yaml", "R0/applied/C-R0-02/config.yaml", "R0/verdicts/V-C-R0-01.md",
                 "R0/verdicts/V-C-R0-02.md", "R1/candidates/C-R1-01.md", "R1/verdicts/V-C-R1-01.md",
                 "R1/applied/C-R1-01/config.yaml", "R1/regressions.md", "R1/decision.md",
                 *(f"R{n}/digests/{t.replace(':', '_')}.md" for n in (0, 1) for t in (A, B, C, D))):
        assert name in files, name
    assert not any("/trajectories/" in f for f in files)

    index = (out / "INDEX.md").read_text()
    assert "Strategy `ensemble`; status: completed after 2 round(s)" in index and "| v1 | v0 | 1 | no |" in index
    index_links = links(out / "INDEX.md")
    assert len(index_links) > 20 and all(p.exists() for p in index_links)
    for md in out.rglob("*.md"):  # every link of every page resolves
        assert all(p.exists() for p in links(md)), md

    lines = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert [line["position"] for line in lines] == list(range(1, len(lines) + 1)) and len(lines) == 22
    assert lines[0]["type"] == "ledger.opened" and lines[0]["prev"] == ""
    for before, line in itertools.pairwise(lines):
        assert line["prev"] == before["digest"]
    for line in lines:  # each digest is the event's own, recomputed from the body
        event = msgspec.convert(line["event"], event_type(line["type"]))
        assert isinstance(event, LedgerEvent) and ledger_digest(event) == line["digest"]

    card = (out / "R0/candidates/C-R0-01.md").read_text()
    assert "attach action_pruner at after_tool+before_model" in card
    assert f"predicted flips: [{B}](../digests/toy_walk_dev_101.md)" in card
    assert "seq | index" in card and "| 42 | 3 | refused twice |" in card and "`action_pruner`" in card
    revised = (out / "R0/candidates/C-R0-02.md").read_text()
    assert "## Revision" in revised and "a predicted flip has no evidence anchor" in revised
    assert 'attach task_objects at task_start+after_tool+before_model with `{"min_length": 4}`' in revised

    verdict = (out / "R0/verdicts/V-C-R0-01.md").read_text()
    rows = [line for line in verdict.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[2].strip() for row in rows] == list(CHECKS)
    assert all("| pass |" in row for row in rows) and "outcome **ship**" in verdict
    assert f"| {B} | fail | pass | 2 | 1 | flip |" in verdict
    rejected_verdict = (out / "R0/verdicts/V-C-R0-02.md").read_text()
    assert "first failure: seesaw" in rejected_verdict and "| 6 | seesaw | FAIL |" in rejected_verdict

    assert "No earlier round" in (out / "R0/regressions.md").read_text()
    regressions = (out / "R1/regressions.md").read_text()
    assert "1 of 4 tasks of round 0 regressed" in regressions
    assert f"| [{A}](digests/toy_walk_dev_100.md) | v0 | v0 | 1/2 | 0/2 | loop | C-R0-01 |" in regressions
    assert B not in regressions
    assert "shipped `C-R0-01` to `v0`" in regressions

    for cid, recorded in run_ledger.items():
        rnd = cid.split("-")[1]
        assert HarnessConfig.load(out / rnd / "applied" / cid / "config.yaml").digest == recorded

    decision = (out / "R1/decision.md").read_text()
    assert "every ship so far is a processor edit" in decision and "`action_pruner`" in decision
    assert "forked `v1` from `v0` with `C-R1-01`" in decision and "## Decision: shipped" in decision

    curves = json.loads(files["curves.json"])
    assert [(r["round"], r["pass_at_k"], r["tasks"], r["passes"], r["rollouts"]) for r in curves["rounds"]] == [
        (0, 0.5, 4, 2, 18), (1, 0.5, 4, 2, 12)]
    assert [(h["round"], h["pass_at_1"]) for h in curves["heldout"]] == [(-1, 0.25), (1, 0.5)]
    board = json.loads(files["scoreboard.json"])
    assert [(s["round"], s["kind"], s["variant"], s["candidates"]) for s in board["ships"]] == [
        (0, "ship", "v0", ["C-R0-01"]), (1, "fork", "v1", ["C-R1-01"])]
    assert board["levers"]["action_pruner"] == {"bucket": "processor", "dimension": "D4", "proposed": 1,
                                                     "shipped": 1, "predicted": 1, "realised": 1, "hit_rate": 1.0,
                                                     "banned": True}
    assert board["buckets"]["processor"]["shipped"] == 2 and board["buckets"]["prompt"]["proposed"] == 0
    outcomes = {o["candidate"]: o for o in json.loads(files["data/ship_outcomes.json"])}
    assert outcomes["C-R0-01"]["realised_tasks"] == [B] and outcomes["C-R0-01"]["attribution_rate"] == 1.0
    assert outcomes["C-R1-01"]["kind"] == "fork" and outcomes["C-R1-01"]["next_round"] is None
    rejected = [json.loads(line) for line in files["data/rejected_candidates.jsonl"].splitlines()]
    assert [(r["candidate"], r["stage"], r["reason"], r["detail"]) for r in rejected] == [
        ("C-R0-02", "gate", "seesaw", f"1 solved task(s) failed every retry, e.g. {C!r}"),
        ("C-R1-02", "critic", "left out of the ranking", "does not build")]
    unbuilt = (out / "R1/candidates/C-R1-02.md").read_text()
    assert "Applied: not built: operation 1 (attach no_such_processor at before_model)" in unbuilt
    assert not (out / "R1/applied/C-R1-02").exists() and "not gated" in unbuilt
    history = [json.loads(line) for line in files["data/task_history.jsonl"].splitlines()]
    assert len(history) == 8 and history[4] == {
        "round": 1, "task": A, "cluster": "toy:walk", "variant": "v0", "attempts": 2, "passes": 0, "solved": False,
        "category": "loop", "continuity": "newly_failing", "implicated": ["action_pruner"]}
    journal = files["journal.md"].decode()
    assert "## Round 0: shipped" in journal and "gate: C-R0-02 failed at seesaw" in journal
    assert "Held-out before the first round" in journal

    assert tree(written(tmp_path / "again", render(records))) == files  # the same ledger, the same bytes


def test_the_command_writes_what_render_makes_of_the_verified_ledger(evolved: EvolvedRun, tmp_path: Path) -> None:
    out = tmp_path / "export"
    assert f"exported run {evolved.run_id}" in ok(evolved.hx("export", evolved.run_id, str(out))).stdout
    records = asyncio.run(ledger_of(evolved.url, evolved.run_id))
    assert tree(out) == render([e.event for e in records.entries])


def test_export_refuses_a_missing_run_and_a_non_empty_directory(evolved: EvolvedRun, tmp_path: Path) -> None:
    assert error_line(evolved.hx("export", "nope", str(tmp_path / "x"))) == \
        "error: run 'nope' has no ledger (no evolution run of that id is on HX_LEDGER)"
    assert not (tmp_path / "x").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    for force in ((), ("--force",)):  # not an export: refused either way (tests/test_export_target.py has more)
        assert "not an hx export" in error_line(evolved.hx("export", evolved.run_id, str(busy), *force))
        assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    ok(evolved.hx("export", evolved.run_id, str(empty)))
    assert (empty / "journal.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "empty"]  # no scratch left behind


def test_a_failure_mid_way_leaves_no_directory_and_a_one_line_error(evolved: EvolvedRun, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    write = export_cli.Staging.write

    def full_disk(self: export_cli.Staging, files: dict[str, bytes]) -> None:
        write(self, dict(list(files.items())[:5]))
        raise OSError(28, "No space left on device", str(self.path / "journal.md"))

    monkeypatch.setattr(export_cli.Staging, "write", full_disk)
    line = error_line(evolved.hx("export", evolved.run_id, str(tmp_path / "out")))
    assert "No space left on device" in line and "nothing was exported" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def main_attempts(url: str, run_id: str) -> dict[int, dict[int, list[tuple[str, int]]]]:
    """Evolution round -> its main rollouts' trace rounds -> their (task, attempt)s, read off the trace."""
    async with connect(NatsSettings(url=url)) as conn:
        marks = await trace_marks(conn.log, run_id)
        out: dict[int, dict[int, list[tuple[str, int]]]] = {}
        for n, tr in marks.items():
            if tr.started.purpose == "main" and tr.started.split != "heldout" and tr.finished is not None:
                out.setdefault(tr.started.stage_round, {})[n] = sorted(
                    (m.task_id, m.attempt) for m in tr.finished.outcomes)
    return out


def test_trajectories_are_the_main_rollouts_attempts_with_resolved_conversations(evolved: EvolvedRun,
                                                                                  tmp_path: Path) -> None:
    mains = asyncio.run(main_attempts(evolved.url, evolved.run_id))
    out = tmp_path / "export"
    ok(evolved.hx("export", evolved.run_id, str(out), "--trajectories"))
    assert mains and sorted(mains) == [0, 1]
    index = (out / "INDEX.md").read_text()
    for stage, rounds in mains.items():
        folder = out / f"R{stage}" / "trajectories"
        attempts = [a for done in rounds.values() for a in done]
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            f"{task.replace(':', '_')}.{attempt}.jsonl" for task, attempt in attempts)
        assert f"[trajectories ({len(attempts)})](R{stage}/trajectories/)" in index
        trace_round, done = next(iter(rounds.items()))
        task, attempt = done[0]
        name = f"{task.replace(':', '_')}.{attempt}.jsonl"
        raw = (folder / name).read_bytes().splitlines()
        assert json.loads(raw[0])["type"] == CONVERSATION  # the attempt's messages, once; then its events
        lines = list(read_trajectory(raw))
        assert lines[0]["type"] == AttemptStarted.TYPE and lines[-1]["type"] == AttemptFinished.TYPE
        assert {line["subject"] for line in lines} == {f"hx.trace.{evolved.run_id}.{trace_round}.{task}.{attempt}"}
        conversations = [line["event"] for line in lines if line["type"] == "model.request"]
        assert conversations and all(c["messages"] and c.get("history") is None for c in conversations)
        digest_page = (out / f"R{stage}" / "digests" / f"{task.replace(':', '_')}.md").read_text()
        assert f"](../trajectories/{name})" in digest_page
    for md in out.rglob("*.md"):
        assert all(p.exists() for p in links(md)), md
