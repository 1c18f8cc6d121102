"""``hx state``, ``hx regressions``, ``hx diff``, ``hx bisect``: a run read back as of a point, and its regressions.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(state_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import json
from typing import Any

import click

from hx.cli._app import App, pass_app, quarantine_note, run, run_id_option
from hx.cli._specs import check_spec_option
from hx.replay.bisect import Bisection, bisect
from hx.replay.harness_diff import HarnessDiff, Step, harness_diff
from hx.replay.regressions import AttemptEvidence, Regression, RoundRegressions, round_regressions
from hx.replay.timetravel import RunAt, parse_as_of, run_at
from hx.report.export_fold import rate

AS_OF_HELP = "rN: as of round N's decision; a bare number: as of that HX_LEDGER sequence."


def _emit(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# --- hx state ---------------------------------------------------------------------------------


@click.command("state")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--as-of", "as_of", required=True, metavar="ROUND|SEQ", help=AS_OF_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_app
def state_command(app: App, run_id: str, as_of: str, as_json: bool) -> None:
    """The harness of every variant, the task history and the scoreboard of RUN as of a round or position."""
    point = parse_as_of(as_of)
    at = run(_state(app, run_id, point))
    if as_json:
        _emit(state_json(at))
    else:
        _state_text(at)


async def _state(app: App, run_id: str, point: Any) -> RunAt:
    async with app.connect() as conn:
        at = await run_at(conn.log, run_id, point)
        quarantine_note(conn.log)
        return at


def state_json(at: RunAt) -> dict[str, Any]:
    """``hx state --json``."""
    rounds = sorted({n for t in at.tasks for n in t.rounds})
    return {
        "run": at.run, "as_of": str(at.as_of), "ledger_seq": at.ledger_seq, "round": at.round, "k": at.k,
        "harness": {v: {"digest": h.digest, "since_round": h.round, "seq": h.seq, "candidates": h.candidates,
                        "processors": [p.type for p in h.harness.processors]}
                    for v, h in sorted(at.harnesses.items())},
        "ran": {v: h.digest for v, h in sorted(at.ran.items())},
        "tasks": [{"task": t.task, "rounds": {str(n): {"attempts": t.rounds[n].n, "passes": t.rounds[n].passes}
                                              for n in rounds if n in t.rounds},
                   "pass_at_k": t.pass_at(rounds[-1], at.k) if rounds else None} for t in at.tasks],
        "scoreboard": [{"round": r.round, "outcome": r.outcome, "variants": r.variants, "shipped": list(r.shipped),
                        "pass_at_k": r.pass_at_k, "rollouts": r.rollouts} for r in at.report.rounds],
        "heldout_before": at.report.heldout_before.pass_at_2 if at.report.heldout_before else None,
        "heldout_after": at.report.heldout_after.pass_at_2 if at.report.heldout_after else None,
    }


def _state_text(at: RunAt) -> None:
    data = state_json(at)
    where = f"round {at.round}" if at.round is not None else "before its first decision"
    click.echo(f"run {at.run} as of {at.as_of} (HX_LEDGER {at.ledger_seq}, {where})")
    click.echo("\nharness")
    for v, h in data["harness"].items():
        ran = data["ran"].get(v)
        note = "" if ran in (None, h["digest"]) else f" (round {at.round} ran {ran[:19]})"
        since = "initial" if h["since_round"] < 0 else f"since round {h['since_round']}"
        click.echo(f"  {v}  {h['digest'][:19]}  {since}{note}")
        click.echo(f"      {', '.join(h['processors']) or '(no processor)'}")
    rounds = sorted({int(n) for t in data["tasks"] for n in t["rounds"]})
    click.echo(f"\ntask history (passes/attempts per round; pass@{at.k} of the last)")
    click.echo("  " + "task".ljust(28) + "".join(f"r{n}".rjust(6) for n in rounds) + f"  pass@{at.k}")
    for t in data["tasks"]:
        cells = "".join((f"{t['rounds'][str(n)]['passes']}/{t['rounds'][str(n)]['attempts']}" if str(n) in
                         t["rounds"] else "-").rjust(6) for n in rounds)
        click.echo(f"  {t['task'][:28].ljust(28)}{cells}  {rate(t['pass_at_k'])}")
    click.echo("\nscoreboard")
    for r in data["scoreboard"]:
        click.echo(f"  round {r['round']}  {r['outcome']:<20} pass@k {rate(r['pass_at_k'])}  "
                   f"rollouts {r['rollouts']}  shipped {', '.join(r['shipped']) or '-'}")
    click.echo(f"  held-out pass@2 before {rate(data['heldout_before'])}, after {rate(data['heldout_after'])}")


# --- hx regressions ---------------------------------------------------------------------------


@click.command("regressions")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--round", "round_", type=int, required=True, help="The round compared with the one before it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_app
def regressions_command(app: App, run_id: str, round_: int, as_json: bool) -> None:
    """Tasks of RUN lost (solved in round N-1, no attempt of round N) or worsened, the ships between, the evidence."""
    found = run(_regressions(app, run_id, round_))
    if as_json:
        _emit(regressions_json(found))
    else:
        _regressions_text(found)


async def _regressions(app: App, run_id: str, round_: int) -> RoundRegressions:
    async with app.connect() as conn:
        return await round_regressions(conn.log, run_id, round_)


def _attempt(a: AttemptEvidence) -> dict[str, Any]:
    return {"trace_round": a.trace_round, "attempt": a.attempt, "passed": a.passed, "status": a.status,
            "reason": a.reason, "steps": a.steps, "seed": a.seed, "harness": a.harness, "model": a.model,
            "versions": sorted(a.versions)}


def _regression(r: Regression) -> dict[str, Any]:
    return {"task": r.task, "variant": r.variant, "before": f"{r.before.passes}/{r.before.attempts}",
            "after": f"{r.after.passes}/{r.after.attempts}", "category": r.after.category,
            "suspects": list(r.suspects), "anchors": [[a.seq, a.index, a.note] for a in r.anchors],
            "attempts_before": [_attempt(a) for a in r.attempts_before],
            "attempts_after": [_attempt(a) for a in r.attempts_after]}


def regressions_json(found: RoundRegressions) -> dict[str, Any]:
    """``hx regressions --json``."""
    return {
        "run": found.run, "round": found.round, "tasks": found.tasks,
        "regressions": [_regression(r) for r in found.regressions],
        "worsened": [_regression(r) for r in found.worsened],
        "ships": [{"round": s.event.round, "variant": s.event.variant, "operations": s.operations,
                   "candidates": [{"candidate": c.id, "levers": list(c.levers),
                                   "intended_effect": c.proposal.manifest.intended_effect,
                                   "predicted_flips": list(c.proposal.manifest.predicted_flips),
                                   "at_risk": list(c.proposal.manifest.at_risk)} for c in s.candidates]}
                  for s in found.ships],
        "policy_before": found.policy_before, "policy_after": found.policy_after,
        "learner_updates": [{"version": u.version, "parent": u.parent, "through_round": u.through_round}
                            for u in found.updates],
        "policy_gates": [{"candidate": g.candidate, "adopted": g.adopted, "lost": list(g.lost)} for g in found.gates],
    }


def _regressions_text(found: RoundRegressions) -> None:
    data = regressions_json(found)
    click.echo(f"run {found.run}, round {found.round} against round {found.round - 1}: "
               f"{len(found.regressions)} of {found.tasks} task(s) regressed, {len(found.worsened)} worsened")
    for r in data["regressions"]:
        _regression_text(r, "lost")
    if data["worsened"]:
        click.echo("\nworsened (still solved, fewer attempts passed)")
    for r in data["worsened"]:
        _regression_text(r, "worsened")
    click.echo(f"\nships between round {found.round - 1} and round {found.round}: {len(data['ships']) or 'none'}")
    for s in data["ships"]:
        names = ", ".join(c["candidate"] for c in s["candidates"])
        click.echo(f"  round {s['round']} to {s['variant']}: {names}")
        for op in s["operations"]:
            click.echo(f"    {op}")
        for c in s["candidates"]:
            click.echo(f"    {c['candidate']}: {c['intended_effect']} (levers {', '.join(c['levers'])})")
    if found.policy_before != found.policy_after or found.updates:
        click.echo(f"\npolicy: round {found.round - 1} ran {', '.join(found.policy_before) or '-'}; round "
                   f"{found.round} ran {', '.join(found.policy_after) or '-'}; {len(found.updates)} update(s) between")
    for g in found.gates:
        lost = f" (lost {', '.join(g.lost)})" if g.lost else ""
        click.echo(f"  policy gate: {g.candidate[:12]} {'adopted' if g.adopted else 'rejected'}{lost}")


def _regression_text(r: dict[str, Any], kind: str) -> None:
    click.echo(f"\n  {r['task']} ({r['variant']}): {kind}: {r['before']} -> {r['after']} passed"
               f"{', ' + r['category'] if r['category'] else ''}; suspects {', '.join(r['suspects']) or '-'}")
    for a in r["attempts_after"]:
        click.echo(f"    attempt {a['attempt']} (trace round {a['trace_round']}, seed {a['seed']}): "
                   f"{'passed' if a['passed'] else 'failed'}, {a['status']}, {a['steps']} steps"
                   f"{', ' + a['reason'] if a['reason'] else ''}")
    for seq, index, note in r["anchors"]:
        click.echo(f"    evidence HX_TRACE {seq}.{index}: {note}")


# --- hx diff ----------------------------------------------------------------------------------


@click.command("diff")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.argument("task")
@click.option("--rounds", nargs=2, type=int, required=True, metavar="A B", help="The two rounds compared.")
@click.option("--attempt", type=click.IntRange(min=0), default=0, show_default=True,
              help="The attempt whose trajectories are compared.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_app
def diff_command(app: App, run_id: str, task: str, rounds: tuple[int, int], attempt: int, as_json: bool) -> None:
    """TASK's harness change between rounds A and B of RUN (builder operations) and where its trajectories split."""
    d = run(_diff(app, run_id, task, rounds, attempt))
    if as_json:
        _emit(diff_json(d))
    else:
        _diff_text(d)


