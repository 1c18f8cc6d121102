"""The per-round files of an exported run (``R<n>/``): landscape, candidate cards, applied harnesses, decision,
verdicts, regressions and task digests, each rendered from the round's ledger records alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from hx.harness.edits import apply, describe
from hx.harness.errors import CompositionError
from hx.report.export_fold import RunFold, link, listed, rate, safe_name, table
from projections.ledger_records import RoundRecords, ShipRecord, lever_of
from schemas.edits import RULE_GROUP, AddRule, AnyEditOp, Attach, DropRule, Manifest, Reparam, Replace
from schemas.landscape import Landscape, TaskDigest
from schemas.ledger import CandidateProposed, GateJudged, HarnessShipped, RoundMetrics, RoundTokens
from schemas.rules import Rule, sentence


def candidate_path(rnd: int, cid: str) -> str:
    """Where a candidate's card goes."""
    return f"R{rnd}/candidates/{safe_name(cid)}.md"


def verdict_path(rnd: int, cid: str) -> str:
    """Where a candidate's gate verdict goes."""
    return f"R{rnd}/verdicts/V-{safe_name(cid)}.md"


def applied_path(rnd: int, cid: str) -> str:
    """Where the harness a candidate builds goes."""
    return f"R{rnd}/applied/{safe_name(cid)}/config.yaml"


def digest_path(rnd: int, task: str) -> str:
    """Where a task's digest of a round goes."""
    return f"R{rnd}/digests/{safe_name(task)}.md"


def trajectory_name(task: str, attempt: int) -> str:
    """The file name of one attempt's trajectory."""
    return f"{safe_name(task)}.{attempt}.jsonl"


def ship_line(record: ShipRecord) -> str:
    """One line saying what a ship or fork did, and the rules it added or dropped, as sentences."""
    ship = record.event
    rules = "".join(f"; {describe(op)}" for op in ship.operations if isinstance(op, AddRule | DropRule))
    if isinstance(ship, HarnessShipped):
        return (f"round {ship.round}: shipped {listed(ship.candidates)} to `{ship.variant}` "
                f"({ship.digest_before[:19]} -> {ship.digest_after[:19]}){rules}")
    return (f"round {ship.round}: forked `{ship.variant}` from `{ship.parent}` with `{ship.candidate}` "
            f"(serving {listed(ship.clusters, 'no cluster yet')}; {ship.digest[:19]}){rules}")


def ship_name(ship: ShipRecord) -> str:
    """The candidates a ship or fork carried, joined by ``+``."""
    return "+".join(ship.candidates)


def program_of_params(op: AnyEditOp) -> tuple[tuple[Rule, ...], dict[str, Any]]:
    """(the rules an edit sets the rule interpreter's program to, its other parameters): for an attach, replace
    or reparam of the ``rule_program`` group; ((), all its parameters) for any other edit or a program that does
    not decode."""
    params = dict(op.params) if isinstance(op, Attach | Replace | Reparam) else {}
    edits_program = (op.group if isinstance(op, Reparam) else op.processor if isinstance(op, Attach | Replace)
                     else "") == RULE_GROUP
    if not edits_program or "rules" not in params:
        return (), params
    try:
        rules = msgspec.convert(params["rules"], tuple[Rule, ...])
    except msgspec.ValidationError:
        return (), params  # shown as recorded: the candidate's build error says what is wrong with it
    del params["rules"]
    return rules, params


def _ops(operations: Sequence[AnyEditOp]) -> str:
    lines = []
    for i, op in enumerate(operations, 1):
        rules, params = program_of_params(op)
        extra = f" with `{json.dumps(params, sort_keys=True, ensure_ascii=False)}`" if params else ""
        lines.append(f"{i}. {describe(op)}{extra}")
        lines += [f"   - rule {j}: {sentence(rule)}" for j, rule in enumerate(rules, 1)]
        if isinstance(op, AddRule | DropRule):
            lines.append(f"   - lever `{lever_of(op)}`")
    return "\n".join(lines) + "\n" if lines else "(no operation)\n"


def _manifest(m: Manifest, known: set[str]) -> str:
    def task(t: str) -> str:
        return link(t, f"../digests/{safe_name(t)}.md") if t in known else f"`{t}`"
    anchors = table(["seq", "index", "note"], [[a.seq, a.index, a.note] for a in m.evidence])
    return (f"- intended effect: {m.intended_effect or '(not stated)'}\n"
            f"- addresses: {listed(m.categories)}\n"
            f"- predicted flips: {', '.join(task(t) for t in m.predicted_flips) or 'none'}\n"
            f"- at risk: {', '.join(task(t) for t in m.at_risk) or 'none'}\n"
            f"- attribution (the group that must trigger on a flipped task): "
            f"{f'`{m.attribution}`' if m.attribution else 'none'}\n\n"
            f"Evidence anchors (positions on HX_TRACE):\n\n{anchors}")


