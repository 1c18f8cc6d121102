"""Shipped rules read as plain sentences: ``hx ledger``, ``hx report`` and ``hx export`` on a run that shipped rules,
the rule history the three read, ``hx diff``'s harness diff of two rule programs, and the critic on a dropped rule.

The run is written as the loop writes one (``ledger_run.LedgerRun``: proposals, passing verdicts, ships and a
fork whose harnesses are the fold of their edits) onto a real nats-server through the ledger aggregate, and read
back by the commands.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from html import escape
from pathlib import Path

import msgspec
import pytest
import toyworld  # noqa: F401 - registers the toy benchmark the evolved run plays
from click.testing import Result
from hx_cli import hx, ok
from ledger_run import STARTER, LedgerRun, attach, task, write_ledger

from hx.aegis.critic import review
from hx.aegis.ledger import read_records
from hx.aegis.operations import dimensions_of
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply, describe
from hx.replay.harness_diff import harness_ops
from hx.report.data import ReportData
from hx.report.export import render
from hx.report.html import page
from projections.ledger import RunLedger
from projections.ledger_rules import rule_history, rules_in
from schemas.edits import RULE_GROUP, AddRule, Anchor, Attach, DropRule, Manifest, Remove
from schemas.ledger import CandidateProposed, HarnessShipped, LedgerEvent, RoundDigested
from schemas.rules import (
    Avoid,
    ForbidRepeat,
    LastObservation,
    Pattern,
    Prefer,
    Rule,
    RuleSupport,
    Says,
    TaskText,
    rule_lever,
    sentence,
    support_phrase,
)
from streams.config import NatsSettings
from streams.connection import connect
from streams.server import NatsProcess

RUN = "rules-shipped"
EVOLVED = "rules-evolved"
AVOID = Rule(do=Avoid(what=Pattern(starts="eat", not_named_in=TaskText())),
             when=(Says(text=LastObservation(), words=("hungry",)),))
PREFER = Rule(do=Prefer(what=Pattern(starts="take", named_in=TaskText())))
REPEAT = Rule(do=ForbidRepeat(what=Pattern(starts="open")))
FATAL = RuleSupport(method="fatal", attempts=14, tasks=9, steps=20, against=1)
RISING = RuleSupport(method="rising", attempts=5, tasks=3)
AVOID_SAID = ("avoid `eat …` that names something not in the task when the last observation says 'hungry', "
              "supported by 14 failing attempts that ended on it (9 task(s)), 1 step(s) against")
PREFER_SAID = "prefer `take …` that names only things in the task"


def shipped_run() -> LedgerRun:
    """Round 0 ships an avoidance and a preference to v0 and forks v1 with a third rule; round 1 drops the
    preference from v0."""
    run = LedgerRun(run_id=RUN)
    run.digested(0, [task("toy:a:1"), task("toy:a:2", passes=1), task("toy:b:1")])
    run.ship(0, "C-R0-01", (AddRule(rule=AVOID, support=FATAL),), ["toy:a:1"])
    run.ship(0, "C-R0-02", (AddRule(rule=PREFER, support=RISING),), ["toy:a:1"])
    run.proposed(0, "C-R0-03", (AddRule(rule=REPEAT),), ["toy:b:1"])
    run.forked(0, "C-R0-03", "v1", ("toy:b",))
    run.digested(1, [task("toy:a:1"), task("toy:a:2", passes=1), task("toy:b:1", variant="v1")])
    run.ship(1, "C-R1-01", (DropRule(rule=PREFER),), ["toy:a:1"])
    return run


@dataclass(frozen=True)
class Server:
    """The module's nats-server, its data dir, and the run the induced evolver made on it."""

    url: str
    data: Path
    records: list[LedgerEvent]
    """The evolved run's ledger events."""

    def hx(self, *args: str) -> Result:
        """The ``hx`` command on this server."""
        return hx("--nats-url", self.url, "--data-dir", str(self.data), *args)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real three-round evolution of the toy world by the induced evolver (it ships rules), and the hand-made run
    with a fork and a dropped rule, on one nats-server."""
    root = tmp_path_factory.mktemp("rules")
    proc = NatsProcess(root / "nats")
    proc.start(detach=False)
    try:
        base = ("--nats-url", proc.url, "--data-dir", str(root / "data"))
        ok(hx(*base, "evolve", "--bench", "toyworld:rooms", "--bench", "toyworld:bell", "--tasks", "8",
              "--heldout-tasks", "2", "--rounds", "3", "--max-steps", "20", "--seed", "3", "--evolver", "induced",
              "--run-id", EVOLVED))
        write_ledger(proc.url, shipped_run())

        async def read() -> list[LedgerEvent]:
            async with connect(NatsSettings(url=proc.url)) as conn:
                return await read_records(conn, EVOLVED) or []
        yield Server(proc.url, root / "data", asyncio.run(read()))
    finally:
        proc.stop()


def rule_ships(records: list[LedgerEvent]) -> list[tuple[HarnessShipped, AddRule]]:
    """Each rule the run's ships added, with its ship."""
    return [(r, op) for r in records if isinstance(r, HarnessShipped) for op in r.operations if isinstance(op, AddRule)]


