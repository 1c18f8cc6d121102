"""``hx trace RUN TASK``: one attempt as a readable transcript (observation, choice, tool result, processors)."""

from __future__ import annotations

import json
import sys

import click
import msgspec

from hx.cli._app import App, check_round_or_stage, pass_app, quarantine_note, run, run_id_option
from hx.replay.logged import describe_round
from hx.replay.transcript import Choice, Step, ToolStep, Transcript, Trigger, read_transcript
from schemas.messages import Message, ToolCall

_WIDTH = 200
"""Characters of one shown value before it is cut (``--full`` shows everything)."""
_LABEL = 12


@click.command("trace")
@click.argument("run_id", metavar="RUN", callback=run_id_option)
@click.argument("task")
@click.option("--round", "round_", type=click.IntRange(min=0), metavar="N",
              help="The trace round (default: the latest in which the task was attempted; gate, held-out and "
                   "retried batches each have their own).")
@click.option("--stage", type=click.IntRange(min=0), metavar="N",
              help="The main rollouts of evolution round N (as hx evolve numbers them) instead of --round.")
@click.option("--attempt", type=click.IntRange(min=0), metavar="A",
              help="The attempt (default: the first attempt of the task in that round).")
@click.option("--full", is_flag=True, help="Show every value in full (default: cut at 200 characters).")
@click.option("--json", "as_json", is_flag=True, help="Print the transcript as one JSON object.")
@pass_app
def trace_command(app: App, run_id: str, task: str, round_: int | None, stage: int | None, attempt: int | None,
                  full: bool, as_json: bool) -> None:
    """Show one attempt of TASK in RUN step by step.

    Per step: what the model observed (the messages new to it, and the environment's
    observation), what it chose (content and tool calls, and what processors let through),
    each tool's result, and which processors triggered. Only the attempt's own subject is
    read; conversations are resolved from their logged deltas.
    """
    check_round_or_stage(round_, stage, required=False)
    transcript = run(_read(app, run_id, task, round_, stage, attempt))
    if as_json:
        sys.stdout.write(msgspec.json.encode(transcript).decode() + "\n")
        return
    for line in render(transcript, width=None if full else _WIDTH):
        click.echo(line)


async def _read(app: App, run_id: str, task: str, round_: int | None, stage: int | None,
                attempt: int | None) -> Transcript:
    async with app.connect() as conn:
        transcript = await read_transcript(conn.log, run_id, task, round_, attempt, stage=stage)
        quarantine_note(conn.log)
        return transcript


