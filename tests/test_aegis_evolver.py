"""The offline evolver and the edit operations on their own: which candidates the evidence calls for (reverts,
relaxations, attachments and their combinations), that every one builds from registered processors and is new,
and how attach / replace / remove / reparam change a harness or say exactly why they cannot."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from ledger_run import LedgerRun, attach

from hx.aegis import levers
from hx.aegis.evolvers.base import Context, Proposal
from hx.aegis.evolvers.offline import COMBINE_UP_TO, OfflineEvolver, relaxed
from hx.aegis.operations import CODE_RISK, RISK, bucket_of, buckets_of, dimensions_of, risk_of, strings_in
from hx.aegis.planner import plan
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply, describe
from hx.harness.errors import CompositionError, Interrupt
from hx.harness.processor import build, processor_type, registered
from hx.harnesses import starter_harness
from hx.runtime.pipeline import HookPipeline
from projections.ledger_records import lever_of
from schemas.edits import Anchor, AnyEditOp, Attach, Remove, Reparam, Replace
from schemas.event import Event
from schemas.hooks import AfterTool, BeforeModel, ProcessorTriggered
from schemas.landscape import TaskDigest
from schemas.ledger import CriticJudged
from schemas.messages import Message, ToolCall, ToolResult

RUN = "evolve-run"
BASE = starter_harness("textworld")


def failing(name: str, category: str, *, variant: str = "v0", implicated: tuple[str, ...] = (),
            seq: int = 0) -> TaskDigest:
    """A task that failed both attempts, with one evidence anchor."""
    return TaskDigest(task=name, cluster=":".join(name.split(":")[:2]), variant=variant, attempts=2, passes=0,
                      category=category, implicated=implicated, evidence=(Anchor(seq=seq or 100 + len(name)),))


def solved(name: str, variant: str = "v0") -> TaskDigest:
    """A task that passed."""
    return TaskDigest(task=name, cluster=":".join(name.split(":")[:2]), variant=variant, attempts=2, passes=1)


class Run(LedgerRun):
    """A run of this module's tests."""

    def __init__(self, harness: HarnessConfig = BASE) -> None:
        super().__init__(harness, RUN)


def context(run: Run, round: int, digests: Sequence[TaskDigest]) -> Context:
    """What the evolver sees in ``round``: the planner's landscape of these digests."""
    state = run.state
    return Context(round, state, plan(state, round, digests), tuple(digests))


async def propose(run: Run, round: int, digests: Sequence[TaskDigest], k: int = 100) -> list[Proposal]:
    """The offline evolver's candidates for a round."""
    return await OfflineEvolver().propose(context(run, round, digests), k)


def singles(proposals: Sequence[Proposal]) -> list[Proposal]:
    """The proposals that attach exactly one processor."""
    return [p for p in proposals if len(p.operations) == 1 and isinstance(p.operations[0], Attach)]


MIXED = (
    failing("b:g:dev:1", "loop"), failing("b:g:dev:2", "loop"), failing("b:g:dev:3", "loop"),
    failing("b:g:dev:4", "stagnation"), failing("b:g:dev:5", "invalid_action"),
    failing("b:g:dev:6", "premature_answer"), failing("b:g:dev:7", "partial_progress"),
    failing("b:g:dev:8", "infrastructure"), solved("b:g:dev:9"),
)


# --- attachments ------------------------------------------------------------------------------------


async def test_every_attachment_addresses_failing_tasks_and_predicts_exactly_them() -> None:
    """One attachment per standalone lever the variant lacks whose categories fail; it predicts its support."""
    proposals = singles(await propose(Run(), 0, MIXED))
    failing_cats = {d.category for d in MIXED if not d.solved}
    expected = {name for name, cls in levers.catalog(standalone=True).items()
                if cls.group() not in BASE.groups() and failing_cats & set(cls.addresses)}
    assert {p.operations[0].processor for p in proposals} == expected  # type: ignore[union-attr]
    for p in proposals:
        op = p.operations[0]
        assert isinstance(op, Attach)
        cls = registered()[op.processor]
        support = [d for d in MIXED if not d.solved and d.category in cls.addresses]
        assert p.variant == "v0" and op.params == {}
        assert op.hooks == cls.accepted_hooks()
        assert p.manifest.predicted_flips == tuple(d.task for d in support)
        assert set(p.manifest.categories) == {d.category for d in support}
        assert p.manifest.evidence == tuple(a for d in support for a in d.evidence)
        assert p.manifest.attribution == cls.group() and p.manifest.intended_effect