def applied(fold: RunFold, cand: CandidateProposed) -> tuple[str | None, str]:
    """The YAML of the harness a candidate builds, or None and why not; plus a note on its digest."""
    base = fold.base(cand.candidate)
    if base is None:
        return None, f"not built: variant `{cand.variant}` did not exist when it was proposed"
    try:
        config = apply(base, cand.operations)
    except CompositionError as exc:
        return None, f"not built: {exc}"
    notes = []
    if base.digest != cand.base_digest:
        notes.append(f"the base harness here is {base.digest[:19]}, the candidate names {cand.base_digest[:19]}")
    if config.digest != cand.digest:
        notes.append(f"it builds {config.digest[:19]}, the candidate recorded {cand.digest[:19] or 'none'}")
    return config.dumps("yaml"), "; ".join(notes) or f"builds {config.digest}, as recorded"


def candidate_card(fold: RunFold, rnd: RoundRecords, first: CandidateProposed, built: str) -> str:
    """A candidate's manifest card: what it does, what it claims, how it fared, and its revision."""
    cid, n = first.candidate, rnd.round
    cand = fold.final(cid)
    known = {d.task for d in (rnd.digested.digests if rnd.digested else ())}
    gate = rnd.gates.get(cid)
    fate = "not gated"
    if gate is not None:
        fate = (f"{link('gate verdict', f'../verdicts/V-{safe_name(cid)}.md')}: "
                f"{'passed' if gate.passed else 'failed at ' + gate.first_failure} (outcome {gate.outcome})")
    record = fold.state.candidates[cid]
    if record.waiting or record.approval is not None:
        fate += ("; waits for a human's approval" if record.waiting else
                 f"; {'approved' if record.approval else 'rejected'} by a human")
    ships = [s for s in fold.ships if cid in s.candidates]
    out = [f"# Candidate {cid} (round {n})\n",
           f"Proposed by the `{cand.evolver}` evolver for variant `{cand.variant}`. Risk {cand.risk:.2f}; buckets "
           f"{listed(cand.buckets)}; dimensions {listed(cand.dimensions)}.\n",
           f"- {fate}\n" + "".join(f"- {ship_line(s)}\n" for s in ships),
           "## Operations\n", _ops(cand.operations),
           f"Base harness {cand.base_digest or '(none)'}; built harness {cand.digest or '(none)'}.\n"]
    if cand.build_error:
        out.append(f"Build error recorded: {cand.build_error}\n")
    out.append(f"Applied: {built}\n")
    if cand.code:
        out.append("New processor code (object store `code/<digest>`):\n\n" + table(
            ["file", "processor", "digest", "bytes"], [[a.name, a.processor, a.digest, a.size] for a in cand.code]))
    out += ["## Manifest\n", _manifest(cand.manifest, known)]
    revision = rnd.revised.get(cid)
    if revision is not None:
        out += ["## Revision\n", f"The critic asked for one revision: {revision.reason}\n",
                "Above is the candidate as revised. As first proposed, its operations were:\n",
                _ops(first.operations), "and its manifest:\n", _manifest(first.manifest, known)]
    return "\n".join(out)


def verdict(gate: GateJudged) -> str:
    """A gate verdict: every check in order, the first failure, the outcome, the flips."""
    def change(before: bool, after: bool) -> str:
        return {(False, True): "flip", (True, False): "regression", (True, True): "kept"}.get((before, after),
                                                                                             "still failing")
    checks = table(["#", "check", "result", "detail"],
                   [[i, c.name, "pass" if c.passed else "FAIL", c.detail] for i, c in enumerate(gate.checks, 1)])
    flips = table(["task", "before", "after", "attempts", "passes", "change"],
                  [[f.task, "pass" if f.before else "fail", "pass" if f.after else "fail", f.attempts, f.passes,
                    change(f.before, f.after)] for f in gate.flips])
    rounds = ", ".join(str(r) for r in gate.trace_rounds) or "none"
    return (f"# Verdict on {gate.candidate} (round {gate.round})\n\n"
            f"Variant `{gate.variant}`. {'Passed' if gate.passed else 'Failed'}; outcome **{gate.outcome}**; "
            f"first failure: {gate.first_failure or 'none'}. Fresh attempts in trace rounds {rounds}.\n\n"
            f"{link('candidate card', f'../candidates/{safe_name(gate.candidate)}.md')}\n\n"
            f"## Checks (in order; the first failure wins)\n\n{checks}\n## Flips\n\n{flips}")