# --- the three commands on a real run ---------------------------------------------------------------------------


def test_hx_ledger_says_which_rules_each_ship_added(server: Server) -> None:
    shipped = rule_ships(server.records)
    assert len(shipped) >= 2  # the run this module makes ships a rule in most rounds
    rows = [json.loads(line) for line in ok(server.hx("ledger", EVOLVED, "--json")).stdout.splitlines()]
    ships = {r["position"]: r["summary"] for r in rows if r["type"] == "ledger.harness_shipped"}
    at = {id(e): n for n, e in enumerate(server.records, 1)}
    for ship, op in shipped:
        assert f"; add rule: {sentence(op.rule, op.support)}" in ships[at[id(ship)]]
    human = " ".join(ok(server.hx("ledger", EVOLVED)).stdout.replace("│", " ").split())
    ship, op = shipped[0]
    assert f"shipped {ship.candidates[0]} to v0: {ship.digest_before[:19]} -> {ship.digest_after[:19]}; add rule: " \
        f"{sentence(op.rule, op.support)}" in human


def test_hx_report_has_a_rules_shipped_section(server: Server, tmp_path: Path) -> None:
    ok(server.hx("report", EVOLVED, "--out", str(tmp_path)))
    html = (tmp_path / "report.html").read_text()
    section = html[html.index('<h2 id="rules">Rules shipped</h2>'):html.index('<h2 id="tokens">')]
    assert section.count('<h3 data-variant="v0">') == 1
    for ship, op in rule_ships(server.records):
        assert op.support is not None
        row = (f'<tr><td class="text">{escape(sentence(op.rule))}</td><td class="text">'
               f'{escape(support_phrase(op.support))}</td><td class="text">{ship.candidates[0]}</td>'
               f'<td class="text">in force</td><td>{ship.round}</td></tr>')
        assert row in section
    assert '<a href="#rules">Rules shipped</a>' in html