async def test_proposals_build_from_registered_processors_and_never_duplicate_a_group() -> None:
    """Every candidate applies to its variant's harness, names registered processors, and adds no group it holds."""
    proposals = await propose(Run(), 0, MIXED)
    assert proposals
    for p in proposals:
        harness = apply(BASE, p.operations)
        for op in p.operations:
            if isinstance(op, Attach | Replace):
                assert op.processor in registered()
            if isinstance(op, Attach):
                assert processor_type(op.processor).group() not in BASE.groups()
        assert harness.digest != BASE.digest
    keys = [(p.variant, tuple(lever_of(op) for op in p.operations)) for p in proposals]
    assert len(keys) == len(set(keys))


async def test_levers_that_need_configuring_are_never_proposed() -> None:
    """Non-standalone levers (an empty allow-list, a judge without a model) stay out even when their failures show."""
    non_standalone = set(levers.catalog()) - set(levers.catalog(standalone=True))
    assert non_standalone
    cats = {c for name in non_standalone for c in processor_type(name).addresses}
    digests = [failing(f"b:g:dev:{i}", c) for i, c in enumerate(sorted(cats))]
    pulled = {lever_of(op) for p in await propose(Run(), 0, digests) for op in p.operations}
    assert pulled and not pulled & non_standalone


async def test_a_lever_the_harness_already_holds_is_not_attached_again() -> None:
    """The loop detector is in the starter harness: a loop failure never attaches a second one."""
    held = apply(BASE, (attach("visited_states"),))
    run = Run(held)
    pulled = [lever_of(op) for p in await propose(run, 0, [failing("b:g:dev:1", "loop")]) for op in p.operations]
    assert "loop_detector" in levers.catalog(standalone=True) and "loop_detector" not in pulled
    assert "visited_states" not in pulled
    assert "explore_untried" in pulled


async def test_the_heaviest_levers_come_first_and_together() -> None:
    """The top three and top two single attachments are proposed first, as one combined step each."""
    proposals = await propose(Run(), 0, MIXED)
    ones = singles(proposals)
    assert COMBINE_UP_TO == 3
    top3, top2 = proposals[0], proposals[1]
    assert top3.operations == tuple(op for p in ones[:3] for op in p.operations)
    assert top2.operations == tuple(op for p in ones[:2] for op in p.operations)
    assert proposals[2:2 + len(ones)] == ones  # then the singles, heaviest first
    assert top3.manifest.predicted_flips == tuple(dict.fromkeys(t for p in ones[:3]
                                                                for t in p.manifest.predicted_flips))
    assert top3.manifest.attribution == ones[0].manifest.attribution
    assert set(top3.manifest.categories) == {c for p in ones[:3] for c in p.manifest.categories}
    supports = [len(p.manifest.predicted_flips) for p in ones]  # untried levers all weigh their support
    assert supports == sorted(supports, reverse=True)


async def test_a_lever_tried_before_without_success_yields_to_an_untried_one() -> None:
    """Of two levers with the same support, the one already proposed (and not shipped) drops behind."""
    digests = [failing("b:g:dev:1", "loop"), failing("b:g:dev:2", "stagnation")]
    first = singles(await propose(Run(), 0, digests))
    a, b = first[0].operations[0], first[1].operations[0]
    assert len(first[0].manifest.predicted_flips) == len(first[1].manifest.predicted_flips)
    run = Run()
    run.proposed(0, "C-R0-01", (a,), ["b:g:dev:1"])  # proposed, and not shipped
    run.proposed(0, "C-R0-02", (attach("task_notes"),))
    run.shipped(0, "C-R0-02")  # a new base harness: the old candidate is fresh on it, but its lever has a record
    again = [p.operations[0] for p in singles(await propose(run, 1, digests))]
    assert again[0] == b
    assert again[-1] == a  # behind even the untried levers with half its support


async def test_k_caps_the_number_of_candidates_and_keeps_the_heaviest() -> None:
    """Asking for fewer candidates returns the head of the full ranking."""
    everything = await propose(Run(), 0, MIXED)
    assert len(everything) > 3
    assert await propose(Run(), 0, MIXED, k=3) == everything[:3]
    assert await propose(Run(), 0, MIXED, k=1) == everything[:1]


