"""The critic's regression rule, its overlap statement, and the manifest's paper fields (on the ledger and off).

A round with a regression no candidate addresses and none accepts with a reason is a no-op
naming the task; the offline evolver fills capability evidence, tasks to stabilise, the
expected minimum of attribution triggers and the partial passes it accepts losing; an old
manifest decodes and keeps its digest.
"""

from __future__ import annotations

import hashlib

import msgspec
from ledger_run import attach
from test_aegis_gate import ROUND, digest, opened, proposal

from hx.aegis.critic import review
from hx.aegis.evolvers.base import Context
from hx.aegis.evolvers.offline import OfflineEvolver
from hx.aegis.planner import plan
from hx.aegis.state import RunState
from schemas.edits import AcceptedRegression, Anchor, Manifest
from schemas.ledger import CandidateProposed, CriticJudged, RoundDigested, ledger_digest

BEFORE = (digest("b:g:dev:1"), digest("b:g:dev:6", passes=2), digest("b:g:dev:7", passes=1))
"""Round 0: dev:6 passed both attempts, dev:7 one of two."""
NOW = (*ROUND, digest("b:g:dev:6"), digest("b:g:dev:7"))
"""Round 1: both lost (regressions)."""


def state() -> RunState:
    """A run whose round 0 solved dev:6 and dev:7."""
    return RunState.of([opened(), RoundDigested(run_id="gate-run", round=0, actionability=1.0, digests=BEFORE,
                                                trace_rounds=(0,))])


def accepting(cand: CandidateProposed, *tasks: str, why: str = "noise") -> CandidateProposed:
    """``cand`` with its manifest accepting ``tasks`` as regressions."""
    accepted = tuple(AcceptedRegression(task=t, why=why) for t in tasks)
    return msgspec.structs.replace(cand, manifest=msgspec.structs.replace(cand.manifest,
                                                                          accepted_regressions=accepted))


def test_a_round_that_neither_addresses_nor_accepts_a_regression_is_a_no_op() -> None:
    """dev:6 and dev:7 regressed: a candidate that ignores them ships nothing; predicting one back and accepting the
    other with a reason lets the ranking stand; a reason left empty does not count."""
    cand = proposal("C1", (attach("visited_states"),), ["b:g:dev:1"], ["loop"])
    turned = review(state(), 1, [cand], NOW, revised=True)
    assert turned.no_op and turned.unaddressed == ("b:g:dev:6", "b:g:dev:7")
    assert "b:g:dev:6" not in turned.strategy_concern  # not relayed to the next planner as a strategy concern
    broken = msgspec.structs.replace(accepting(proposal("C3", (attach("undo_guard"),), ["b:g:dev:6"], ["loop"]),
                                               "b:g:dev:7"), build_error="does not build")
    elsewhere = msgspec.structs.replace(accepting(proposal("C4", (attach("undo_guard"),), ["b:g:dev:6"], ["loop"]),
                                                  "b:g:dev:7"), variant="v1")
    assert review(state(), 1, [cand, broken, elsewhere], NOW, revised=True).unaddressed == ("b:g:dev:6",
                                                                                            "b:g:dev:7")
    back = proposal("C2", (attach("undo_guard"),), ["b:g:dev:1", "b:g:dev:6"], ["loop"])
    kept = review(state(), 1, [cand, accepting(back, "b:g:dev:7")], NOW, revised=True)
    assert not kept.no_op and kept.unaddressed == () and kept.ranking
    silent = review(state(), 1, [cand, accepting(back, "b:g:dev:7", why=" ")], NOW, revised=True)
    assert silent.no_op and silent.unaddressed == ("b:g:dev:7",)
    assert not review(RunState.of([opened()]), 1, [cand], NOW, revised=True).no_op  # no earlier round: none


def test_the_critic_states_each_candidates_overlap_with_the_harness() -> None:
    """A lever joining hooks the starter already serves says with whom; removing a group names what it removes."""
    joins = proposal("C1", (attach("visited_states"),), ["b:g:dev:1"], ["loop"])
    got = review(RunState.of([opened()]), 0, [joins], ROUND, revised=True)
    [line, *_] = got.overlaps["C1"]
    assert line.startswith("visited_states joins ") and "(with " in line
    assert got.overlap_list()[0].candidate == "C1"


async def test_the_offline_evolver_fills_the_papers_manifest_fields_from_the_evidence() -> None:
    """Capability evidence per attached processor, the partial passes of the predicted clusters to stabilise, one
    attribution trigger, and the lost partial pass (dev:7) accepted as noise, never the full one (dev:6)."""
    s = state()
    landscape = plan(s, 1, NOW)
    proposals = await OfflineEvolver().propose(Context(round=1, state=s, landscape=landscape, digests=NOW), 3)
    assert proposals
    for p in proposals:
        m = p.manifest
        attached = [op for op in p.operations if hasattr(op, "processor")]
        assert len(m.capability_evidence) == len(attached)
        assert all(e.kind == "builtin_processor" and "registered as hx." in e.evidence for e in m.capability_evidence)
        assert m.stabilise == ("b:g:dev:4",) and m.expected_min_calls == 1
        accepted = {a.task: a.why for a in m.accepted_regressions}
        assert "b:g:dev:6" not in accepted
        if "b:g:dev:7" not in m.predicted_flips:
            assert "passed 1 of 2 attempts in round 0" in accepted["b:g:dev:7"]


def test_an_older_manifest_and_critic_verdict_keep_their_digests() -> None:
    """The new fields hold their defaults on an event written before them: the digest is the older bytes'."""
    cand = proposal("C1", (attach("visited_states"),), ["b:g:dev:1"], ["loop"])
    judged = CriticJudged(run_id="r", round=0, ranking=("C1",))
    for event, nested in ((cand, ("manifest", ("capability_evidence", "stabilise", "expected_min_calls",
                                               "accepted_regressions"))),
                          (judged, ("", ("overlaps", "unaddressed")))):
        body = msgspec.msgpack.decode(msgspec.msgpack.encode(event))
        del body["signature"]
        for absent in ("public_key", "at_ns"):
            body.pop(absent, None)
        outer, names = nested
        for name in names:
            del (body[outer] if outer else body)[name]
        older = "sha256:" + hashlib.sha256(type(event).TYPE.encode() + b"\0" + msgspec.msgpack.encode(body)).hexdigest()
        assert ledger_digest(event) == older
    filled = msgspec.structs.replace(cand.manifest, stabilise=("b:g:dev:4",))
    assert ledger_digest(msgspec.structs.replace(cand, manifest=filled)) != ledger_digest(cand)
    assert msgspec.convert({"intended_effect": "x", "evidence": [{"seq": 1}]}, Manifest).evidence == (Anchor(seq=1),)