def test_hx_export_writes_the_rules_as_sentences_and_as_data(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "export"
    ok(server.hx("export", EVOLVED, str(out)))
    shipped = rule_ships(server.records)
    lines = [json.loads(line) for line in (out / "data" / "rules.jsonl").read_text().splitlines()]
    assert [(line["round"], line["candidate"]) for line in lines] == [(s.round, s.candidates[0]) for s, _ in shipped]
    index = (out / "INDEX.md").read_text()
    rules_md = index[index.index("## Rules shipped"):index.index("## Files")]
    outcomes = {o["candidate"]: o for o in json.loads((out / "data" / "ship_outcomes.json").read_text())}
    for line, (ship, op) in zip(lines, shipped, strict=True):
        assert op.support is not None
        assert msgspec.convert(line["rule"], Rule) == op.rule
        assert msgspec.convert(line["support"], RuleSupport) == op.support
        assert (line["variant"], line["lever"], line["sentence"], line["in_force"]) == (
            "v0", rule_lever(op.rule), sentence(op.rule, op.support), True)
        assert (f"| {ship.round} | {sentence(op.rule)} | {support_phrase(op.support)} | {ship.candidates[0]} | "
                f"`{rule_lever(op.rule)}` | in force |") in rules_md
        (said,) = outcomes[ship.candidates[0]]["rules"]
        assert (said["op"], said["lever"], said["sentence"]) == ("add_rule", rule_lever(op.rule),
                                                                 sentence(op.rule, op.support))
        card = (out / f"R{ship.round}" / "candidates" / f"{ship.candidates[0]}.md").read_text()
        assert f"1. add rule: {sentence(op.rule, op.support)}\n   - lever `{rule_lever(op.rule)}`" in card
        assert f"add rule: {sentence(op.rule, op.support)}" in (out / f"R{ship.round}" / "decision.md").read_text()
    assert "[data/rules.jsonl](data/rules.jsonl)" in index


def test_hx_diff_names_the_rules_added_between_two_rounds(server: Server) -> None:
    shipped = rule_ships(server.records)
    digests = {r.round: {d.task for d in r.digests} for r in server.records if isinstance(r, RoundDigested)}
    last = max(digests)
    task_id = sorted(digests[0] & digests[last])[0]
    d = json.loads(ok(server.hx("diff", EVOLVED, task_id, "--rounds", "0", str(last), "--json")).stdout)
    added = [f"add rule: {sentence(op.rule)}" for ship, op in shipped if ship.round < last]
    assert d["operations"] == added and d["reproduces"]


def test_hx_ledger_names_the_rules_a_fork_inherits_and_a_ship_drops(server: Server) -> None:
    rows = [json.loads(line) for line in ok(server.hx("ledger", RUN, "--json")).stdout.splitlines()]
    ships = {r["event"].get("candidates", [r["event"].get("candidate")])[0]: r["summary"] for r in rows
             if r["type"] in ("ledger.harness_shipped", "ledger.variant_forked")}
    assert ships["C-R0-01"].endswith(f"; add rule: {AVOID_SAID}")
    assert ships["C-R0-02"].endswith(f"; add rule: {PREFER_SAID}, {support_phrase(RISING)}")
    assert ships["C-R0-03"].startswith("forked v1 from v0 with C-R0-03") and ships["C-R0-03"].endswith(
        "; add rule: never repeat `open …`")
    assert ships["C-R1-01"].endswith(f"; drop rule: {PREFER_SAID}")


def test_the_report_and_export_of_a_fork_and_a_drop() -> None:
    """Per variant: a fork holds the rules its parent held when it was made; a dropped rule says when and by what."""
    records = shipped_run().records
    html = page(ReportData.of(records), [])
    section = html[html.index('<h2 id="rules">Rules shipped</h2>'):html.index('<h2 id="tokens">')]
    v0, v1 = section.split('<h3 data-variant="v1">')
    assert escape(sentence(AVOID)) in v0 and support_phrase(FATAL) in v0 and "C-R0-01" in v0
    assert v0.count("<tr><td") == 2 and "dropped in round 1 by C-R1-01" in v0
    assert "never repeat `open …`" in v1 and v1.count("inherited from v0") == 2 and PREFER_SAID in v1
    files = render(records)
    lines = [json.loads(line) for line in files["data/rules.jsonl"].splitlines()]
    dropped = next(r for r in lines if r["variant"] == "v0" and r["candidate"] == "C-R0-02")
    assert (dropped["in_force"], dropped["dropped_round"], dropped["dropped_by"]) == (False, 1, "C-R1-01")
    assert [(r["candidate"], r["inherited_from"], r["in_force"]) for r in lines if r["variant"] == "v1"] == [
        ("C-R0-01", "v0", True), ("C-R0-02", "v0", True), ("C-R0-03", "", True)]
    assert f"drop rule: {PREFER_SAID}" in files["journal.md"].decode()


# --- what they read ------------------------------------------------------------------------------------------


def test_a_run_without_rules_has_no_rules_section_and_an_empty_rules_file() -> None:
    run = LedgerRun()
    run.ship(0, "C-R0-01", (attach("undo_guard"),), [])
    files = render(run.records)
    assert b"Rules shipped" not in files["INDEX.md"] and files["data/rules.jsonl"] == b""


def test_the_rule_history_follows_the_programs_not_only_the_rule_edits() -> None:
    """A ship that removes the interpreter drops its rules; a hand-written program in the starting harness is
    held from round -1; a rejected candidate's rules are in its row of rejected_candidates.jsonl."""
    start = apply(STARTER, (AddRule(rule=REPEAT),))
    run = LedgerRun(start)
    run.ship(0, "C-R0-01", (AddRule(rule=AVOID, support=FATAL),), [])
    run.ship(1, "C-R1-01", (Remove(group=RULE_GROUP),), [])
    run.proposed(1, "C-R1-02", (AddRule(rule=PREFER, support=RISING),))
    history = rule_history(RunLedger.of(run.records))
    assert [(r.rule, r.round, r.kind, r.shipped, r.dropped_round, r.dropped_by) for r in history] == [
        (REPEAT, -1, "opened", False, 1, "C-R1-01"), (AVOID, 0, "ship", True, 1, "C-R1-01")]
    rejected = [json.loads(line) for line in render(run.records)["data/rejected_candidates.jsonl"].splitlines()]
    assert rejected[0]["rules"][0]["sentence"] == sentence(PREFER, RISING)


def test_a_program_set_by_attach_is_listed_as_sentences_not_as_json() -> None:
    """A candidate card lists the rules of a program an attach sets; hx diff of such an attach stays an attach."""
    program = Attach(processor=RULE_GROUP, hooks=("before_model", "before_tool"),
                     params={"rules": msgspec.to_builtins((AVOID, PREFER))})
    run = LedgerRun()
    run.ship(0, "C-R0-01", (program,), [])
    card = render(run.records)["R0/candidates/C-R0-01.md"].decode()
    assert (f"1. attach rule_program at before_model+before_tool\n   - rule 1: {sentence(AVOID)}\n"
            f"   - rule 2: {sentence(PREFER)}\n") in card
    assert '"rules"' not in card
    built = apply(STARTER, (program,))
    assert rules_in(built.spec()) == (AVOID, PREFER)
    # not at the hooks a first AddRule attaches the interpreter at: hx diff keeps it a plain attach
    assert harness_ops(STARTER, built) == [program]


# --- hx diff, the critic, the planner's dimensions ---------------------------------------------------------------


@pytest.mark.parametrize(("before", "after"), [
    ((), (AVOID,)),
    ((AVOID,), (AVOID, PREFER)),
    ((AVOID, PREFER), (PREFER,)),
    ((AVOID, PREFER), (PREFER, AVOID)),
    ((AVOID, PREFER, REPEAT), (AVOID, REPEAT, PREFER)),
    ((AVOID, PREFER), ()),
])
def test_the_harness_diff_of_two_programs_is_the_rules_dropped_and_added(before: tuple[Rule, ...],
                                                                         after: tuple[Rule, ...]) -> None:
    def holding(rules: tuple[Rule, ...]) -> HarnessConfig:
        return apply(STARTER, tuple(AddRule(rule=r) for r in rules))
    a, b = holding(before), holding(after)
    ops = harness_ops(a, b)
    assert ops and all(isinstance(op, AddRule | DropRule) for op in ops), [describe(op) for op in ops]
    assert apply(a, ops) == b
    dropped = {op.rule for op in ops if isinstance(op, DropRule)}
    assert {op.rule for op in ops if isinstance(op, AddRule)} >= set(after) - set(before)
    assert dropped >= set(before) - set(after)
    assert any(line.startswith(("add rule: ", "drop rule: ")) for line in map(describe, ops))


def test_the_critic_backs_a_dropped_rule_by_the_regressions_it_undoes() -> None:
    """A rule's revert claims no failure category (the tasks regressed): like a removal, its flips are backed by
    their failing now."""
    run = LedgerRun()
    run.digested(0, [task("toy:a:1", passes=1), task("toy:a:2")])
    run.ship(0, "C-R0-01", (AddRule(rule=AVOID, support=FATAL),), ["toy:a:2"])
    digests = run.digested(1, [task("toy:a:1", category="env_failure"), task("toy:a:2")])
    base = run.state.variants["v0"].harness
    drop = (DropRule(rule=AVOID),)
    cand = CandidateProposed(run_id=run.run_id, round=1, candidate="C-R1-01", variant="v0", evolver="induced",
                             operations=drop, buckets=("config",),
                             manifest=Manifest(predicted_flips=("toy:a:1",), attribution=RULE_GROUP,
                                               evidence=(Anchor(seq=1),)),
                             base_digest=base.digest, digest=apply(base, drop).digest)
    judged = review(run.state, 1, [cand], digests, revised=True)
    assert judged.ranking == ("C-R1-01",) and judged.concerns["C-R1-01"] == []


def test_the_first_rule_touches_the_dimension_of_the_interpreter_it_attaches() -> None:
    assert dimensions_of((AddRule(rule=AVOID),), STARTER) == ("D4",)