async def test_nothing_is_proposed_when_nothing_fails_for_a_harness_reason() -> None:
    """Solved tasks and infrastructure failures call for no edit."""
    assert await propose(Run(), 0, [solved("b:g:dev:1"), failing("b:g:dev:2", "infrastructure")]) == []


async def test_a_banned_lever_is_left_out_alone_and_in_combinations() -> None:
    """A lever the critic banned for this round appears in no candidate."""
    run = Run()
    top = singles(await propose(run, 1, MIXED))[0].operations[0]
    assert isinstance(top, Attach)
    run.records.append(CriticJudged(run_id=RUN, round=0, strategy_concern="low hit rate", banned=(top.processor,)))
    pulled = {lever_of(op) for p in await propose(run, 1, MIXED) for op in p.operations}
    assert pulled and top.processor not in pulled
    assert top.processor in {lever_of(op) for p in await propose(run, 2, MIXED) for op in p.operations}


async def test_a_candidate_already_judged_on_this_harness_is_not_proposed_again() -> None:
    """The same operations on the same base harness would only be rejected again; on a new base they are fresh."""
    digests = [failing("b:g:dev:1", "loop"), failing("b:g:dev:2", "loop")]
    run = Run()
    before = await propose(run, 0, digests)
    for i, p in enumerate(before):
        run.proposed(0, f"C-R0-{i:02d}", p.operations, p.manifest.predicted_flips)
    assert await propose(run, 1, digests) == []
    run.proposed(1, "C-R1-01", (attach("task_notes"),))
    run.shipped(1, "C-R1-01")  # the variant's harness changed: the old candidates may be tried on it
    after = await propose(run, 2, digests)
    assert {tuple(map(describe, p.operations)) for p in after} == {tuple(map(describe, p.operations)) for p in before}


async def test_a_verdict_holds_for_the_model_it_was_made_under() -> None:
    """Once the policy changed, an edit judged on this harness under the old one may be proposed again, after every
    edit not judged on it yet; under the new policy it is judged once more, and then not again."""
    digests = [failing("b:g:dev:1", "loop"), failing("b:g:dev:2", "loop")]
    run = Run()
    run.model_changed(0, "policy:aaaa")
    every = await propose(run, 0, digests)
    assert len(every) > 2
    top = every[0]
    run.proposed(0, "C-R0-01", top.operations, top.manifest.predicted_flips)
    assert await propose(run, 1, digests) == every[1:]  # same harness, same model: the verdict stands
    assert await propose(run, 1, digests, k=1) == every[1:2]
    run.model_changed(2, "policy:bbbb")
    assert (run.state.model, run.state.model_since) == ("policy:bbbb", 2)
    assert await propose(run, 2, digests) == [*every[1:], top]  # judged again, but only after the new ones
    assert await propose(run, 2, digests, k=2) == every[1:3]
    for i, p in enumerate(every[1:3]):
        run.proposed(2, f"C-R2-{i:02d}", p.operations, p.manifest.predicted_flips)
    assert await propose(run, 2, digests) == [*every[3:], top]
    for i, p in enumerate([*every[3:], top]):
        run.proposed(2, f"C-R2-{i + 2:02d}", p.operations, p.manifest.predicted_flips)
    assert await propose(run, 3, digests) == []  # everything judged under the policy in force


async def test_each_variant_gets_candidates_for_its_own_tasks_and_harness() -> None:
    """A fork that holds a lever gets no second copy; each variant's manifests predict only its own tasks."""
    run = Run()
    run.proposed(0, "C-R0-01", (attach("explore_untried"),), ["a:y:dev:1"])
    run.forked(0, "C-R0-01", "v1", ("a:y",))
    digests = [failing("a:x:dev:1", "loop"), failing("a:y:dev:1", "loop", variant="v1"),
               failing("a:y:dev:2", "stagnation", variant="v1")]
    proposals = await propose(run, 1, digests)
    assert {p.variant for p in proposals} == {"v0", "v1"}
    for p in proposals:
        own = {d.task for d in digests if d.variant == p.variant}
        assert set(p.manifest.predicted_flips) <= own
        apply(run.state.variants[p.variant].harness, p.operations)
    v1_levers = {lever_of(op) for p in proposals if p.variant == "v1" for op in p.operations}
    assert "explore_untried" not in v1_levers
    assert "explore_untried" in {lever_of(op) for p in proposals if p.variant == "v0" for op in p.operations}


# --- reverts and relaxations ---------------------------------------------------------------------------


