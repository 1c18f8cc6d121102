"""``hx ledger`` and ``hx audit verify`` on a real evolution run, its export, and tampered copies of the export."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from audit_kit import EvolvedRun, evolved_run, rechained
from hx_cli import error_line, ok
from ledger_run import GATE_CHECKS, STARTER, LedgerRun, attach, write_ledger
from toybench import RANDOM, ToyBench
from toybench import ids as toy_ids

from hx.cli.audit import EXIT_NOT_VERIFIED
from hx.environments.rollout import Rollout, RolloutSettings, RoundLabel
from hx.harness.edits import apply
from schemas.edits import Anchor, Manifest
from schemas.envelope import HX_SCHEMA_VERSION, HX_TYPE
from schemas.ledger import GateCheck, GateJudged, HeldoutScored, RoundDigested
from streams.config import NatsSettings
from streams.connection import connect
from streams.edit_ledger import ledger_filter
from streams.signing import LedgerKey
from streams.topology import LEDGER

SHIPS = ("ledger.harness_shipped", "ledger.variant_forked")
VERDICTS = ("ledger.critic_judged", "ledger.gate_judged")


@pytest.fixture(scope="module")
def evolved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvolvedRun]:
    """One real two-round run for the whole module (the tests only read it)."""
    with evolved_run(tmp_path_factory.mktemp("audit")) as run:
        yield run


def audit_lines(run: EvolvedRun) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run.export / "audit.jsonl").read_text().splitlines()]


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def not_verified(result: Any) -> str:
    """Exit 3, a ``not verified`` headline, no traceback; the whole report."""
    assert result.exit_code == EXIT_NOT_VERIFIED, (result.output, result.exception)
    assert result.stdout.startswith("not verified: ") and "Traceback" not in result.output
    return str(result.stdout)


def unwrapped(text: str) -> str:
    """A rich tree's text on one line: wrapped lines joined, guide lines dropped."""
    return " ".join(text.replace("│", " ").split())


def ledger_last_seq(url: str) -> int:
    async def last() -> int:
        async with connect(NatsSettings(url=url)) as conn:
            return await conn.log.last_seq(LEDGER.name)
    return asyncio.run(last())


# --- hx ledger ------------------------------------------------------------------------------------


def test_ledger_lists_every_candidate_verdict_and_ship_with_anchors_on_real_trace_events(evolved: EvolvedRun) -> None:
    rows = [json.loads(line) for line in ok(evolved.hx("ledger", evolved.run_id, "--json")).stdout.splitlines()]
    types = [r["type"] for r in rows]
    on_ledger = [e["type"] for e in evolved.ledger]
    for kind in ("ledger.candidate_proposed", *VERDICTS):
        assert types.count(kind) == on_ledger.count(kind) > 0, kind
    assert sum(t in SHIPS for t in types) == sum(t in SHIPS for t in on_ledger) > 0
    assert {r["round"] for r in rows} == {0, 1}
    anchors = [a for r in rows for a in r["anchors"]]
    assert anchors and all(a["resolved"] for a in anchors)
    # Each resolved anchor is the very trace event at that position (read here through hx log dump).
    for a in anchors[:3]:
        dumped = ok(evolved.hx("log", "dump", "--stream", "HX_TRACE", "--subject", a["subject"])).stdout
        at = {(d["seq"], d["index"]): d for d in map(json.loads, dumped.splitlines())}
        assert at[(a["seq"], a["index"])]["type"] == a["type"]
        assert a["subject"].startswith(f"hx.trace.{evolved.run_id}.")

    human = unwrapped(ok(evolved.hx("ledger", evolved.run_id)).stdout)
    assert "round 0" in human and "round 1" in human and "critic (deterministic)" in human and "gate on" in human
    assert "-> attempt.finished on hx.trace." in human and "unresolved" not in human

    one = [json.loads(line) for line in ok(evolved.hx("ledger", evolved.run_id, "--round", "1", "--json")).stdout
           .splitlines()]
    assert one and {r["round"] for r in one} == {1}


