"""``hx coevolve``: evolve the harness (AEGIS) and train the policy (GRPO) on one log, round by round.

It is ``hx evolve`` with a learner: the same options, ledger, held-out split and report,
plus the mode, a rollout budget and the learner's settings. The task agent is the
trainable ``policy:`` model, at the learner's current version each round.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(coevolve_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

from typing import Any

import click

from hx.aegis.settings import COEVOLVE_MODES
from hx.cli._app import App, pass_app
from hx.cli.evolve import evolve_command, evolve_main, evolve_request
from hx.cli.learn import learner_options, learner_settings
from schemas.identities import fresh_policy_spec

_NOT_HERE = {"model"}  # the task agent is the trained policy


@click.command("coevolve")
@click.option("--mode", type=click.Choice(COEVOLVE_MODES), default="both", show_default=True,
              help="harness: the policy stays frozen; model: the harness stays frozen; both: both evolve.")
@click.option("--budget", type=click.IntRange(min=0), default=0, show_default=True,
              help="Attempts (main and gate rollouts) after which no round starts (0: --rounds decides).")
@click.option("--policy-gate/--no-policy-gate", default=False, show_default=True,
              help="Adopt a new policy only when it still solves every task the round solved in every attempt "
                   "(else keep its parent).")
@click.option("--learn-after-stall/--learn-from-start", default=False, show_default=True,
              help="both: the learner starts after the first round that ships no edit, the rollouts use the "
                   "first policy until then.")
@click.option("--rest-barren", type=click.IntRange(min=0), default=0, show_default=True, metavar="R",
              help="A task whose last R played rounds failed every attempt sits out the next R rounds "
                   "(its rollouts give the learner nothing to learn from; 0: every task plays every round).")
@learner_options
@pass_app
def coevolve_command(app: App, /, mode: str, budget: int, policy_gate: bool, learn_after_stall: bool,
                     rest_barren: int, **options: Any) -> None:
    """Co-evolve harness and model: per round, rollouts with the current pair, then AEGIS and a GRPO update.

    The held-out tasks are evaluated before the first round and after the last with the
    harness and policy of that moment. Runs anywhere: scorer policy, offline evolver,
    embedded nats-server, no API key.
    """
    from hx.aegis.coevolution import CoevolveSettings

    if learn_after_stall and mode != "both":
        raise click.UsageError(f"--learn-after-stall applies to --mode both, not --mode {mode}")
    learner = learner_settings(options)
    if mode == "model":
        options["evolver"] = "frozen"
        options["patience"] = options["rounds"]  # a frozen harness never ships: patience must not end the run
    settings = CoevolveSettings(mode=mode, budget=budget, learner=learner,  # type: ignore[arg-type]
                                policy_gate=policy_gate, learn_after_stall=learn_after_stall,
                                rest_barren=rest_barren)
    # on --resume the recorded policy spec stands (it holds no credentials to give back)
    options["model"] = None if options["resume_id"] else fresh_policy_spec(learner.kind)
    evolve_main(app, evolve_request(options, coevolve=settings), **options)


for _param in evolve_command.params:
    if _param.name not in _NOT_HERE:
        coevolve_command.params.append(_param)