async def test_a_regression_proposes_removing_what_its_suspect_attached_first() -> None:
    """A task the last ship broke: the heaviest candidate removes the suspect's processor, predicting the task."""
    run = Run()
    run.digested(0, [solved("b:g:dev:1"), failing("b:g:dev:2", "loop"), solved("b:g:dev:3")])
    run.proposed(0, "C-R0-01", (attach("undo_guard"), Reparam(group="loop_detector", params={"warn_after": 4})),
                 ["b:g:dev:2"])
    run.shipped(0, "C-R0-01")
    now = [failing("b:g:dev:1", "no_progress"), failing("b:g:dev:2", "loop"), failing("b:g:dev:3", "loop")]
    proposals = await propose(run, 1, now)
    revert = proposals[0]
    assert revert.operations == (Remove(group="undo_guard"),)  # reparams are not reverted by removal
    assert revert.manifest.predicted_flips == ("b:g:dev:1", "b:g:dev:3")
    assert revert.manifest.attribution == "undo_guard"
    assert revert.manifest.evidence == now[0].evidence
    assert sum(1 for p in proposals if p.operations == revert.operations) == 1  # two regressions, one revert


async def test_no_revert_of_a_processor_the_variant_no_longer_holds() -> None:
    """When the suspect's processor was removed since, there is nothing to revert."""
    run = Run()
    run.digested(0, [solved("b:g:dev:1")])
    run.proposed(0, "C-R0-01", (attach("undo_guard"),), ["b:g:dev:1"])
    run.shipped(0, "C-R0-01")
    run.proposed(0, "C-R0-02", (Remove(group="undo_guard"),))
    run.shipped(0, "C-R0-02")
    proposals = await propose(run, 1, [failing("b:g:dev:1", "premature_answer")])
    assert all(not isinstance(op, Remove) for p in proposals for op in p.operations)


async def test_a_processor_that_ended_failing_attempts_is_relaxed() -> None:
    """Interrupted tasks relax the group they blame first, if it declares limits: doubled, predicting those tasks."""
    run = Run()
    digests = [failing("b:g:dev:1", "interrupted", implicated=("loop_detector", "history_window")),
               failing("b:g:dev:2", "interrupted", implicated=("loop_detector",)),
               failing("b:g:dev:3", "interrupted", implicated=("history_window", "loop_detector"))]
    relax = {op.group: p for p in await propose(run, 0, digests) if isinstance(op := p.operations[0], Reparam)}
    assert set(relax) == {"loop_detector"}  # history_window declares no limits: it cannot end an attempt
    op = relax["loop_detector"].operations[0]
    assert isinstance(op, Reparam)
    assert op.params["interrupt_after"] == 2 * all_params("loop_detector")["interrupt_after"]
    assert set(op.params) <= set(all_params("loop_detector"))
    assert relax["loop_detector"].manifest.predicted_flips == ("b:g:dev:1", "b:g:dev:2")
    for group, p in relax.items():
        assert p.manifest.categories == ("interrupted",) and p.manifest.attribution == group
    run.records.append(CriticJudged(run_id=RUN, round=0, banned=("reparam:loop_detector",)))
    assert not [p for p in await propose(run, 1, digests) if isinstance(p.operations[0], Reparam)]


def all_params(group: str) -> dict[str, Any]:
    """Every parameter (defaults included) of the starter harness's processor in ``group``."""
    att = next(a for a in BASE.attachments if a.group() == group)
    return dict(msgspec.structs.asdict(att.build()))


def test_relaxing_doubles_only_numeric_limits() -> None:
    """Declared limits double; processors without any cannot be relaxed; zero (no limit) stays zero."""
    by = {a.group(): a for a in BASE.attachments}
    assert relaxed(by["tool_call_corrector"]) is None
    assert relaxed(by["system_prompt_template"]) is None
    assert relaxed(by["observation_trim"]) is None  # max_chars bounds an observation, not the attempt
    budget = relaxed(by["budget"])
    assert budget == {"max_tokens": 2 * by["budget"].params["max_tokens"]}  # max_model_calls = 0: no limit


