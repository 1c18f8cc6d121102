"""The rule edits ``AddRule`` and ``DropRule``: applying them, their names and levers, the ledger bytes, the critic.

A rule reaches a harness only as an edit on the ledger; these tests hold the edit to what
the ledger needs: the same rule makes the same harness and the same lever name in any
process, a program emptied again is the harness it started from, and the operations older
ledgers hold encode to the bytes they were chained by.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from hx.aegis.critic import overlap
from hx.aegis.levers import edit_of
from hx.aegis.operations import bucket_of, buckets_of, risk_of
from hx.aegis.state import RunState
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply, describe, program_of
from hx.harness.errors import CompositionError
from hx.harnesses import starter_harness
from hx.processors import RuleProgram
from projections.ledger_records import lever_of, levers_of
from schemas.edits import RULE_GROUP, AddRule, Anchor, AnyEditOp, Attach, DropRule, Manifest, Remove, Reparam, Replace
from schemas.envelope import decode_body, encode_body
from schemas.ledger import CandidateProposed, LedgerOpened, ledger_digest
from schemas.rules import (
    Avoid,
    ForbidRepeat,
    LastObservation,
    Pattern,
    Rule,
    RuleSupport,
    Says,
    TaskText,
    rule_digest,
    rule_lever,
)

BASE = starter_harness("textworld")
ODD = Rule(do=Avoid(what=Pattern(starts="eat", not_named_in=TaskText())))
DARK = Rule(do=Avoid(what=Pattern(starts="move")), when=(Says(text=LastObservation(), words=("dark",)),))
ONCE = Rule(do=ForbidRepeat(what=Pattern(starts="open")), at="before_tool")
FATAL = RuleSupport(method="fatal", attempts=14, tasks=3, steps=15, against=2)


# --- applying -----------------------------------------------------------------------------------


def test_the_first_rule_attaches_the_interpreter_and_later_ones_extend_its_program() -> None:
    assert program_of(BASE, RULE_GROUP) == ()
    one = apply(BASE, [AddRule(rule=ODD, support=FATAL)])
    [interpreter] = [a for a in one.attachments if a.group() == RULE_GROUP]
    assert interpreter.type == "rule_program" and tuple(interpreter.hooks) == RuleProgram.accepted_hooks()
    assert program_of(one, RULE_GROUP) == (ODD,)
    two = apply(one, [AddRule(rule=DARK), AddRule(rule=ONCE)])
    assert program_of(two, RULE_GROUP) == (ODD, DARK, ONCE)  # in the order added
    assert [a.group() for a in two.attachments].count(RULE_GROUP) == 1
    assert len(two.attachments) == len(BASE.attachments) + 1
    assert two.digest != one.digest != BASE.digest


def test_what_a_rule_rests_on_does_not_change_the_harness() -> None:
    plain = apply(BASE, [AddRule(rule=ODD)])
    assert apply(BASE, [AddRule(rule=ODD, support=FATAL)]).digest == plain.digest
    with pytest.raises(CompositionError, match=r"operation 2 \(add rule: avoid `eat …` that names something not in "
                                               r"the task\): the rule program already holds this rule"):
        apply(BASE, [AddRule(rule=ODD, support=FATAL), AddRule(rule=ODD)])


def test_dropping_rules_and_the_last_one_gives_the_harness_back() -> None:
    three = apply(BASE, [AddRule(rule=ODD), AddRule(rule=DARK), AddRule(rule=ONCE)])
    assert program_of(apply(three, [DropRule(rule=DARK)]), RULE_GROUP) == (ODD, ONCE)
    emptied = apply(three, [DropRule(rule=ONCE), DropRule(rule=ODD), DropRule(rule=DARK)])
    assert all(a.group() != RULE_GROUP for a in emptied.attachments)
    assert emptied.digest == BASE.digest and emptied == BASE
    with pytest.raises(CompositionError, match=r"operation 1 .*: the rule program holds no such rule: avoid `eat …`"):
        apply(BASE, [DropRule(rule=ODD)])


def test_a_rule_that_cannot_run_is_a_composition_error_naming_the_operation() -> None:
    newer = Rule(do=Avoid(what=Pattern(starts="eat")), language=2)
    with pytest.raises(CompositionError) as caught:
        apply(BASE, [AddRule(rule=ODD), AddRule(rule=newer)])
    assert str(caught.value) == ("operation 2 (add rule: avoid `eat …`): processor 'rule_program': bad parameters: "
                                 "rule 2 (avoid `eat …`): rule language 2 is newer than this hx reads (1); upgrade "
                                 "hx to run it")
    every = Rule(do=Avoid(what=Pattern()))
    with pytest.raises(CompositionError, match="would narrow the offer to nothing"):
        apply(BASE, [AddRule(rule=every)])


def test_a_harness_with_rules_serialises_and_reads_back_the_same() -> None:
    held = apply(BASE, [AddRule(rule=ODD), AddRule(rule=DARK), AddRule(rule=ONCE)])
    for fmt in ("yaml", "json", "toml"):
        again = HarnessConfig.loads(held.dumps(fmt), fmt)
        assert again.digest == held.digest and program_of(again, RULE_GROUP) == (ODD, DARK, ONCE)
    assert HarnessConfig.from_spec(held.spec()).digest == held.digest


# --- names: describe, lever_of --------------------------------------------------------------------


def test_describe_says_the_rule_and_its_support_in_words() -> None:
    assert describe(AddRule(rule=ODD, support=FATAL)) == (
        "add rule: avoid `eat …` that names something not in the task, supported by 14 failing attempts that "
        "ended on it (3 task(s)), 2 step(s) against")
    assert describe(AddRule(rule=DARK)) == "add rule: avoid `move …` when the last observation says 'dark'"
    assert describe(DropRule(rule=ONCE)) == "drop rule: never repeat `open …` (refusing the call)"


LEVER = "rule:ab3f737c08ea"
"""The lever of adding ``ODD``, as every hx so far names it: changing it renames the rules of old ledgers."""


def test_a_rules_lever_is_the_digest_of_its_canonical_json() -> None:
    canonical = json.dumps(msgspec.to_builtins(ODD), sort_keys=True, separators=(",", ":"))
    assert rule_digest(ODD) == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert rule_lever(ODD) == lever_of(AddRule(rule=ODD)) == lever_of(AddRule(rule=ODD, support=FATAL)) == LEVER
    assert lever_of(DropRule(rule=ODD)) == "drop-" + LEVER
    assert levers_of([AddRule(rule=ODD), AddRule(rule=DARK), AddRule(rule=ODD)]) == (LEVER, rule_lever(DARK))
    # the same rule read back from JSON written in another key order: the same name
    shuffled = b'{"do":{"what":{"not_named_in":{"text":"task"},"starts":"eat"},"do":"avoid"}}'
    assert rule_lever(msgspec.json.decode(shuffled, type=Rule)) == LEVER
    assert len({rule_lever(r) for r in (ODD, DARK, ONCE)}) == 3


def test_a_rules_lever_is_the_same_in_another_process() -> None:
    code = ("from schemas.rules import *\n"
            "print(rule_lever(Rule(do=Avoid(what=Pattern(starts='eat', not_named_in=TaskText())))))")
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == LEVER


def test_a_rule_edit_is_a_config_edit_of_low_risk() -> None:
    assert bucket_of(AddRule(rule=ODD)) == bucket_of(DropRule(rule=ODD)) == "config"
    assert bucket_of(edit_of(LEVER)) == bucket_of(edit_of("drop-" + LEVER)) == "config"
    assert risk_of([AddRule(rule=ODD)]) == 0.1 and risk_of([DropRule(rule=ODD)]) == 0.3
    assert risk_of([AddRule(rule=ODD), DropRule(rule=DARK)]) == 0.3
    assert risk_of([AddRule(rule=ODD), Remove(group="loop_detector")]) == 0.5
    assert risk_of([AddRule(rule=ODD)], new_code=True) == 0.8
    assert buckets_of([AddRule(rule=ODD), Attach(processor="visited_states", hooks=("after_tool",))]) == (
        "config", "processor")


# --- the ledger's bytes ---------------------------------------------------------------------------

OLD_OPS: list[tuple[AnyEditOp, str, str]] = [
    (Attach(processor="visited_states", hooks=("after_tool", "before_model")),
     '{"op":"attach","processor":"visited_states","hooks":["after_tool","before_model"],"params":{}}',
     "84a26f70a6617474616368a970726f636573736f72ae766973697465645f737461746573a5686f6f6b7392aa61667465725f746f6f6c"
     "ac6265666f72655f6d6f64656ca6706172616d7380"),
    (Reparam(group="loop_detector", params={"warn_after": 6}),
     '{"op":"reparam","group":"loop_detector","params":{"warn_after":6}}',
     "83a26f70a77265706172616da567726f7570ad6c6f6f705f6465746563746f72a6706172616d7381aa7761726e5f616674657206"),
    (Replace(group="history_window", processor="history_window", params={"keep_last": 12}),
     '{"op":"replace","group":"history_window","processor":"history_window","params":{"keep_last":12}}',
     "84a26f70a77265706c616365a567726f7570ae686973746f72795f77696e646f77a970726f636573736f72ae686973746f72795f77696e"
     "646f77a6706172616d7381a96b6565705f6c6173740c"),
    (Remove(group="observation_trim"), '{"op":"remove","group":"observation_trim"}',
     "82a26f70a672656d6f7665a567726f7570b06f62736572766174696f6e5f7472696d"),
]
"""Operations as the hx before the rule edits encoded them (JSON, msgpack)."""
OLD_CANDIDATE = "sha256:62545ff1262af70e920b0be40901286cb3f4b86cb892e072f067e722678a10ed"
"""The ledger digest the hx before the rule edits gave ``candidate(OLD_OPS)``."""


def candidate(ops: tuple[AnyEditOp, ...], base: HarnessConfig | None = None) -> CandidateProposed:
    m = Manifest(intended_effect="x", categories=("loop",), predicted_flips=("b:g:dev:1",), evidence=(Anchor(seq=1),),
                 attribution="x")
    return CandidateProposed(run_id="r", round=0, candidate="C-R0-01", variant="v0", evolver="offline",
                             operations=ops, buckets=("processor", "config"), manifest=m,
                             base_digest=base.digest if base else "sha256:" + "0" * 64,
                             digest="sha256:" + "1" * 64)


@pytest.mark.parametrize(("op", "as_json", "as_msgpack"), OLD_OPS, ids=lambda v: getattr(v, "op", None) or "")
def test_older_operations_decode_and_encode_to_the_same_bytes(op: AnyEditOp, as_json: str, as_msgpack: str) -> None:
    assert msgspec.json.encode(op).decode() == as_json and msgspec.msgpack.encode(op).hex() == as_msgpack
    assert msgspec.json.decode(as_json, type=AnyEditOp) == op
    assert msgspec.msgpack.decode(bytes.fromhex(as_msgpack), type=AnyEditOp) == op


def test_an_older_candidate_keeps_its_ledger_digest_and_rule_edits_round_trip() -> None:
    old = candidate(tuple(op for op, _, _ in OLD_OPS))
    assert ledger_digest(old) == OLD_CANDIDATE
    assert decode_body(old.TYPE, old.VERSION, encode_body(old)) == old
    new = candidate((AddRule(rule=ODD, support=FATAL), DropRule(rule=DARK), AddRule(rule=ONCE)))
    body = encode_body(new)
    again = decode_body(new.TYPE, new.VERSION, body)
    assert again == new and encode_body(again) == body and ledger_digest(again) == ledger_digest(new)
    assert msgspec.json.encode(AddRule(rule=ODD)) == (
        b'{"op":"add_rule","rule":{"do":{"do":"avoid","what":{"starts":"eat","not_named_in":{"text":"task"}}}},'
        b'"support":null,"group":"rule_program"}')


# --- the critic -----------------------------------------------------------------------------------


def state_on(harness: HarnessConfig) -> RunState:
    return RunState.of([LedgerOpened(run_id="r", strategy="ensemble", harness=harness.spec(), digest=harness.digest)])


def test_the_critic_names_the_rules_a_rule_edit_joins() -> None:
    held = apply(BASE, [AddRule(rule=ODD), AddRule(rule=DARK)])
    assert overlap(state_on(held), candidate((AddRule(rule=ONCE),), held)) == [
        "adds a rule to the 2 rule(s) of rule_program"]
    assert overlap(state_on(held), candidate((DropRule(rule=DARK),), held)) == [
        "drops a rule from the 2 rule(s) of rule_program"]
    mixed = candidate((AddRule(rule=ONCE), Reparam(group="loop_detector", params={"warn_after": 6})), held)
    assert overlap(state_on(held), mixed) == ["adds a rule to the 2 rule(s) of rule_program",
                                              "re-parameterises loop_detector (group loop_detector)"]

