"""``hx evolve``: evolve a harness with AEGIS on benchmark tasks, judged on a frozen held-out split.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(evolve_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec
from rich.table import Table

import hx.environments  # noqa: F401 - registers the benchmark adapters
from hx.aegis.evolvers import EVOLVERS, make_evolver
from hx.aegis.job import EvolveJob, EvolveRequest, TaskChoice
from hx.aegis.session import HELDOUT_SPLITS, Parts, new_job, run_evolution
from hx.aegis.settings import EvolveSettings, GateSettings, InductionSettings
from hx.aegis.variants import STRATEGIES
from hx.cli._app import App, Terminated, pass_app, run, run_id_option, stderr_console, stdout_console
from hx.cli._evolve_parts import EvolveProgress, llm_parts, load_job
from hx.cli._specs import check_spec_option
from hx.cli._stop_note import StopNote, on_stop
from hx.cli.run import choose_harness, new_run_id, read_harness, select_tasks
from hx.environments.results import ResultsClaim
from hx.environments.rollout import RolloutSettings
from hx.harness.config import HarnessConfig
from hx.replay.scoreboard import EvolutionReport
from schemas.learn import PolicyGated, PolicyUpdated
from streams.signing import LedgerKey

if TYPE_CHECKING:  # only typed here: the learner brings JAX, which hx evolve never loads
    from hx.aegis.coevolution import CoevolveSettings

DEFAULT_BENCHES = ("twx:coin", "twx:mapreader")
DEFAULT_MODEL = "random:"


@click.command("evolve")
@click.option("--bench", "benches", multiple=True, default=DEFAULT_BENCHES, show_default=True, metavar="BENCH[:GAME]",
              help="Benchmark or benchmark:game (repeatable).")
@click.option("--tasks", type=click.IntRange(min=1), default=30, show_default=True,
              help="Adaptation tasks per game (the dev split's first N).")
@click.option("--heldout-tasks", type=click.IntRange(min=1), default=50, show_default=True,
              help="Held-out tasks per game (the first N of --heldout-split), evaluated before and after, never "
                   "evolved on.")
@click.option("--heldout-split", type=click.Choice(HELDOUT_SPLITS), default="test", show_default=True,
              help="Where the held-out tasks come from: test, or train as a validation split (to try a setting "
                   "out without looking at the test tasks).")
@click.option("--rounds", type=click.IntRange(min=1), default=6, show_default=True, help="T: the most rounds.")
@click.option("--patience", type=click.IntRange(min=1), default=3, show_default=True,
              help="P: rounds in a row without a ship that end the run.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.05, show_default=True,
              help="Actionability below which a round is a no-op.")
@click.option("--candidates", type=click.IntRange(min=1, max=16), default=3, show_default=True,
              help="K: candidates proposed per round.")
@click.option("--strategy", type=click.Choice(STRATEGIES), default="ensemble", show_default=True)
@click.option("--variants", "max_variants", type=click.IntRange(min=1, max=16), default=3, show_default=True,
              help="Most variants the ensemble keeps.")
@click.option("--evolver", type=click.Choice(EVOLVERS.names()), default="offline", show_default=True)
@click.option("--meta-model", metavar="SPEC", default="",
              help="Model of the LLM stages (evolver, critic, digester prose), e.g. anthropic:claude-sonnet-4-6. "
                   "With --resume: the recorded spec again, with the credentials the record masks.")
@click.option("--model", metavar="SPEC", help="The task agent's model  [default: random:]. With --resume: the "
                                              "recorded spec again, with the credentials the record masks.")
@click.option("--harness", "harness_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              metavar="FILE", help="Initial harness  [default: the benchmark family's starter harness]")
@click.option("--attempts", type=click.IntRange(min=1, max=16), default=2, show_default=True,
              help="Attempts per task (k of pass@k).")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=4, show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--heldout-every", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also evaluate the held-out split after every N-th round (0: before and after only).")
@click.option("--risk-threshold", type=click.FloatRange(0, 1), default=0.7, show_default=True,
              help="Candidates riskier than this wait for a human.")
@click.option("--gate-interval", default="off", show_default=True, metavar="MODE",
              help="The gate's interval check between seesaw and effect (the candidate's paired attempts against its "
                   "variant's, by the keep rule): off, no_discard (reject a DISCARD) or keep (ship only a KEEP).")
@click.option("--gate-suite", default="", metavar="FILE|default",
              help="The gate's suite check after interval: the variant's harness and the candidate's play this eval "
                   "suite (a file, or default for hx's), and a DISCARD by the keep rule on their composites rejects.")
@click.option("--gate-seesaw", default="sequential", show_default=True, metavar="RULE",
              help="How the seesaw decides a solved task regressed: sequential (more paired waves for a task the "
                   "candidate trails, an exact test with a stated error rate) or retry (retry a lost task until a "
                   "pass, the rule before it).")
@click.option("--gate-drop", type=float, default=0.25, show_default=True, metavar="RATE",
              help="sequential: the smallest fall in a solved task's pass rate that counts as a regression.")
@click.option("--gate-alpha", type=float, default=0.05, show_default=True, metavar="P",
              help="sequential: the exact test's one-sided level.")
@click.option("--gate-waves", type=int, default=3, show_default=True, metavar="N",
              help="sequential: the most waves of k paired seeds a task the candidate trails plays.")
@click.option("--induce-support", type=int, default=InductionSettings().min_support, show_default=True, metavar="N",
              help="induced evolver: the fewest tasks a learnt rule must rest on.")
@click.option("--induce-lift", type=float, default=InductionSettings().min_lift, show_default=True, metavar="X",
              help="induced evolver: how many times more often a preferred action must be useful than the others.")
@click.option("--induce-against", type=float, default=InductionSettings().max_against, show_default=True, metavar="F",
              help="induced evolver: the most steps against a rule, as a fraction of the tasks it rests on.")
@click.option("--approve", is_flag=True, help="Ask for approvals at the terminal instead of waiting for hx approve.")
@click.option("--run-id", callback=run_id_option, help="Run id  [default: evolve-<UTC time>-<random>]")
@click.option("--resume", "resume_id", callback=run_id_option, metavar="RUN",
              help="Continue a run from its ledger (its recorded settings; the options above are ignored, but "
                   "--model and --meta-model, which give back credentials the record masks).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Where to save the report  [default: DATA_DIR/results/RUN.json]")
@pass_app
def evolve_command(app: App, /, **options: Any) -> None:
    """Evolve a harness from its traces (AEGIS), every decision on the edit ledger.

    Each round runs every variant on the adaptation tasks, digests the attempts, plans,
    proposes candidates, criticises and gates them (no solved task may regress) and ships
    or forks. The held-out tasks are evaluated before the first round and after the last.
    Runs anywhere with the defaults: random agent, offline evolver, embedded nats-server.
    """
    evolve_main(app, evolve_request(options), **options)


def evolve_request(options: dict[str, Any], *, coevolve: CoevolveSettings | None = None) -> EvolveRequest:
    """The ``EvolveRequest`` the command's options make, popped from ``options`` (what stays: how to run it)."""
    pop = options.pop
    return EvolveRequest(
        tasks=TaskChoice(benches=pop("benches"), adaptation=pop("tasks"), heldout=pop("heldout_tasks"),
                         heldout_split=pop("heldout_split")),
        loop=EvolveSettings(rounds=pop("rounds"), patience=pop("patience"), alpha=pop("alpha"),
                            candidates=pop("candidates"), strategy=pop("strategy"), max_variants=pop("max_variants"),
                            heldout_every=pop("heldout_every"), risk_threshold=pop("risk_threshold"),
                            gate=GateSettings.of(pop("gate_interval"), pop("gate_suite"), seesaw=pop("gate_seesaw"),
                                                 drop=pop("gate_drop"), alpha=pop("gate_alpha"),
                                                 waves=pop("gate_waves")),
                            induction=InductionSettings.of(pop("induce_support"), pop("induce_lift"),
                                                         pop("induce_against"))),
        rollout=RolloutSettings(attempts=pop("attempts"), concurrency=pop("concurrency"), max_steps=pop("max_steps"),
                                seed=pop("seed")),
        model=pop("model"), meta_model=pop("meta_model"), evolver=pop("evolver"), coevolve=coevolve)