def test_ledger_names_anchors_that_point_to_nothing(evolved: EvolvedRun) -> None:
    """A run whose evidence cites a position past the trace's end and one of another run's events."""
    ghost = LedgerRun(run_id="ghost")
    cand = ghost.proposed(0, "C-G-01", ())
    nowhere, elsewhere = Anchor(seq=10**9, index=0, note="past the end"), Anchor(seq=1, index=0, note="not ours")
    ghost.records[-1] = msgspec.structs.replace(cand, manifest=Manifest(evidence=(nowhere, elsewhere)))
    ghost.records.append(GateJudged(run_id="ghost", round=0, candidate="C-G-01", variant="v0", passed=False,
                                    checks=(GateCheck(name="builds", passed=True),
                                            GateCheck(name="manifest", passed=False, detail="2 anchor(s) unresolved"),
                                            GateCheck(name="seesaw", passed=False, detail="not reached")),
                                    trace_rounds=(7,)))
    ghost.records.insert(1, RoundDigested(run_id="ghost", round=0, actionability=1.0, trace_rounds=(3,)))

    write_ledger(evolved.url, ghost)

    human = unwrapped(ok(evolved.hx("ledger", "ghost")).stdout)
    assert "unresolved: no message at sequence 1000000000 on HX_TRACE" in human
    assert f"unresolved: message 1 (hx.trace.{evolved.run_id}." in human
    assert f"belongs to run '{evolved.run_id}', not 'ghost'" in human
    # A rejected gate names its first failing check and what that check found.
    assert "gate on C-G-01 (v0): rejected at manifest (2 anchor(s) unresolved); 0 fixed, 0 broken" in human
    report = " ".join(not_verified(evolved.hx("audit", "verify", "ghost")).split())
    assert "event 2 (ledger.round_digested): cites trace round 3, which is not on HX_TRACE" in report
    assert "event 3 (ledger.candidate_proposed): evidence anchor 1000000000:0 (past the end) is unresolved" in report
    assert "event 4 (ledger.gate_judged): cites trace round 7" in report
    assert "chain intact" not in report


def test_a_run_or_round_that_does_not_exist_is_one_error_line(evolved: EvolvedRun, tmp_path: Path) -> None:
    assert error_line(evolved.hx("ledger", "no-such-run")) == (
        "error: run 'no-such-run' has no ledger (no evolution run of that id is on HX_LEDGER)")
    assert error_line(evolved.hx("audit", "verify", "no-such-run")).startswith("error: run 'no-such-run' has no ledger")
    assert error_line(evolved.hx("ledger", evolved.run_id, "--round", "9")) == (
        f"error: run '{evolved.run_id}' has no round 9 on its ledger (rounds 0..1)")
    assert "cannot read" in error_line(evolved.hx("audit", "verify", "--file", str(tmp_path / "none.jsonl")))
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"type": "ledger.opened", "event": {"run_id": 3}}\n')
    assert "line 1 is not a ledger event" in error_line(evolved.hx("audit", "verify", "--file", str(garbage)))
    binary = tmp_path / "audit.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")  # not text at all: one line, not a UnicodeDecodeError
    assert error_line(evolved.hx("audit", "verify", "--file", str(binary))) == (
        f"error: {binary} is not a ledger copy: byte 0 is not UTF-8 text (a JSON-lines audit.jsonl or hx log dump "
        "output is)")
    assert evolved.hx("audit", "verify").exit_code == 2  # neither RUN nor --file: a usage error


# --- hx audit verify ------------------------------------------------------------------------------


def test_verify_passes_on_the_real_run_and_writes_nothing(evolved: EvolvedRun) -> None:
    before = ledger_last_seq(evolved.url)
    result = ok(evolved.hx("audit", "verify", evolved.run_id))
    types = [e["type"] for e in evolved.ledger]
    ships = sum(t in SHIPS for t in types)
    verdicts = sum(t in VERDICTS for t in types)
    assert result.stdout.startswith(f"verified: {len(types)} events, chain intact, {ships} ships equal their folds, "
                                    f"{verdicts} verdicts with inputs on the log (")
    assert ledger_last_seq(evolved.url) == before  # reading and checking wrote nothing to the ledger
    head = re.search(r"head (sha256:[0-9a-f]{64})", (evolved.export / "INDEX.md").read_text())
    assert head and f"  head: {head[1]} " in result.stdout  # the head an exported copy recorded


@pytest.mark.parametrize("copy", ["audit.jsonl", "dump"])
def test_verify_passes_on_an_untouched_copy(evolved: EvolvedRun, tmp_path: Path, copy: str) -> None:
    path = evolved.export / "audit.jsonl" if copy == "audit.jsonl" else write(tmp_path / "dump.jsonl", evolved.ledger)
    out = ok(evolved.hx("audit", "verify", "--file", str(path))).stdout
    assert out.startswith(f"verified: {len(evolved.ledger)} events, chain intact, ")
    assert "verdicts with inputs on the file" in out
    assert "not checked: the evidence anchors of candidates and digests (HX_TRACE)" in out


