"""``hx experiment review RUN``: the panel judges a concluded experiment and proposes the next one.

The offline panel by default (no key); ``--model SPEC`` asks the three personas through that
model, every call on the log. The review is appended as ``PanelReviewed`` on the run's
run-level subject; ``--out FILE`` writes the proposal as a spec ``hx experiment run FILE`` runs.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(review_command, ["--help"]).exit_code
0
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import msgspec
import yaml

from hx.cli._app import App, pass_app, run, run_id_option
from hx.cli._specs import check_spec_option
from hx.experiment.errors import ExperimentError
from hx.experiment.llm_panel import LlmPanel
from hx.experiment.offline_panel import offline_review
from hx.experiment.panel import TITLES, append_review, load_record
from hx.runtime.models import ModelConfig
from schemas.panel import PanelReviewed


def write_proposal(path: Path, proposal: dict[str, Any]) -> None:
    """The proposal as a spec file: JSON for ``.json``, YAML for ``.yaml``/``.yml``."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        text = json.dumps(proposal, indent=2) + "\n"
    elif suffix in (".yaml", ".yml"):
        text = yaml.safe_dump(proposal, sort_keys=False)
    else:
        raise ExperimentError(f"--out {path}: write .json, .yaml or .yml (a format hx experiment run reads)")
    try:
        path.write_text(text)
    except OSError as exc:
        raise ExperimentError(f"--out {path}: cannot write ({exc.strerror})") from exc


def review_lines(review: PanelReviewed) -> list[str]:
    """The review as lines: each persona's verdict and reasons, the rejections, the decision."""
    lines = [f"panel review {review.review} of {review.run_id} ({review.reviewer})"]
    for verdict in review.verdicts:
        lines.append(f"  {TITLES[verdict.persona]}: {verdict.verdict}")
        lines.extend(f"    - {reason}" for reason in verdict.reasons)
    for rejection in review.rejections:
        lines.append(f"  rejected {rejection.persona} reply: {rejection.reason}")
    lines.append(f"decision: {review.decision}")
    proposal = review.proposal
    lines.append(f"next: {proposal.get('title', '')} ({len(proposal.get('tasks', ()))} tasks x "
                 f"{proposal.get('replications', '?')} replications)")
    return lines


@click.command("review")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.option("--model", default=None, metavar="SPEC",
              help="Ask the three personas through this model (openai:MODEL@URL, anthropic:...); "
                   "default: the offline panel, no key needed.")
@click.option("--json", "as_json", is_flag=True, help="Print the review (the PanelReviewed event) as JSON.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Write the proposed next experiment to FILE (.json or .yaml) for hx experiment run FILE.")
@pass_app
def review_command(app: App, run_id: str, model: str | None, as_json: bool, out: Path | None) -> None:
    """Judge the concluded experiment RUN: three personas, the cascade's decision, the next experiment's spec."""
    if model is not None:
        check_spec_option("--model", model)
    if out is not None and out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise ExperimentError(f"--out {out}: write .json, .yaml or .yml (a format hx experiment run reads)")
    review = run(_review(app, run_id, model, out))
    if as_json:
        click.echo(json.dumps(msgspec.to_builtins(review), indent=2, sort_keys=True))
        return
    for line in review_lines(review):
        click.echo(line)
    if out is not None:
        click.echo(f"proposal written to {out}: hx experiment run {out}")


async def _review(app: App, run_id: str, model: str | None, out: Path | None) -> PanelReviewed:
    async with app.connect() as conn:
        record = await load_record(conn.log, run_id)
        if model is None:
            review = offline_review(record)
        else:
            panel = LlmPanel(ModelConfig(main=model), conn.log)
            try:
                review = await panel.review(record)
            finally:
                await panel.aclose()
        if out is not None:  # before the event: a file that cannot be written leaves no review behind
            write_proposal(out, dict(review.proposal))
        await append_review(conn.log, review)
        return review
