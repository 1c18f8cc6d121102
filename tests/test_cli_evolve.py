"""``hx evolve`` and ``hx approve`` through click's CliRunner: bad input, a tiny real run, its ledger and report."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import get_args

import pytest
import toyworld  # noqa: F401 - registers the toy benchmark with the in-process command
from click.testing import Result
from hx_cli import error_line, hx
from ledger_forger import ledger_of

from schemas.ledger import RoundOutcome


def usage_error(result: Result, *names: str) -> str:
    """Exit 2 (click's usage error), the message naming each of ``names``."""
    assert result.exit_code == 2, (result.output, result.exception)
    for name in names:
        assert name in result.stderr, result.stderr
    return result.stderr


def test_the_llm_evolver_needs_a_meta_model(tmp_path: Path) -> None:
    """``--evolver llm`` without ``--meta-model`` is refused before anything runs."""
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--evolver", "llm"), "--meta-model")
    assert not (tmp_path / "results").exists()


def test_unknown_choices_and_ranges_are_named(tmp_path: Path) -> None:
    """Click names the option and the allowed values of each bad choice or range."""
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--evolver", "genetic"), "--evolver", "offline", "llm")
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--strategy", "vote"), "--strategy")
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--candidates", "0"), "--candidates")
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--alpha", "1.5"), "--alpha")


def test_bad_model_specs_are_named(tmp_path: Path) -> None:
    """A task or meta model with an unknown provider fails with the spec and the providers named."""
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--model", "nosuch:model"))
    assert "nosuch" in line
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--evolver", "llm", "--meta-model", "nosuch:x"))
    assert "nosuch" in line
    assert not (tmp_path / "results").exists()


def test_an_unknown_benchmark_is_named(tmp_path: Path) -> None:
    """An unknown benchmark or game names what was asked for; no run and no results file are left."""
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--bench", "nosuchbench", "--rounds", "1"))
    assert "nosuchbench" in line
    line = error_line(hx("--data-dir", str(tmp_path), "evolve", "--bench", "twx:nosuchgame", "--rounds", "1"))
    assert "nosuchgame" in line
    assert not list((tmp_path / "results").glob("*.json")) if (tmp_path / "results").exists() else True


def test_resuming_or_approving_an_unknown_run_is_an_error(tmp_path: Path) -> None:
    """``--resume`` and ``hx approve`` of a run without a ledger say so, and write nothing."""
    assert "no ledger" in error_line(hx("--data-dir", str(tmp_path), "evolve", "--resume", "never-ran"))
    assert "no ledger" in error_line(hx("--data-dir", str(tmp_path), "approve", "never-ran", "c1"))
    usage_error(hx("--data-dir", str(tmp_path), "evolve", "--resume", "../etc"), "run id")


def test_a_tiny_textworld_evolution_end_to_end(tmp_path: Path) -> None:
    """One round on TextWorldExpress coin: a JSON report that adds up, a saved file, an export, a held claim."""
    data = str(tmp_path / "data")
    args = ("--data-dir", data, "evolve", "--bench", "twx:coin", "--tasks", "4", "--heldout-tasks", "4",
            "--rounds", "1", "--max-steps", "30", "--concurrency", "2", "--run-id", "cli-evolve")
    result = hx(*args, "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads(result.stdout)
    assert report["run_id"] == "cli-evolve" and report["status"] in ("completed", "patience")
    [row] = report["rounds"]
    assert row["round"] == 0 and row["outcome"] in get_args(RoundOutcome)
    # Round 0 ran every adaptation task twice (k=2), plus whatever the gate ran.
    assert row["rollouts"] >= 4 * 2
    before, after = report["heldout_before"], report["heldout_after"]
    assert before["round"] == -1 and after["round"] == 0
    for scored in (before, after):
        [game] = scored["games"]
        assert game["game"] == "twx:coin" and game["tasks"] == 4 and 0 <= game["pass_at_2"] <= 1
    saved = Path(data) / "results" / "cli-evolve.json"
    assert json.loads(saved.read_text()) == report
    assert sorted(p.name for p in saved.parent.iterdir()) == ["cli-evolve.json"]  # no empty claim left behind
    assert report["variants"], "the run ends with at least one live variant"

    # The same run id again is refused: the results file is claimed, the ledger exists.
    again = hx(*args)
    assert again.exit_code == 1 and "cli-evolve" in again.stderr

    # The ledger exports to a directory whose audit trail is the ledger itself.
    out = tmp_path / "export"
    exported = hx("--data-dir", data, "export", "cli-evolve", str(out))
    assert exported.exit_code == 0, (exported.output, exported.exception)
    audit = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert audit[0]["type"] == "ledger.opened" and audit[-1]["type"] == "ledger.evolution_finished"
    assert all(b["prev"] == a["digest"] for a, b in itertools.pairwise(audit))
    assert (out / "R0").is_dir() and (out / "INDEX.md").read_text().strip()


def test_a_validation_split_holds_out_train_tasks_and_says_so(tmp_path: Path) -> None:
    """``--heldout-split train``: the held-out tasks come from the train split, and the table names it."""
    common = ("--data-dir", str(tmp_path), "evolve", "--bench", "toyworld:rooms", "--tasks", "4", "--heldout-tasks",
              "3", "--rounds", "1", "--max-steps", "20", "--heldout-split")
    usage_error(hx(*common, "dev"), "--heldout-split", "test", "train")  # the adaptation split is never held out
    result = hx(*common, "train", "--run-id", "cli-validate")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "held-out (train split) pass@2" in result.stdout
    dump = hx("--data-dir", str(tmp_path), "log", "dump", "--stream", "HX_LEDGER")
    [opened] = [json.loads(line)["event"] for line in dump.stdout.splitlines()
                if json.loads(line)["type"] == "ledger.opened"]
    held, adapted = opened["settings"]["heldout"], opened["settings"]["adaptation"]
    assert len(held) == 3 and all(t.split(":")[2] == "train" for t in held)
    assert all(t.split(":")[2] == "dev" for t in adapted)


def test_approve_at_the_terminal_records_the_answer_on_the_ledger(tmp_path: Path) -> None:
    """``--approve`` asks about each risky candidate that passed the gate; a yes ships it, as ledger events."""
    data = str(tmp_path)
    result = hx("--data-dir", data, "evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "16",
                "--heldout-tasks", "4", "--rounds", "2", "--max-steps", "30", "--seed", "3", "--risk-threshold", "0",
                "--approve", "--run-id", "cli-approve", "--json", input="y\n" * 8)
    assert result.exit_code == 0, (result.output, result.exception)
    asked = result.stderr.count("passed the gate")
    dump = hx("--data-dir", data, "log", "dump", "--stream", "HX_LEDGER")
    assert dump.exit_code == 0, dump.output
    records = [json.loads(line) for line in dump.stdout.splitlines()]
    of = {kind: [r["event"] for r in records if r["type"] == f"ledger.{kind}"]
          for kind in ("approval_requested", "approval_given", "harness_shipped", "variant_forked")}
    assert asked >= 1 and len(of["approval_requested"]) == len(of["approval_given"]) == asked
    assert all(g["approved"] and g["by"] for g in of["approval_given"])
    shipped = {c for r in of["harness_shipped"] for c in r["candidates"]} | {r["candidate"] for r in
                                                                            of["variant_forked"]}
    assert shipped == {g["candidate"] for g in of["approval_given"]}  # shipped exactly what was approved


@pytest.mark.slow
def test_a_finished_runs_waiting_candidate_is_not_approved(nats_url: str, tmp_path: Path) -> None:
    """A candidate that waits for a human when its run finished can never ship: ``hx approve`` says so, and writes
    nothing (it used to print "approved" and exit 0)."""
    base = ("--nats-url", nats_url, "--data-dir", str(tmp_path / "data"))
    result = hx(*base, "evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8",
                "--heldout-tasks", "2", "--rounds", "1", "--max-steps", "20", "--seed", "3", "--risk-threshold",
                "0.05", "--run-id", "evo-waiting")
    assert result.exit_code == 0, result.output
    ledger = asyncio.run(ledger_of(nats_url, "evo-waiting"))
    waiting = [c.id for c in ledger.candidates.values() if c.waiting]
    assert ledger.finished is not None and waiting
    before = ledger.last_position
    line = error_line(hx(*base, "approve", "evo-waiting", waiting[0]))
    assert f"run 'evo-waiting' finished (completed, event {before}): nothing would ever ship {waiting[0]}" in line
    assert asyncio.run(ledger_of(nats_url, "evo-waiting")).last_position == before
