"""``hx learn RUN``: train the run's policy from its trace (GRPO, or ``--algorithm``), one pass per finished round.

The learner follows the run: it trains on what has finished, then waits for the next
``round.finished`` until the run ends (``--once``: train on what is there and stop). Its
records go to ``HX_LEARN`` and its checkpoints to the object store; restarted, it goes on
from its last record. The JAX modules load only when the command runs.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(learn_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
import msgspec

from hx.cli._app import App, pass_app, run, run_id_option, stderr_console
from hx.learner.algorithm import ALGORITHMS, algorithm
from hx.learner.kinds import KINDS
from schemas.errors import HxError
from schemas.learn import PolicyGated, PolicyUpdated, UpdateSkipped
from schemas.lifecycle import RoundFinished, RunFinished
from streams.topology import NO_TOKEN, TRACE, subject_token, trace_subject

if TYPE_CHECKING:
    from hx.learner.trainer import LearnerSettings

F = TypeVar("F", bound=Callable[..., Any])


def _policy_config(_ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int | float]:
    """``KEY=NUMBER`` pairs as a dict; anything else is a usage error naming the pair."""
    out: dict[str, int | float] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        try:
            value = json.loads(raw) if sep and key.strip() else None
        except ValueError:
            value = None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise click.BadParameter(f"{item!r}: expected KEY=NUMBER, e.g. context_gain=0.1", param=param)
        out[key.strip()] = value
    return out


def learner_options(fn: F) -> F:
    """The options that configure a learner, shared by ``hx learn`` and ``hx coevolve``."""
    options = [
        click.option("--learner", "learner_name", default="default", show_default=True,
                     help="Learner name (several learners may train on one run)."),
        click.option("--kind", type=click.Choice(tuple(KINDS)), default="scorer", show_default=True,
                     help="Policy kind of a fresh policy: a choice scorer, or a small causal LM."),
        click.option("--init", "init_version", default="", metavar="VERSION",
                     help="Start from this stored checkpoint instead of a fresh policy."),
        click.option("--policy-config", "policy_config", multiple=True, metavar="KEY=NUMBER",
                     callback=_policy_config, help="A setting of a fresh policy, e.g. context_gain=0.1 or "
                     "hidden=128 for the scorer (repeatable)."),
        click.option("--algorithm", "algorithm_name", default="grpo", show_default=True,
                     metavar=f"[{'|'.join(ALGORITHMS.names())}]",
                     help="Learner algorithm (an hx.algorithms entry point): how a group's rewards become "
                     "advantages."),
        click.option("--window", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Trace rounds the replay buffer holds (FIFO)."),
        click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-2, show_default=True,
                     help="AdamW learning rate."),
        click.option("--epochs", type=click.IntRange(min=1), default=4, show_default=True,
                     help="Passes over the buffer per update."),
        click.option("--minibatch", type=click.IntRange(min=1), default=256, show_default=True,
                     help="Samples per optimiser step."),
        click.option("--clip-eps", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True), default=0.2,
                     show_default=True, help="PPO clip range: a sampled choice's ratio is clipped to "
                     "[1 - eps, 1 + eps], or to 1 + --clip-eps-high above."),
        click.option("--clip-eps-high", type=click.FloatRange(min=0, min_open=True), default=1.0,
                     show_default=True, help="Upper clip range (clip-higher, as in DAPO): lets a rare choice "
                     "with a positive advantage grow faster per pass; the value of --clip-eps is the "
                     "symmetric clip."),
        click.option("--kl-beta", type=click.FloatRange(min=0), default=0.0, show_default=True,
                     help="Weight of the k3 KL to the first policy (0: off)."),
        click.option("--entropy-coef", type=click.FloatRange(min=0), default=0.0, show_default=True),
        click.option("--step-weight", type=click.FloatRange(min=0), default=1.0, show_default=True,
                     help="Weight of step-level advantages from states a task's trajectories share (0: off)."),
        click.option("--weigh", type=click.Choice(("trajectory", "turn")), default="trajectory", show_default=True,
                     help="Give each trajectory the same weight in a pass, or each turn (a long attempt then "
                     "weighs as many turns as it has)."),
        click.option("--step-discount", type=click.FloatRange(min=0, max=1, min_open=True), default=0.95,
                     show_default=True, help="Discount per remaining turn of a step-level return."),
        click.option("--learner-seed", type=int, default=0, show_default=True,
                     help="Seed of the fresh policy and of the minibatch order."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def learner_settings(options: dict[str, Any]) -> LearnerSettings:
    """``LearnerSettings`` from the learner options (popped from ``options``); an unknown algorithm names the known."""
    from hx.learner.trainer import LearnerSettings

    config = algorithm(options.pop("algorithm_name")).config_type(
        learning_rate=options.pop("lr"), epochs=options.pop("epochs"), minibatch=options.pop("minibatch"),
        clip_eps=options.pop("clip_eps"), clip_eps_high=options.pop("clip_eps_high"),
        kl_beta=options.pop("kl_beta"), entropy_coef=options.pop("entropy_coef"), seed=options["learner_seed"])
    return LearnerSettings(learner=options.pop("learner_name"), kind=options.pop("kind"),
                           config=options.pop("policy_config"),
                           init=options.pop("init_version"), init_seed=options.pop("learner_seed"),
                           window=options.pop("window"), step_weight=options.pop("step_weight"),
                           step_discount=options.pop("step_discount"),
                           per_trajectory=options.pop("weigh") == "trajectory",
                           algorithm=config)  # type: ignore[arg-type]  # the registry's config is one of the union


def describe(record: PolicyUpdated | UpdateSkipped | PolicyGated) -> str:
    """One line about a learner record."""
    if isinstance(record, PolicyGated):
        lost = f", lost {', '.join(record.lost)}" if record.lost else ""
        verdict = "adopted" if record.adopted else f"rejected, {record.parent[:12]} kept"
        return (f"through round {record.through_round}: policy gate {verdict} · {record.candidate[:12]} on "
                f"{record.solved} solved task(s), {record.rollouts} attempt(s){lost}")
    if isinstance(record, PolicyUpdated):
        skipped = ", ".join(f"{k} {v:,}" for k, v in sorted(record.skipped.items()))
        return (f"through round {record.through_round}: policy {record.version[:12]} · {record.samples:,} samples · "
                f"groups {record.groups_used} used, {record.groups_skipped} without spread · loss {record.loss:.4f} "
                f"· KL {record.kl:.4f} · clip {record.clip_fraction:.2f} · entropy {record.entropy:.2f} · "
                f"|g| {record.grad_norm:.2f} · {record.seconds:.1f}s on {record.device}"
                + (f" · skipped {skipped}" if skipped else ""))
    return f"through round {record.through_round}: policy kept ({record.reason})"


@click.command("learn")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@learner_options
@click.option("--once", is_flag=True, help="Train on the rounds finished now and stop (default: follow the run).")
@click.option("--json", "as_json", is_flag=True, help="Print each learner record as a JSON line on stdout.")
@pass_app
def learn_command(app: App, /, run_id: str, once: bool, as_json: bool, **options: Any) -> None:
    """Train RUN's policy (cross-harness GRPO, or --algorithm) from its trace, after each round, until the run ends."""
    settings = learner_settings(options)
    run(_learn(app, run_id, settings, once=once, as_json=as_json))