def evolve_main(app: App, request: EvolveRequest, *, harness_path: Path | None, approve: bool, run_id: str | None,
                resume_id: str | None, as_json: bool, out: Path | None) -> None:
    """Run ``request`` (or resume ``resume_id``, of which only the models count), report, save.

    ``request.model`` None: the default (``random:``), or on ``--resume`` the recorded one.
    """
    if request.evolver == "llm" and not request.meta_model and resume_id is None:
        raise click.BadParameter("the llm evolver needs --meta-model", param_hint="--meta-model")
    if request.model is None and resume_id is None:
        request = dataclasses.replace(request, model=DEFAULT_MODEL)
    if request.model is not None:
        check_spec_option("--model", request.model)
    if request.meta_model:
        check_spec_option("--meta-model", request.meta_model)
    given = read_harness(harness_path) if resume_id is None else None  # before the server starts or a claim
    prefix = "coevolve-" if request.coevolve is not None else "evolve-"
    run_id = resume_id or run_id or new_run_id().replace("run-", prefix, 1)
    path = out or app.private_data_dir() / "results" / f"{run_id}.json"
    claim = ResultsClaim(path) if resume_id is None else None
    note = StopNote(run_id, "hx coevolve" if request.coevolve is not None else "hx evolve")
    try:
        result = run(_evolve(app, request, run_id=run_id, given=given, approve=approve, resume=resume_id is not None,
                             note=note))
    except BaseException as exc:
        if claim is not None:
            claim.release()
        if isinstance(exc, Terminated | KeyboardInterrupt):  # say what was kept and how to go on
            click.echo(note.line("SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"), err=True)
        raise
    text = json.dumps(msgspec.to_builtins(result), indent=2) + "\n"
    if claim is not None:
        claim.write(text)
    else:  # a resumed run replaces its report
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if as_json:
        click.echo(text, nl=False)
    else:
        console = stdout_console()
        console.print(rounds_table(result))
        if result.learner:
            console.print(learner_table(result))
        console.print(heldout_table(result))
    click.echo(f"saved {path}", err=as_json)