async def _diff(app: App, run_id: str, task: str, rounds: tuple[int, int], attempt: int) -> HarnessDiff:
    async with app.connect() as conn:
        return await harness_diff(conn.log, run_id, task, rounds[0], rounds[1], attempt=attempt)


def _step(s: Step | None) -> dict[str, Any] | None:
    return None if s is None else {"step": s.step, "action": s.action, "observation": s.observation, "seq": s.seq}


def diff_json(d: HarnessDiff) -> dict[str, Any]:
    """``hx diff --json``."""
    return {"run": d.run, "task": d.task, "rounds": list(d.rounds), "variants": list(d.variants),
            "digests": list(d.digests), "operations": d.lines, "reproduces": d.reproduces,
            "ships": [{"round": s.event.round, "variant": s.event.variant, "operations": s.operations}
                      for s in d.ships],
            "outcomes": [t.passed for t in d.trajectories], "steps": [t.step_count for t in d.trajectories],
            "divergence": {"step": d.divergence.step, "what": d.divergence.what, "a": _step(d.divergence.a),
                           "b": _step(d.divergence.b)}}


def _diff_text(d: HarnessDiff) -> None:
    a, b = d.rounds
    click.echo(f"{d.task} in run {d.run}: round {a} ({d.variants[0]}, {d.digests[0][:19]}) -> round {b} "
               f"({d.variants[1]}, {d.digests[1][:19]})")
    click.echo("harness diff" + ("" if d.operations else ": none"))
    for line in d.lines:
        click.echo(f"  {line}")
    if d.operations and not d.reproduces:
        click.echo("  (these operations do not rebuild round B's harness exactly)")
    for ship in d.ships:
        click.echo(f"  shipped in round {ship.event.round} to {ship.event.variant}: {'; '.join(ship.operations)}")
    first, second = d.trajectories
    click.echo(f"trajectories: {first.step_count} step(s), {_verdict(first.passed)} -> {second.step_count} "
               f"step(s), {_verdict(second.passed)}")
    div = d.divergence
    if div.step is None:
        click.echo("  identical: same actions and observations at every step")
        return
    click.echo(f"  first divergence at step {div.step} ({div.what})")
    for label, s in ((f"round {a}", div.a), (f"round {b}", div.b)):
        if s is None:
            click.echo(f"    {label}: (ended)")
        else:
            click.echo(f"    {label}: {s.action}  ->  {s.observation.splitlines()[0] if s.observation else ''}"
                       f"  [HX_TRACE {s.seq}]")