def test_a_dump_of_several_runs_is_verified_run_by_run(evolved: EvolvedRun, tmp_path: Path) -> None:
    other = LedgerRun(run_id="other-run")
    other.proposed(0, "C-O-01", ())
    write_ledger(evolved.url, other)
    dump = tmp_path / "dump.jsonl"
    dump.write_text(ok(evolved.hx("log", "dump", "--stream", "HX_LEDGER")).stdout)
    line = error_line(evolved.hx("audit", "verify", "--file", str(dump)))
    assert "holds the ledgers of" in line and f"{evolved.run_id}" in line and "name the one to verify" in line
    mine = ok(evolved.hx("audit", "verify", evolved.run_id, "--file", str(dump))).stdout
    assert mine.startswith(f"verified: {len(evolved.ledger)} events, chain intact, ")
    assert ok(evolved.hx("audit", "verify", "other-run", "--file", str(dump))).stdout.startswith(
        "verified: 2 events, chain intact, 0 ships equal their folds, 0 verdicts")
    assert "holds no ledger event of run 'nobody'" in error_line(
        evolved.hx("audit", "verify", "nobody", "--file", str(dump)))


def test_an_edited_event_is_named(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.gate_judged")
    lines[k]["event"]["passed"] = not lines[k]["event"]["passed"]
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "a.jsonl", lines))))
    pos, nxt = lines[k]["position"], lines[k + 1]
    assert (f"event {nxt['position']} ({nxt['type']}): prev does not match the digest of event {pos} "
            f"(ledger.gate_judged): event {pos} (ledger.gate_judged) was edited") in report
    assert "edited" in report.splitlines()[0]


def test_an_edited_last_event_is_named_by_its_recorded_digest(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    lines[-1]["event"]["reason"] = "nothing to see"
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "a.jsonl", lines))))
    assert f"event {lines[-1]['position']} (ledger.evolution_finished): its body hashes to" in report
    assert "not to its recorded digest" in report


def test_an_edited_event_in_a_dump_without_digests_is_named(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = [dict(line, event=dict(line["event"])) for line in evolved.ledger]
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.candidate_proposed")
    lines[k]["event"]["risk"] = 0.0 if lines[k]["event"]["risk"] else 0.5
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "d.jsonl", lines))))
    assert f"event {k + 2} ({lines[k + 1]['type']}): prev does not match the digest of event {k + 1} " \
           "(ledger.candidate_proposed): edited" in report


def test_a_dropped_event_is_named(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.critic_judged")
    dropped = lines.pop(k)
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "a.jsonl", lines))))
    pos = dropped["position"]
    assert (f"event {pos} missing: chain breaks between event {pos - 1} ({lines[k - 1]['type']}) and "
            f"event {pos + 1} ({lines[k]['type']}): dropped") in report
    forged = rechained(lines, k)  # re-hashed after the drop: the chain holds, the positions still jump
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "f.jsonl", forged))))
    assert (f"event {pos + 1} ({lines[k]['type']}): the chain holds but the positions jump to {pos + 1} after "
            f"{pos - 1}: events dropped and the chain re-hashed") in report
    first = lines.pop(0)  # and the first event of all
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "b.jsonl", lines))))
    assert f"event 1 missing: the ledger starts at event 2 ({lines[0]['type']})" in report and first


def test_a_reordered_pair_is_named(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.gate_judged")
    lines[k], lines[k + 1] = lines[k + 1], lines[k]
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "a.jsonl", lines))))
    moved, back = lines[k], lines[k + 1]
    assert (f"event {moved['position']} ({moved['type']}) comes before event {back['position']} "
            f"(ledger.gate_judged), which it chains to: reordered") in report


