"""``journal.md`` of an exported run: one entry per round, what it did and why, from the ledger."""

from __future__ import annotations

from hx.harness.edits import describe
from hx.report.export_fold import RunFold, link, listed, rate
from hx.report.export_rounds import candidate_path, ship_line
from projections.ledger_records import RoundRecords
from schemas.ledger import HeldoutScored


def journal(fold: RunFold) -> str:
    """One entry per round: what it did and why."""
    out = [f"# Journal of run `{fold.opened.run_id}`\n",
           "One entry per round, from the ledger: what the round did and why.\n"]
    out += [_heldout_line(h) for h in fold.heldout if h.round < 0]
    out += [_entry(fold, rnd) for rnd in fold.ordered()]
    f = fold.finished
    end = f"Finished ({f.status}) after {f.rounds} round(s): {f.reason}" if f else "Not finished."
    out.append(f"## End\n\n{end}\n")
    return "\n".join(out)


def _heldout_line(h: HeldoutScored) -> str:
    when = "before the first round" if h.round < 0 else f"after round {h.round}"
    return (f"Held-out {when}: {h.tasks} tasks, pass@1 {rate(h.pass_at_1)}, pass@2 {rate(h.pass_at_2)} "
            f"(trace round {h.trace_round}).\n")


def _entry(fold: RunFold, rnd: RoundRecords) -> str:
    d = rnd.decided
    n = rnd.round
    lines = [f"## Round {n}: {d.outcome if d else 'undecided'}\n",
             f"{d.reason if d else 'No decision.'} ({link('decision', f'R{n}/decision.md')})\n"]
    facts = []
    if rnd.digested is not None:
        ds = rnd.digested.digests
        facts.append(f"rolled out {len(ds)} tasks, solved {sum(x.solved for x in ds)} (actionability "
                     f"{rnd.digested.actionability:.2f}; trace rounds {listed(map(str, rnd.digested.trace_rounds))})")
    if rnd.landscape is not None:
        plan = rnd.landscape.landscape
        facts.append(f"landscape: {len(plan.regressions)} regression(s), failure groups "
                     f"{listed(f.category for f in plan.failures)}")
    for first in rnd.proposed:
        cid = first.candidate
        cand = fold.final(cid)
        ops = "; ".join(describe(op) for op in cand.operations)
        revised = rnd.revised.get(cid)
        facts.append(f"proposed {link(cid, candidate_path(n, cid))} ({ops}), predicting "
                     f"{len(cand.manifest.predicted_flips)} flip(s)"
                     + (f"; revised: {revised.reason}" if revised else ""))
    c = rnd.critic
    if c is not None:
        facts.append(f"critic ({c.critic}): " + ("no-op" if c.no_op else f"ranked {listed(c.ranking)}")
                     + (f"; strategy concern: {c.strategy_concern}" if c.strategy_concern else "")
                     + (f"; banned {listed(c.banned)} for the next round" if c.banned else ""))
    facts += [f"gate: {cid} " + (f"passed ({g.outcome})" if g.passed else f"failed at {g.first_failure}")
              for cid, g in rnd.gates.items()]
    facts += [ship_line(s) for s in rnd.ships] + [f"retired `{r.variant}`: {r.reason}" for r in rnd.retired]
    if d is not None and d.metrics.predicted:
        m = d.metrics
        facts.append(f"last round's ships predicted {m.predicted} flip(s) here, {m.realised} happened "
                     f"(attribution {rate(m.attribution)})")
    if d is not None:
        facts.append(f"pass@k {rate(d.metrics.pass_at_k)}, {d.metrics.rollouts} rollouts, "
                     f"{d.metrics.regressions} regression(s)")
    lines.append("".join(f"- {f}\n" for f in facts))
    lines += [_heldout_line(h) for h in rnd.heldout]
    return "\n".join(lines)
