"""The child side of the smoke test: runs inside the sandboxed subprocess that ``hx.aegis.smoke`` starts.

Importing this module does nothing; ``main`` is what the child runs. It reads its request
(base harness, operations, code modules and a nonce) from a file it deletes at once,
writes the code modules under their content names (``hx_plugin_<hex>.py``) in its
working directory, imports them, and reports in three steps on a private copy of its
stdout (anything the candidate code prints goes to stderr instead):

1. ``config``: the operations applied to the base harness, and the candidate's digest;
2. ``running``: what it is about to do (the parent names it when the time limit kills
   the child);
3. ``smoke``: every new processor driven through the contract kit on representative
   events of each hook it accepts, then a round trip: the candidate's and the base's
   before_model pipelines on the same synthetic event, and what the candidate changes
   in the model's input.

Each report is one line: the marker, the nonce, a JSON object.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import msgspec

import hx.processors  # noqa: F401 - the base harness names library processors by their registry names
from hx.harness.config import HarnessConfig
from hx.harness.edits import apply
from hx.harness.errors import Interrupt
from hx.harness.processor import Processor, build, registered
from hx.processors.testing import check_processor, scenario
from hx.runtime.code import module_name, source_digest
from hx.runtime.errors import ProcessorFailed
from hx.runtime.pipeline import HookPipeline
from schemas.edits import AnyEditOp, Attach, Replace
from schemas.event import Event
from schemas.hooks import BeforeModel, ProcessorTriggered, TaskStart

MARK = "@@hx-smoke "
CLIP = 120


class _Reporter:
    """Writes report lines to a private copy of stdout (the candidate cannot mix its output in)."""

    def __init__(self, nonce: str) -> None:
        self.nonce = nonce
        self.out: TextIO = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def __call__(self, stage: str, **fields: Any) -> None:
        self.out.write(f"{MARK}{self.nonce} {json.dumps({'stage': stage, **fields})}\n")
        self.out.flush()


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CLIP else text[:CLIP - 3] + "..."


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def describe_change(before: BeforeModel, after: BeforeModel) -> str:
    """What ``after`` changes in the model input of ``before``: messages, offered tools, route."""
    parts: list[str] = []
    old, new = before.messages, after.messages
    if len(new) > len(old) and new[:len(old)] == old:
        parts += [f"appends a {m.role} message {_clip(m.content)!r}" for m in new[len(old):]]
    elif new != old:
        if len(new) != len(old):
            parts.append(f"messages {len(old)} -> {len(new)}")
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            if a != b:
                parts.append(f"message {i} ({b.role}) becomes {_clip(b.content)!r}")
    names = [t.name for t in before.tools], [t.name for t in after.tools]
    if names[0] != names[1]:
        parts.append(f"tools offered {names[0]} -> {names[1]}")
    elif before.tools != after.tools:
        parts.append("narrows the schemas of tools " + ", ".join(
            t.name for t, u in zip(before.tools, after.tools, strict=True) if t != u))
    if before.route != after.route:
        parts.append(f"route {before.route!r} -> {after.route!r}")
    return "; ".join(parts) or "no change"


async def _model_input(harness: HarnessConfig) -> tuple[BeforeModel | str, set[str]]:
    """The harness's model input for the synthetic step (or what stopped it), and the groups that acted on it.

    A processor that crashes (``ProcessorFailed``) or breaks its contract raises: that fails the smoke test.
    """
    events = scenario()
    start = next(e for e in events if isinstance(e, TaskStart))
    step = next(e for e in events if isinstance(e, BeforeModel))
    emitted: list[Event] = []
    pipelines = harness.instantiate()

    def acted() -> set[str]:
        return {e.group for e in emitted if isinstance(e, ProcessorTriggered) and e.hook == "before_model"}

    try:
        await HookPipeline("task_start", pipelines["task_start"], emitted.append).run(start, 0)
        out = await HookPipeline("before_model", pipelines["before_model"], emitted.append).run(step, step.step)
    except ProcessorFailed:
        raise
    except Interrupt as exc:
        return f"interrupts the attempt: {exc}", acted()
    if len(out) != 1:
        return ("intercepts the model call" if not out else f"splits the model call into {len(out)}"), acted()
    result = out[0]
    assert isinstance(result, BeforeModel)
    return result, acted()


async def round_trip(base: HarnessConfig, candidate: HarnessConfig) -> str:
    """What the candidate changes in the model's input, against the base, on one synthetic step."""
    before, acted_before = await _model_input(base)
    after, acted_after = await _model_input(candidate)
    if isinstance(after, str) or isinstance(before, str):
        if isinstance(after, str):
            return after if after != before else "no change"
        return f"no longer {before}"
    change = describe_change(before, after)
    new = sorted(acted_after - acted_before)
    return change + (f" (by {', '.join(new)})" if new and change != "no change" else "")