def _verdict(passed: bool | None) -> str:
    return "unfinished" if passed is None else "passed" if passed else "failed"


# --- hx bisect --------------------------------------------------------------------------------


@click.command("bisect")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.argument("task")
@click.option("--from", "from_", type=int, required=True, help="The earlier round (its harness is the start).")
@click.option("--to", "to", type=int, required=True, help="The later round (its harness is the end).")
@click.option("--scratch-run", default=None, metavar="ID", callback=run_id_option,
              help="The run id the re-runs go to  [default: RUN.bisect-<random>]")
@click.option("--model", metavar="SPEC", help="The run's model spec again, with the credentials its record masks "
                                              "(needed only then)  [default: the recorded one]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@pass_app
def bisect_command(app: App, run_id: str, task: str, from_: int, to: int, scratch_run: str | None,
                   model: str | None, as_json: bool) -> None:
    """Apply the edits shipped between two rounds one at a time, re-run TASK under each, name the first change."""
    if model is not None:
        check_spec_option("--model", model)
    b = run(_bisect(app, run_id, task, from_, to, scratch_run, model))
    if as_json:
        _emit(bisect_json(b))
    else:
        _bisect_text(b)


async def _bisect(app: App, run_id: str, task: str, a: int, b: int, scratch: str | None,
                  model: str | None) -> Bisection:
    async with app.connect() as conn:
        return await bisect(conn.log, run_id, task, a, b, scratch=scratch, model=model)


def bisect_json(b: Bisection) -> dict[str, Any]:
    """``hx bisect --json``."""
    flip = b.flip
    shift = b.shift
    return {"run": b.run, "task": b.task, "rounds": list(b.rounds), "scratch_run": b.scratch,
            "model": b.model, "model_note": b.model_note,
            "edits": [{"name": e.name, "round": e.round, "kind": e.kind, "variant": e.variant,
                       "candidates": list(e.candidates), "operations": e.lines} for e in b.edits],
            "trials": [{"edits": t.edits, "digest": t.digest, "trace_round": t.trace_round, "attempts": t.attempts,
                        "passes": t.passes, "solved": t.solved} for t in b.trials],
            "logged": list(b.logged), "reproduced": b.reproduced, "reaches": b.reaches,
            "flip": None if flip is None else {"name": flip.name, "candidates": list(flip.candidates),
                                               "operations": flip.lines},
            "shift": None if shift is None else {"name": shift.name, "candidates": list(shift.candidates),
                                                 "operations": shift.lines}}


def _bisect_text(b: Bisection) -> None:
    a, z = b.rounds
    click.echo(f"bisect {b.task} of run {b.run}, rounds {a} -> {z}: {len(b.edits)} edit(s); re-runs in run "
               f"{b.scratch}")
    click.echo(f"  model {b.model} ({b.model_note})")
    for t in b.trials:
        edit = f"round {a}'s harness" if t.edits == 0 else f"+ {b.edits[t.edits - 1].name}"
        click.echo(f"  {t.edits}  {t.digest[:19]}  {t.passes}/{t.attempts} passed  {edit}")
    if not b.reproduced:
        click.echo(f"  note: round {a}'s harness did not repeat the logged outcome (the agent or the environment is "
                   "not seeded)")
    if not b.reaches:
        click.echo(f"  note: the edits do not rebuild round {z}'s harness exactly")
    flip, shift = b.flip, b.shift
    if flip is not None:
        click.echo(f"first edit that flips it: {flip.name}: {'; '.join(flip.lines)}")
    elif shift is not None:
        t = b.trials[b.edits.index(shift) + 1]
        click.echo(f"no edit flips the task; first edit that changes its pass count ({b.trials[0].passes}/"
                   f"{b.trials[0].attempts} -> {t.passes}/{t.attempts}): {shift.name}: {'; '.join(shift.lines)}")
    else:
        click.echo("no edit changes the task's outcome")