async def _learn(app: App, run_id: str, settings: LearnerSettings, *, once: bool, as_json: bool) -> None:
    from hx.learner.trainer import Learner

    console = stderr_console()

    def show(record: PolicyUpdated | UpdateSkipped | None) -> None:
        if record is None:
            return
        if as_json:
            click.echo(json.dumps(msgspec.to_builtins(record)))
        else:
            console.print(describe(record), highlight=False)

    async with app.connect() as conn:
        if not await conn.log.last_subject_seq(trace_subject(run_id)):
            if once:
                raise HxError(f"run {run_id!r} is not on this log (no run.started): nothing to learn from")
            console.print(f"run {run_id} has not started: waiting for it", highlight=False)
        learner = Learner(conn.log, run_id, settings)
        position = await learner.open()
        console.print(f"learner {settings.learner} of {run_id}: policy {position.version[:12]}, trained through round "
                      f"{position.through_round}", highlight=False)
        show(await learner.update())
        if once:
            return
        run_tok = subject_token(run_id)
        lifecycle = [f"hx.trace.{run_tok}.*.{NO_TOKEN}.{NO_TOKEN}"]
        async for rec in conn.log.subscribe(TRACE.name, subjects=lifecycle,
                                            types=(RoundFinished.TYPE, RunFinished.TYPE)):
            show(await learner.update())
            if isinstance(rec.event, RunFinished):
                break