def _params_of(operations: list[AnyEditOp]) -> dict[str, dict[str, Any]]:
    return {op.processor: dict(op.params) for op in operations if isinstance(op, Attach | Replace)}


async def _smoke(modules: list[tuple[str, str]], operations: list[AnyEditOp], report: _Reporter) -> list[str]:
    """Drive every processor the modules define through the contract kit; the failures."""
    failures: list[str] = []
    params = _params_of(operations)
    for file, module in modules:
        classes: list[type[Processor]] = [c for c in registered().values() if c.__module__ == module]
        if not classes:
            failures.append(f"{file}: defines no processor (a Processor subclass with a process() method)")
        for cls in classes:
            name = cls.type_name()
            report("running", what=f"running the contract kit on {name}")
            try:
                await check_processor(build(name, params.get(name, {})))
            except BaseException as exc:  # noqa: BLE001 - the boundary: any failure of candidate code is reported
                failures.append(f"{file}: {name}: {_failure(exc)}")
    return failures


async def _run(request: dict[str, Any], report: _Reporter) -> None:
    modules: list[tuple[str, str]] = []
    for file, source in request["code"]:
        module = module_name(source_digest(source))
        Path(f"{module}.py").write_text(source)
        modules.append((file, module))
    importlib.invalidate_caches()
    broken: list[str] = []
    for file, module in modules:
        report("running", what=f"importing {file}")
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - the boundary: candidate code may raise anything at import
            broken.append(f"{file}: import failed: {_failure(exc)}")
    if broken:
        report("config", ok=False, error="not checked: " + "; ".join(broken))
        report("smoke", ok=False, error="; ".join(broken))
        return
    report("running", what="applying the operations")
    try:
        base = HarnessConfig.from_dict(request["base"], where="base harness")
        operations = msgspec.convert(request["operations"], list[AnyEditOp])
        candidate = apply(base, operations)
    except BaseException as exc:  # noqa: BLE001 - a processor's constructor is candidate code too
        report("config", ok=False, error=_failure(exc))
        report("smoke", ok=False, error=f"not run: the operations do not build ({_failure(exc)})")
        return
    report("config", ok=True, digest=candidate.digest)
    failures = await _smoke(modules, operations, report)
    if failures:
        report("smoke", ok=False, error="; ".join(failures))
        return
    report("running", what="running the before_model round trip")
    try:
        effect = await round_trip(base, candidate)
    except BaseException as exc:  # noqa: BLE001 - the boundary, as above
        report("smoke", ok=False, error=f"round trip: {_failure(exc)}")
        return
    report("smoke", ok=True, effect=effect)


def main(request_path: str) -> None:
    """Run one smoke test from the request file (deleted once read); exit without waiting for stray threads."""
    path = Path(request_path)
    request = json.loads(path.read_text())
    path.unlink()
    report = _Reporter(request["nonce"])
    try:
        asyncio.run(_run(request, report))
    except BaseException as exc:  # noqa: BLE001 - the last word: whatever escaped is the smoke failure
        report("smoke", ok=False, error=f"the smoke test crashed: {_failure(exc)}")
    report.out.flush()
    os._exit(0)  # a thread the candidate started must not keep the child alive