@pytest.mark.parametrize("with_key", [False, True], ids=["forger", "forger-with-key"])
def test_a_forged_ship_that_keeps_the_chain_is_caught_by_its_fold(evolved: EvolvedRun, tmp_path: Path,
                                                                   with_key: bool) -> None:
    """Re-hashing the chain after an edit hides the edit from the chain, not from the signatures (unless the forger
    holds the key) nor from the fold of the edits."""
    lines = audit_lines(evolved)
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.harness_shipped")
    ops = lines[k]["event"]["operations"]
    lines[k]["event"]["operations"] = ops[:-1] if len(ops) > 1 else [*ops, ops[0]]
    key = LedgerKey.of(evolved.data_dir) if with_key else None
    forged = write(tmp_path / "a.jsonl", rechained(lines, k, key))
    report = not_verified(evolved.hx("audit", "verify", "--file", str(forged)))
    headline = report.splitlines()[0]
    assert "chain" not in headline and "edited" not in headline
    assert ("(fold, input)" if with_key else "(fold, input, signature)") in headline
    ship = f"event {lines[k]['position']} (ledger.harness_shipped)"
    assert f"{ship}: its edits applied to {lines[k]['event']['variant']}'s harness give sha256:" in report
    assert f"{ship}: its edits are not those of {lines[k]['event']['candidates'][0]} as proposed" in report


