"""The counterfactual check: a candidate's processors replayed over recorded attempts, no model, no environment.

An attempt's hook records hold every event its processors were given (``emitted``) and
what they made of it (``returned``). Replaying means feeding the emitted events, in
order, to fresh instances of the *candidate's* pipelines and comparing what comes out
with what the recorded harness returned. While they agree, the attempt is exactly what
it would have been under the candidate (the model saw the same input, so the recorded
response stands; the environment got the same actions). Then:

- ``same``: they agreed to the end: the outcome cannot change;
- ``diverged``: the candidate changed what the model sees (the offer, the history, a
  tool result, the system prompt): from there the recorded responses are no evidence,
  so nothing is concluded (not a failure);
- ``changed``: with the model's input unchanged, the candidate changed what happens (a
  response edited, a tool call corrected or refused, the attempt interrupted): its
  outcome may change, and the gate rejects the candidate.

A harness holding a processor that calls a model itself (``Processor.calls_model``, a
judge) is not replayed at all: ``diverged``, since the replay makes no model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from hx.harness.config import HarnessConfig
from hx.harness.errors import ContractViolation, Interrupt
from hx.runtime.errors import ProcessorFailed
from hx.runtime.pipeline import HookPipeline
from schemas.envelope import Record
from schemas.history import resolve
from schemas.hooks import HOOK_OF, HookName, HookRecord

Verdict = Literal["same", "diverged", "changed"]
INPUT_HOOKS: frozenset[HookName] = frozenset({"task_start", "step_start", "before_model", "after_tool"})
"""Hooks whose output is (part of) what the model sees next: a difference there makes the replay diverge."""


async def replay(harness: HarnessConfig, records: Sequence[Record]) -> tuple[Verdict, str]:
    """Replay one attempt's records (in log order) under ``harness``; the verdict and where it was decided."""
    calling = [a.type for a in harness.attachments if a.cls().calls_model]
    if calling:  # it would call a model: a replay makes none, so it proves nothing either way
        return "diverged", f"{', '.join(calling)} calls a model, which a replay may not"
    pipes = {hook: HookPipeline(hook, procs, lambda event: None) for hook, procs in harness.instantiate().items()}
    hooks = [r.event for r in resolve(records, strict=False) if isinstance(r.event, HookRecord)]
    i = 0
    while i < len(hooks):
        emitted = hooks[i]
        i += 1
        if emitted.stage != "emitted":
            continue
        expected = []
        while i < len(hooks) and hooks[i].stage == "returned":
            expected.append(hooks[i].event)
            i += 1
        hook = HOOK_OF[type(emitted.event)]
        where = f"step {emitted.step} {hook}"
        try:
            produced = await pipes[hook].run(emitted.event, emitted.step)
        except (Interrupt, ContractViolation) as exc:
            if isinstance(exc, ProcessorFailed):
                return "diverged", f"{where}: a processor could not run without its services ({exc})"
            return "changed", f"{where}: the candidate interrupts the attempt"
        if list(produced) != expected:
            return ("diverged", f"{where}: the model's input changes") if hook in INPUT_HOOKS else (
                "changed", f"{where}: the candidate changes what happens with the same model input")
    return "same", "every hook returned what it did before"