def landscape(rnd: int, plan: Landscape) -> str:
    """The planner's landscape of a round."""
    regressions = table(["task", "variant", "since round", "suspects"],
                        [[r.task, r.variant, r.since_round, ", ".join(r.suspects)] for r in plan.regressions])
    failures = table(["category", "tasks", "implicated"],
                     [[f.category, len(f.tasks), ", ".join(f.implicated)] for f in plan.failures])
    members = "".join(f"- {f.category}: {', '.join(f'`{t}`' for t in f.tasks)}\n" for f in plan.failures)
    levers = table(["lever", "bucket", "dimension", "addresses", "proposed", "shipped", "predicted", "realised",
                    "hit rate", "banned"],
                   [[v.name, v.bucket, v.dimension, ", ".join(v.addresses), v.proposed, v.shipped, v.predicted,
                     v.realised, rate(v.hit_rate), "yes" if v.banned else ""] for v in plan.levers])
    return (f"# Round {rnd}: landscape\n\n{'Nothing to act on.' if plan.empty else 'What the planner found.'}\n\n"
            f"## Regressions\n\n{regressions}\n## Failure groups\n\n{failures}\n{members}\n"
            f"## Tried and untried\n\n- buckets tried: {listed(plan.tried_buckets)}; untried: "
            f"{listed(plan.untried_buckets)}\n- dimensions tried: {listed(plan.tried_dimensions)}; untried: "
            f"{listed(plan.untried_dimensions)}\n\n## Strategy\n\n- concern relayed: {plan.concern or 'none'}\n"
            f"- banned this round: {listed(plan.banned)}\n\n## Levers\n\n{levers}")


def regressions(fold: RunFold, rnd: RoundRecords) -> str:
    """Tasks solved in the previous round and not in this one, with the ships between the two rollouts."""
    n = rnd.round
    head = f"# Round {n}: regressions against round {n - 1}\n\n"
    prev = fold.rounds.get(n - 1)
    if prev is None or prev.digested is None or rnd.digested is None:
        return head + "No earlier round to compare with.\n"
    before = {d.task: d for d in prev.digested.digests}
    lost = [(before[d.task], d) for d in rnd.digested.digests if d.task in before and before[d.task].solved
            and not d.solved]

    def suspects(variant: str) -> str:
        return ", ".join(ship_name(s) for s in rnd.between if s.variant == variant)
    rows = [[link(d.task, f"digests/{safe_name(d.task)}.md"), was.variant, d.variant, f"{was.passes}/{was.attempts}",
             f"{d.passes}/{d.attempts}", d.category, suspects(d.variant)] for was, d in lost]
    ships = "".join(f"- {ship_line(s)}\n" for s in rnd.between) or "None: the harnesses did not change.\n"
    return (head + f"{len(lost)} of {len(before)} tasks of round {n - 1} regressed (solved then, not now).\n\n"
            + table(["task", f"variant R{n - 1}", f"variant R{n}", f"passes R{n - 1}", f"passes R{n}",
                     "category now", "suspects (ships to its variant in between)"], rows)
            + f"\n## Ships between the two rollouts\n\n{ships}")


def task_digest(fold: RunFold, n: int, d: TaskDigest, trajectories: Sequence[str]) -> str:
    """One task's digest of one round, with its pass history up to that round."""
    facts = table(["field", "value"], [["cluster", d.cluster], ["variant", d.variant], ["attempts", d.attempts],
                                       ["passes", d.passes], ["solved (pass@k)", "yes" if d.solved else "no"],
                                       ["category", d.category or "-"], ["continuity", d.continuity],
                                       ["implicated", ", ".join(d.implicated) or "-"]])
    features = table(["feature", "mean per attempt"], [[k, v] for k, v in sorted(d.features.items())])
    anchors = table(["seq", "index", "note"], [[a.seq, a.index, a.note] for a in d.evidence])
    history = [[r, h.variant, f"{h.passes}/{h.attempts}", h.category or "-"] for r, h in fold.history(d.task)
               if r <= n]
    runs = "".join(f"- {link(name, f'../trajectories/{name}')}\n" for name in trajectories)
    return (f"# Task `{d.task}`, round {n}\n\n{facts}\n## Summary\n\n{d.summary or '(no prose digester)'}\n\n"
            f"## Features\n\n{features}\n## Evidence anchors (HX_TRACE positions)\n\n{anchors}\n"
            f"## History\n\n{table(['round', 'variant', 'passes', 'category'], history)}"
            + (f"\n## Trajectories\n\n{runs}" if runs else ""))


def token_figures(tokens: RoundTokens | None) -> list[list[Any]]:
    """The rows of a round's tokens in its metrics table: per meta-model stage, then the task agent."""
    if tokens is None:
        return [["tokens", "- (decided before hx counted them)"]]
    return [*([f"meta-model tokens, {stage} (in / out)", f"{u.input_tokens} / {u.output_tokens}"]
              for stage, u in tokens.meta.items()),
            ["task agent tokens (in / out)", f"{tokens.agent.input_tokens} / {tokens.agent.output_tokens}"],
            ["cost reported by the providers (USD)", f"{tokens.meta_total.cost_usd + tokens.agent.cost_usd:.4f}"]]