def test_a_forged_verdict_on_a_candidate_never_proposed_is_caught(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.gate_judged")
    lines[k]["event"]["candidate"] = "C-R9-99"
    report = not_verified(evolved.hx("audit", "verify", "--file", str(write(tmp_path / "a.jsonl",
                                                                            rechained(lines, k)))))
    assert (f"event {lines[k]['position']} (ledger.gate_judged): names candidate C-R9-99, which no earlier "
            "candidate_proposed proposed") in report


def test_a_ship_or_fork_the_gate_did_not_pass_for_is_named(evolved: EvolvedRun) -> None:
    """A candidate the gate rejected, shipped anyway; one passed for a ship, forked instead (another run of its own)."""
    run = LedgerRun(run_id="unpassed")
    run.proposed(0, "C-U-01", (attach("action_pruner"),))
    checks = tuple(GateCheck(name=n, passed=n != "effect") for n in GATE_CHECKS)
    run.records.append(GateJudged(run_id=run.run_id, round=0, candidate="C-U-01", variant="v0", passed=False,
                                  outcome="reject", checks=checks, first_failure="effect"))
    run.shipped(0, "C-U-01")
    run.proposed(0, "C-U-02", (attach("task_objects"),))
    run.gated(0, "C-U-02")
    run.forked(0, "C-U-02", "v1", ("b:h",))
    write_ledger(evolved.url, run)
    report = unwrapped(not_verified(evolved.hx("audit", "verify", "unpassed")))
    assert "event 4 (ledger.harness_shipped): ships candidate C-U-01, which the gate rejected at effect (event 3)" \
        in report
    assert "event 7 (ledger.variant_forked): is a fork of C-U-02, but the gate passed it for a ship (event 6)" in report


def main_then_heldout(url: str, run_id: str) -> None:
    """Play a run's trace round 0 (a main round, a walk task) and 1 (a held-out round, an easy task) under the
    starter, with no ledger yet: the tests write the ledger that cites them."""
    async def rounds() -> None:
        async with connect(NatsSettings(url=url)) as conn:
            rollout = Rollout([ToyBench()], RANDOM, STARTER, log=conn.log,
                              settings=RolloutSettings(attempts=1, max_steps=4))
            await rollout.start(run_id, kind="evolve")
            await rollout.run_round(run_id, 0, toy_ids("walk", 1), label=RoundLabel(purpose="main", variant="v0",
                                                                                     stage_round=0))
            await rollout.run_round(run_id, 1, toy_ids("easy", 1, "test"), role="heldout",
                                    label=RoundLabel(purpose="heldout", variant="v0", stage_round=0))
    asyncio.run(rounds())


def test_a_trace_round_cited_for_what_it_was_not_is_named(evolved: EvolvedRun) -> None:
    """A round digest citing a held-out round as its main rollouts, a held-out score citing a main round."""
    main_then_heldout(evolved.url, "cited")
    run = LedgerRun(run_id="cited")
    run.records.append(RoundDigested(run_id="cited", round=0, actionability=1.0, trace_rounds=(1,)))
    run.records.append(HeldoutScored(run_id="cited", round=0, trace_round=0, heldout_digest="", tasks=1))
    write_ledger(evolved.url, run)
    report = unwrapped(not_verified(evolved.hx("audit", "verify", "cited")))
    assert ("event 2 (ledger.round_digested): cites trace round 1 as a main round of round 0; the trace says it is "
            "a heldout round of round 0") in report
    assert ("event 3 (ledger.heldout_scored): cites trace round 0 as a heldout round; the trace says it is a main "
            "round of round 0") in report


def test_a_round_that_played_another_harness_than_the_ledger_says_is_named(evolved: EvolvedRun) -> None:
    """A ledger opened with one harness whose round digest and held-out score cite rounds the starter played: what
    they cite is of the right kind, but not of the harness the ledger says was there."""
    main_then_heldout(evolved.url, "played")
    other = apply(STARTER, (attach("explore_untried"),))
    run = LedgerRun(other, run_id="played")
    run.records.append(RoundDigested(run_id="played", round=0, actionability=1.0, trace_rounds=(0,)))
    run.records.append(HeldoutScored(run_id="played", round=0, trace_round=1, heldout_digest="", tasks=1))
    write_ledger(evolved.url, run)
    report = unwrapped(not_verified(evolved.hx("audit", "verify", "played")))
    played, said = f"played harness {STARTER.digest[:19]}...", f"{other.digest[:19]}..."
    assert (f"event 2 (ledger.round_digested): trace round 0 {played}, but it stands for the harness v0 had during "
            f"round 0, {said}") in report
    assert (f"event 3 (ledger.heldout_scored): trace round 1 {played}, but it stands for the harness v0 had when the "
            f"score was recorded, {said}") in report


def test_a_ledger_event_this_hx_cannot_read_is_an_error_not_a_dropped_event(evolved: EvolvedRun) -> None:
    """A run whose ledger holds an event of an unknown schema version (written here to a run of its own)."""
    async def publish() -> None:
        async with connect(NatsSettings(url=evolved.url)) as conn:
            await conn.js.publish(f"{ledger_filter('newer')[:-2]}.1", b"\x80",
                                  headers={HX_TYPE: "ledger.opened", HX_SCHEMA_VERSION: "99"})
    asyncio.run(publish())
    for command in (("ledger", "newer"), ("audit", "verify", "newer")):
        line = error_line(evolved.hx(*command))
        assert line.startswith("error: the ledger of run 'newer' holds an event this hx cannot read") and "99" in line


def test_a_copy_cut_short_is_noted_and_compared_with_the_log(evolved: EvolvedRun, tmp_path: Path) -> None:
    lines = audit_lines(evolved)
    whole = evolved.export / "audit.jsonl"
    assert "note:" not in ok(evolved.hx("audit", "verify", "--file", str(whole))).stdout  # ends with the run's end
    cut = write(tmp_path / "cut.jsonl", lines[:-2])
    last, end = lines[-3], lines[-1]
    out = ok(evolved.hx("audit", "verify", "--file", str(cut))).stdout  # the chain of what is left holds
    assert (f"  note: the ledger ends at event {last['position']} ({last['type']}): the run is unfinished, or "
            "events were cut from its end: compare the head with the run's") in out

    report = " ".join(not_verified(evolved.hx("audit", "verify", evolved.run_id, "--file", str(cut),
                                              "--against-log")).split())
    assert (f"the copy is shorter, it ends at event {last['position']} of the run's {end['position']}; missing "
            f"from its end: event {lines[-2]['position']} ({lines[-2]['type']}) .. event {end['position']} "
            "(ledger.evolution_finished)") in report
    same = ok(evolved.hx("audit", "verify", evolved.run_id, "--file", str(whole), "--against-log")).stdout
    assert f"note: the copy's head is the head of the run on the log ({len(lines)} events)" in same

    extra = dict(end, position=end["position"] + 1, event=dict(end["event"], reason="one more"))
    longer = write(tmp_path / "longer.jsonl", rechained([*lines, extra], len(lines)))
    report = " ".join(not_verified(evolved.hx("audit", "verify", evolved.run_id, "--file", str(longer),
                                              "--against-log")).split())
    assert f"the copy is longer, with 1 event(s) past the run's last (event {end['position']})" in report
    k = next(i for i, line in enumerate(lines) if line["type"] == "ledger.gate_judged")
    lines[k]["event"]["passed"] = not lines[k]["event"]["passed"]
    forged = write(tmp_path / "forged.jsonl", rechained(lines, k))
    report = " ".join(not_verified(evolved.hx("audit", "verify", evolved.run_id, "--file", str(forged),
                                              "--against-log")).split())
    assert (f"the copy differs from the log from event {lines[k]['position']} (copy: ledger.gate_judged, "
            "log: ledger.gate_judged)") in report
    assert evolved.hx("audit", "verify", "--file", str(cut), "--against-log").exit_code == 2  # no RUN: usage error