def detector_acts(params: dict[str, object], signatures: Sequence[tuple[str, str]]) -> list[str]:
    """What a loop detector with ``params`` does over a run of (action, observation) steps: its triggers."""
    triggered: list[str] = []

    def emit(event: Event) -> None:
        if isinstance(event, ProcessorTriggered):
            triggered.append(event.action)

    detector = build("loop_detector", params)
    after, before = HookPipeline("after_tool", (detector,), emit), HookPipeline("before_model", (detector,), emit)

    async def drive() -> None:
        messages = (Message(role="user", content="Find the coin."),)
        for step, (action, obs) in enumerate(signatures, 1):
            call = ToolCall(id=f"c{step}", name="act", input={"action": action})
            await after.run(AfterTool(step=step, call=call, result=ToolResult(call_id=call.id, name="act",
                                                                                 output=obs)), step)
            await before.run(BeforeModel(step=step + 1, messages=messages), step + 1)

    try:
        asyncio.run(drive())
    except Interrupt:
        triggered.append("ended")
    return triggered


def test_a_relaxed_loop_detector_never_acts_where_the_original_did_not() -> None:
    """Relaxing must loosen: over a four-step cycle the original ignores, the relaxed detector stays silent too."""
    att = next(a for a in BASE.attachments if a.group() == "loop_detector")
    params = relaxed(att)
    assert params is not None
    cycle = [(f"go {d}", f"You are in the {d} room.") for d in ("north", "east", "south", "west")] * 10
    assert detector_acts(dict(att.params), cycle) == []
    assert detector_acts({**att.params, **params}, cycle) == []


# --- operations -------------------------------------------------------------------------------------


def test_attach_replace_remove_and_reparam_change_the_harness_as_named() -> None:
    """Each operation kind, applied in order, gives the harness it says; the base is left as it was."""
    base_digest = BASE.digest
    step1 = apply(BASE, (attach("cost_model_router"),))
    assert step1.groups() == (*BASE.groups(), "model_router")
    step2 = apply(step1, (Replace(group="model_router", processor="step_model_router"),))
    router = next(a for a in step2.attachments if a.group() == "model_router")
    assert router.type == "step_model_router" and router.hooks == processor_type("cost_model_router").accepted_hooks()
    step3 = apply(step2, (Reparam(group="loop_detector", params={"warn_after": 4}),))
    detector = next(a for a in step3.attachments if a.group() == "loop_detector")
    old = next(a for a in BASE.attachments if a.group() == "loop_detector")
    assert detector.params == {**old.params, "warn_after": 4}  # the other parameters keep their values
    assert detector.hooks == old.hooks
    step4 = apply(step3, (Remove(group="budget"),))
    assert "budget" not in step4.groups()
    assert BASE.digest == base_digest
    assert apply(BASE, (attach("cost_model_router"), Replace(group="model_router", processor="step_model_router"),
                        Reparam(group="loop_detector", params={"warn_after": 4}), Remove(group="budget"))) == step4
    assert apply(BASE, ()) == BASE


def test_operations_compose_like_the_builder_itself() -> None:
    """Attaching then removing a processor is the harness it started from, by digest."""
    assert apply(BASE, (attach("task_notes"), Remove(group="task_notes"))) == BASE
    assert apply(BASE, (Reparam(group="loop_detector", params={"warn_after": 3}),)).digest == BASE.digest