def metrics_table(m: RoundMetrics) -> str:
    """A round's figures as a two-column table."""
    return table(["figure", "value"], [
        ["tasks", m.tasks], ["passes (pass@k)", m.passes], ["pass@k", rate(m.pass_at_k)],
        ["flips predicted by the last round's ships", m.predicted], ["realised", m.realised],
        ["hit rate (realised / predicted)", rate(m.hit_rate)], ["attribution", rate(m.attribution)],
        ["regressions", m.regressions], ["shipped edits per bucket", m.lever_mix or "-"], ["rollouts", m.rollouts],
        *token_figures(m.tokens)])


def decision(fold: RunFold, rnd: RoundRecords) -> str:
    """The critic's ranking or no-op, the gate's outcomes, approvals, what changed, and the round decision."""
    n, critic = rnd.round, rnd.critic
    out = [f"# Round {n}: decision\n"]
    if critic is None:
        out.append("## Critic\n\nThe round did not reach the critic.\n")
    else:
        ranking = "".join(f"{i}. {link(c, f'candidates/{safe_name(c)}.md')}\n" for i, c in enumerate(critic.ranking, 1))
        concerns = table(["candidate", "concern"], [[c.candidate, x] for c in critic.concerns for x in c.concerns])
        out.append(f"## Critic ({critic.critic})\n\n"
                   + ("No-op: nothing worth shipping.\n" if critic.no_op else f"Ship ranking:\n\n{ranking}")
                   + f"\nRevisions asked: {listed(critic.revisions)}\n\nConcerns:\n\n{concerns}\n"
                   f"Strategy concern: {critic.strategy_concern or 'none'}\n\n"
                   f"Levers banned for round {n + 1}: {listed(critic.banned)}\n")
    gates = table(["candidate", "passed", "outcome", "first failure"],
                  [[link(c, f"verdicts/V-{safe_name(c)}.md"), "yes" if g.passed else "no", g.outcome,
                    g.first_failure or "-"] for c, g in rnd.gates.items()])
    out.append(f"## Gate (in the order judged)\n\n{gates}")
    if rnd.approvals:
        def answer(cid: str) -> str:
            given = fold.answers.get(cid)
            if given is None:
                return "no answer yet"
            return f"{'approved' if given.approved else 'rejected'} by {given.by or 'someone'}" + (
                f": {given.note}" if given.note else "")
        out.append("## Approvals\n\n" + table(["candidate", "risk", "reason", "answer"],
                                               [[a.candidate, a.risk, a.reason, answer(a.candidate)]
                                                for a in rnd.approvals]))
    changes = [f"- {ship_line(s)}\n" for s in rnd.ships] + [f"- retired `{r.variant}`: {r.reason}\n"
                                                             for r in rnd.retired]
    out.append("## What changed\n\n" + ("".join(changes) or "Nothing: no harness changed.\n"))
    d = rnd.decided
    if d is None:
        out.append("## Decision\n\nNot decided yet (the run stopped inside this round).\n")
    else:
        out.append(f"## Decision: {d.outcome}\n\n{d.reason or '(no reason recorded)'}\n\n"
                   f"Shipped: {listed(d.shipped)}. Rounds in a row without a ship: {d.idle}.\n\n"
                   + metrics_table(d.metrics))
    if rnd.digested is not None and rnd.digested.rested:
        out.append(f"## Rested\n\nSat out the round, every attempt of their last played rounds having failed "
                   f"(`--rest-barren`): {listed(rnd.digested.rested)}\n")
    return "\n".join(out)


def round_files(fold: RunFold, rnd: RoundRecords, trajectories: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Every file of ``R<n>/`` but the trajectories (task -> its trajectory file names)."""
    n = rnd.round
    files: dict[str, str] = {}
    if rnd.landscape is not None:
        files[f"R{n}/landscape.md"] = landscape(n, rnd.landscape.landscape)
    for first in rnd.proposed:
        yaml_text, note = applied(fold, fold.final(first.candidate))
        if yaml_text is not None:
            files[applied_path(n, first.candidate)] = yaml_text
            note = f"{link('config.yaml', f'../applied/{safe_name(first.candidate)}/config.yaml')} ({note})"
        files[candidate_path(n, first.candidate)] = candidate_card(fold, rnd, first, note)
    for cid, gate in rnd.gates.items():
        files[verdict_path(n, cid)] = verdict(gate)
    files[f"R{n}/decision.md"] = decision(fold, rnd)
    files[f"R{n}/regressions.md"] = regressions(fold, rnd)
    for d in rnd.digested.digests if rnd.digested else ():
        files[digest_path(n, d.task)] = task_digest(fold, n, d, trajectories.get(d.task, ()))
    return files