def _cut(text: str, width: int | None) -> str:
    text = " ".join(text.split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _call(call: ToolCall, width: int | None) -> str:
    return _cut(f"{call.name}({json.dumps(call.input, ensure_ascii=False, sort_keys=True)})", width)


def _line(label: str, text: str) -> str:
    return f"  {label:<{_LABEL}}{text}"


def _others(values: tuple[int, ...]) -> str:
    return "" if len(values) <= 1 else f" (of {', '.join(map(str, values))})"


def render(t: Transcript, width: int | None = _WIDTH) -> list[str]:
    """The transcript as text lines."""
    out = [f"run {t.run} · trace round {t.round}{_others(t.rounds)} · task {t.task} · "
           f"attempt {t.attempt}{_others(t.attempts)}"]
    if t.started is not None:
        out.append(describe_round(t.round, t.started))
    took = f" · {_duration(t.took_ms)}" if t.took_ms else ""
    out.append(f"harness {t.harness_digest or '?'} · model {t.model or '?'} · {t.events} events{took}")
    if t.instruction:
        out.append(_line("task", _cut(t.instruction, width)))
    out.extend(_line("processor", _trigger(tr, width)) for tr in t.setup if tr.hook == "task_start")
    for step in t.steps:
        out.extend(_step(step, width))
    out.append("")
    if t.verdict is not None:
        v = t.verdict
        out.append(_line("verifier", f"{v.verifier}: {'passed' if v.passed else 'failed'}, score {v.score:g}"
                                     + (f" ({_cut(v.detail, width)})" if v.detail else "")))
    out.extend(_line("processor", _trigger(tr, width)) for tr in t.setup if tr.hook == "task_end")
    if t.finished is None:
        out.append(_line("outcome", "still running (no attempt.finished yet)"))
    else:
        f = t.finished
        verdict = "passed" if f.passed else "failed"
        out.append(_line("outcome", f"{verdict} after {f.steps} steps, score {f.score:g}, {f.status}"
                                    + (f": {_cut(f.reason, width)}" if f.reason else "")))
    return out


def _message(m: Message, width: int | None) -> str:
    who = f"tool {m.name}" if m.role == "tool" and m.name else m.role
    return f"{who}: {_cut(m.content, width)}"


def _step(step: Step, width: int | None) -> list[str]:
    out = ["", f"step {step.number}" + (f"  (at {_duration(step.at_ms)})" if step.at_ms else "")]
    # causal order: what the model saw, what it chose, what the tools returned, what processors did
    out.extend(_line("observation", _message(m, width)) for m in step.observation)
    for error in step.errors:
        out.append(_line("model error", f"{error.kind} ({error.next_action}): {_cut(error.message, width)}"))
    if step.choice is not None:
        out.extend(_choice(step.choice, width))
    for tool in step.tools:
        out.extend(_tool(tool, width))
    # the environment's observation after the action is usually the tool's result: shown only when it is not
    returned = {r.output for t in step.tools for r in (t.result, t.passed_on) if r is not None}
    out.extend(_line("environment", _cut(e.observation, width)) for e in step.environment
               if e.observation not in returned)
    out.extend(_line("processor", _trigger(tr, width)) for tr in step.triggers)
    return out


def _choice(choice: Choice, width: int | None) -> list[str]:
    parts = [_call(c, width) for c in choice.tool_calls]
    if choice.content:
        parts.insert(0, repr(_cut(choice.content, width)))
    usage = choice.usage
    tokens = f", {usage.input_tokens} in / {usage.output_tokens} out tokens" if usage.input_tokens else ""
    took = f", {_duration(choice.took_ms)}" if choice.took_ms else ""
    out = [_line("model", f"{' + '.join(parts) or '(nothing)'}  [{choice.model}, {choice.stop_reason or '-'}"
                          f"{tokens}{took}]")]
    after = choice.passed_on
    if after is not None:
        changed = [_call(c, width) for c in after.tool_calls]
        if after.content:
            changed.insert(0, repr(_cut(after.content, width)))
        out.append(_line("passed on", " + ".join(changed) or "(nothing)"))
    return out


def _tool(tool: ToolStep, width: int | None) -> list[str]:
    if not tool.approved:
        return [_line("tool", f"{_call(tool.call, width)} withheld (not approved)")]
    if tool.result is None:
        return [_line("tool", f"{_call(tool.call, width)} -> (no result)")]
    error = " [error]" if tool.result.is_error else ""
    took = f"  ({_duration(tool.took_ms)})" if tool.took_ms else ""
    out = [_line("tool", f"{tool.call.name} -> {_cut(tool.result.output, width)}{error}{took}")]
    if tool.passed_on is not None:
        out.append(_line("passed on", _cut(tool.passed_on.output, width)))
    return out


def _duration(ms: float) -> str:
    """A duration as people read it: ``0.4 ms``, ``312 ms``, ``1.25 s``."""
    if ms < 1:
        return f"{ms:.1f} ms"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _trigger(tr: Trigger, width: int | None) -> str:
    fields = f" {', '.join(tr.fields)}" if tr.fields else ""
    reason = f": {_cut(tr.reason, width)}" if tr.reason else ""
    return f"{tr.processor} {tr.action}{fields} at {tr.hook}{reason}"