@pytest.mark.parametrize(("ops", "fragments"), [
    ((Attach(processor="memory_palace", hooks=("after_tool",)),),
     ["operation 1 (attach memory_palace at after_tool)", "unknown processor 'memory_palace'", "known: "]),
    ((attach("loop_detector"),),
     ["operation 1 (attach loop_detector", "joins singleton group 'loop_detector'", "use replace"]),
    ((Attach(processor="observation_trim", hooks=("before_model",)),),
     ["operation 1", "'observation_trim' cannot attach to 'before_model'", "accepts after_tool"]),
    ((Attach(processor="task_notes", hooks=()),), ["operation 1", "attach needs at least one hook"]),
    ((Attach(processor="task_notes", hooks=("after_everything",)),), ["unknown hook 'after_everything'"]),
    ((Remove(group="history_window"), Remove(group="history_window")),
     ["operation 2 (remove history_window)", "no processor in singleton group 'history_window'", "groups: "]),
    ((Replace(group="history_window", processor="observation_trim"),),
     ["operation 1 (replace history_window with observation_trim)", "belongs to group 'observation_trim'"]),
    ((Replace(group="tool_filter", processor="tool_filter"),),
     ["operation 1", "no processor in singleton group 'tool_filter'"]),
    ((Reparam(group="memory", params={"size": 3}),),
     ["operation 1 (re-parameterise memory (size))", "no processor in singleton group 'memory' to re-parameterise"]),
    ((Reparam(group="budget", params={"max_token": 5}),),
     ["operation 1 (re-parameterise budget (max_token))", "processor 'budget': bad parameters",
      "unknown field `max_token`"]),
    ((Reparam(group="loop_detector", params={"warn_after": 1}),),
     ["processor 'loop_detector': bad parameters", "warn_after must be >= 2"]),
    ((Reparam(group="observation_trim", params={"max_chars": "lots"}),),
     ["bad parameters", "Expected `int`, got `str`"]),
    ((attach("task_notes"), Attach(processor="task_notes", hooks=("after_tool",))),
     ["operation 2 (attach task_notes at after_tool)", "already held by 'task_notes'"]),
])
def test_a_bad_operation_says_which_one_and_what_is_wrong(ops: tuple[AnyEditOp, ...], fragments: list[str]) -> None:
    """The error names the operation (its position and what it does) and the problem, and nothing is half-applied."""
    with pytest.raises(CompositionError) as info:
        apply(BASE, ops)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(("op", "bucket"), [
    (attach("task_notes"), "prompt"),
    (Reparam(group="system_prompt_template", params={"template": "Be brief. $instruction"}), "prompt"),
    (Remove(group="system_prompt_template"), "prompt"),
    (attach("tool_call_corrector"), "tools"),
    (Replace(group="tool_call_corrector", processor="tool_call_corrector"), "tools"),
    (Reparam(group="loop_detector", params={"interrupt_after": 20}), "config"),
    (attach("visited_states"), "processor"),
    (Remove(group="loop_detector"), "processor"),
    (attach("otel_spans"), "processor"),
])
def test_the_bucket_is_read_off_the_operation(op: AnyEditOp, bucket: str) -> None:
    """Prompt text, the tool offer, a parameter change, or the processor set: never claimed by the evolver."""
    assert bucket_of(op) == bucket


def test_buckets_dimensions_and_risk_of_a_candidate() -> None:
    """Each bucket and dimension once in order of appearance; the risk is the riskiest operation (or new code)."""
    ops = (attach("visited_states"), Reparam(group="loop_detector", params={"warn_after": 4}), attach("task_notes"),
           attach("undo_guard"), Remove(group="history_window"), Remove(group="no_such_group"))
    assert buckets_of(ops) == ("processor", "config", "prompt")
    dims = [processor_type(n).dimension for n in ("visited_states", "loop_detector", "task_notes", "undo_guard",
                                                  "history_window")]
    assert dimensions_of(ops, BASE) == tuple(dict.fromkeys(dims))
    assert risk_of(ops) == max(RISK.values()) == RISK["remove"]
    assert risk_of(ops[:1]) == RISK["attach"] < risk_of(ops[:2]) == RISK["reparam"]
    assert risk_of(ops[:1], new_code=True) == CODE_RISK
    assert risk_of(()) == 0.0


def test_describe_names_each_kind_of_operation() -> None:
    """One readable line per operation."""
    assert describe(Attach(processor="task_notes", hooks=("after_tool", "before_model"))) == \
        "attach task_notes at after_tool+before_model"
    assert describe(Replace(group="model_router", processor="step_model_router")) == \
        "replace model_router with step_model_router"
    assert describe(Remove(group="budget")) == "remove budget"
    assert describe(Reparam(group="budget", params={"max_tokens": 5, "max_cost_usd": 1.0})) == \
        "re-parameterise budget (max_cost_usd, max_tokens)"


def test_every_string_in_an_operation_is_found_for_the_leakage_scan() -> None:
    """Keys and values, however deeply nested in lists and mappings; numbers and booleans are not strings."""
    value = {"op": "attach", "params": {"notes": ["open door", {"hint": "take coin"}], "n": 3, "on": True,
                                        ("k",): None}}
    found = strings_in(value)
    assert {"op", "attach", "params", "notes", "open door", "hint", "take coin", "n", "on"} <= set(found)
    assert "3" not in found and "True" not in found
    assert strings_in("plain") == ["plain"] and strings_in(7) == []


def test_the_bucket_of_new_code_is_read_without_importing_it() -> None:
    """A candidate's new processor (content-named, not yet proven) is a processor edit, like dimensions_of allows."""
    op = Attach(processor="hx_plugin_0123456789abcdef:StepNote", hooks=("before_model",))
    assert dimensions_of((op,), BASE) == ()  # unknown code: no dimension, no error
    assert buckets_of((op,)) == ("processor",)