async def _evolve(app: App, request: EvolveRequest, *, run_id: str, given: tuple[HarnessConfig, str] | None,
                  approve: bool, resume: bool, note: StopNote) -> EvolutionReport:
    async with app.connect() as conn, on_stop(conn, note):
        job: EvolveJob | None = await load_job(conn, run_id, app.settings.data_dir) if resume else None
        if job is not None:  # the credentials its record masks, given back by --model / --meta-model
            job = job.restored(request.model, request.meta_model or None)
        bench_specs = list(job.benches) if job else list(request.tasks.benches)
        benches, _ = select_tasks(bench_specs, "dev", 1)
        try:
            if job is None:
                harness, source = choose_harness(given, benches)
                job = new_job(run_id, benches, request, harness=harness, harness_source=source)
            console = stderr_console()
            console.print(f"evolve {run_id}: {len(job.adaptation)} adaptation and {len(job.heldout)} held-out tasks, "
                          f"{job.evolver} evolver, {job.loop.strategy}, up to {job.loop.rounds} "
                          f"rounds on {'the embedded nats-server' if conn.server else 'NATS'}", highlight=False)
            with EvolveProgress(console, job.loop.rounds) as progress:
                llm = llm_parts(conn, job, app.settings.data_dir)
                evolver = make_evolver(job.evolver, meta=llm.meta, store=llm.store)
                parts = Parts(evolver, progress.callbacks(), on_attempt=progress.attempt, critic=llm.critic,
                              code_check=llm.code_check, code_source=llm.code_check.sources,
                              approver=progress.approver if approve else None, prose=llm.prose, store=llm.store,
                              on_update=progress.learner, key=LedgerKey.of(app.settings.data_dir))
                try:
                    return await run_evolution(conn, benches, job, parts, resume=resume)
                finally:
                    await evolver.aclose()
                    await llm.aclose()
        finally:
            for bench in benches:
                bench.close()


def rounds_table(result: EvolutionReport) -> Table:
    """One row per round: outcome, variants, ships, adaptation pass@k, rollouts, seconds."""
    table = Table(title=f"evolve {result.run_id} · {result.status}", header_style="bold")
    for name in ("round", "outcome", "variants", "shipped", "adaptation pass@k", "rollouts", "seconds"):
        table.add_column(name, justify="left" if name in ("outcome", "shipped") else "right")
    for row in result.rounds:
        table.add_row(str(row.round), row.outcome, str(row.variants), ", ".join(row.shipped) or "–",
                      "–" if row.pass_at_k is None else f"{row.pass_at_k:.2f}", f"{row.rollouts:,}",
                      "–" if row.seconds is None else f"{row.seconds:.1f}")
    return table


def learner_table(result: EvolutionReport) -> Table:
    """One row per learner pass: the policy it produced and how the GRPO step went."""
    table = Table(title="learner (GRPO over the replay buffer)", header_style="bold")
    for name in ("through", "policy", "samples", "groups", "skipped", "loss", "KL", "clip", "entropy", "|g|", "s"):
        table.add_column(name, justify="left" if name in ("policy", "skipped") else "right")
    for u in result.learner:
        if isinstance(u, PolicyUpdated):
            table.add_row(str(u.through_round), u.version[:12], f"{u.samples:,}",
                          f"{u.groups_used}/{u.groups_used + u.groups_skipped}",
                          ", ".join(f"{k} {v:,}" for k, v in sorted(u.skipped.items())) or "–", f"{u.loss:.4f}",
                          f"{u.kl:.4f}", f"{u.clip_fraction:.2f}", f"{u.entropy:.2f}", f"{u.grad_norm:.2f}",
                          f"{u.seconds:.1f}")
        elif isinstance(u, PolicyGated):
            verdict = "adopted" if u.adopted else f"rejected: lost {len(u.lost)} of"
            table.add_row(str(u.through_round), f"gate {verdict} {u.solved} solved", f"{u.rollouts} attempts",
                          *["–"] * 8)
        else:
            table.add_row(str(u.through_round), f"(kept) {u.reason}", "0", f"0/{u.groups_skipped}",
                          ", ".join(f"{k} {v:,}" for k, v in sorted(u.skipped.items())) or "–", *["–"] * 6)
    return table


def heldout_table(result: EvolutionReport) -> Table:
    """Per game: held-out pass@2 before the first round and after the last."""
    table = Table(title=f"held-out ({result.heldout_split} split) pass@2", header_style="bold")
    for name in ("game", "tasks", "round 0", "final", "change"):
        table.add_column(name, justify="left" if name == "game" else "right")

    def fmt(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"
    for game, before, after in result.games():
        b = before.pass_at_2 if before else None
        a = after.pass_at_2 if after else None
        change = "–" if a is None or b is None else f"{100 * (a - b):+.0f} pts"
        known = before or after
        table.add_row(game, str(known.tasks) if known else "0", fmt(b), fmt(a), change)
    return table

