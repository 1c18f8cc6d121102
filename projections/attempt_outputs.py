"""AttemptOutputs: what each finished attempt produced, as the eval suite's criteria judge it.

Per attempt: its verdict (status, passed, score, steps), its answer (the main model's last
non-empty content, and the last answer a tool call carried), which tools it called and how
often, how many of its actions the environment refused, and how long it repeated one action.
The state is bounded per attempt whatever the attempt's length: answers are cut at
``ANSWER_MAX`` characters (``answer_cut`` says so) and a loop is followed by the digest of the
last action and the length of its run, not by the action list.

Criteria (``hx.eval.criteria``) are pure functions of one ``AttemptOutput``, so ``hx eval --fast``
judges thousands of logged attempts without reading the log again: it reads this projection,
which declares the types it folds, so a change of the log's subject layout does not touch the
suite.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.lifecycle import AttemptFinished, AttemptStarted
from schemas.model import ModelResponse
from schemas.tools import EnvObservation, ToolInvoked, ToolReturned
from streams.topology import TraceAddress

ANSWER_MAX = 32_768
"""Characters of an answer kept; the rest is cut (criteria see ``answer_cut``)."""
MAIN_ROLE = "main"


class AttemptOutput(msgspec.Struct):
    """One attempt as its output: the verdict, the answer, the tools called and how its actions went."""

    run: str
    round: int
    task: str
    attempt: int
    model: str = ""
    harness_digest: str = ""
    finished: bool = False
    """True once its ``attempt.finished`` was folded."""
    status: str = ""
    passed: bool = False
    score: float = 0.0
    steps: int = 0
    reason: str = ""
    answer: str = ""
    """The main model's last non-empty content, as the model gave it (what the verifier was given, unless an
    after_model processor rewrote it); calls a processor makes under another role are not the attempt's answer."""
    submitted: str = ""
    """The last ``answer`` a tool call carried (a ``final_answer``-style tool; a number as its text), else empty."""
    answer_cut: bool = False
    tool_calls: dict[str, int] = {}
    """Tool name to how many times it was called."""
    actions: int = 0
    """Tool calls run."""
    tool_errors: int = 0
    """Tool results flagged as errors (an unknown tool, a call the tool rejected, a tool's own failure); a call a
    processor withheld at before_tool never ran and is not counted."""
    invalid_actions: int = 0
    """Actions the environment reported as invalid."""
    longest_repeat: int = 0
    """The longest run of one identical tool call (name and input) made back to back."""
    last_action: str = ""
    """Digest of the last tool call (to extend ``longest_repeat``)."""
    repeat: int = 0
    """Length of the current run of the last tool call."""
    env_done: bool = False
    env_success: bool = False

    @property
    def key(self) -> str:
        """The attempt's key, ``run/round/task/attempt``."""
        return output_key(self.run, self.round, self.task, self.attempt)

    @property
    def text(self) -> str:
        """The attempt's output text: what it submitted through a tool, else its last content."""
        return self.submitted or self.answer


def output_key(run: str, round: int, task: str, attempt: int) -> str:
    """The projection's key of one attempt."""
    return f"{run}/{round}/{task}/{attempt}"


@lru_cache(maxsize=65_536)
def _attempt_of(subject: str) -> tuple[str, str, int, str, int] | None:
    """(key, run, round, task, attempt) of an attempt's subject, None for any other; cached, as subjects repeat."""
    try:
        addr = TraceAddress.parse(subject)
    except ValueError:
        return None
    if addr.round is None or addr.task is None or addr.attempt is None:
        return None
    return output_key(addr.run, addr.round, addr.task, addr.attempt), addr.run, addr.round, addr.task, addr.attempt


def _cut(out: AttemptOutput, text: str) -> str:
    if len(text) > ANSWER_MAX:
        out.answer_cut = True
        return text[:ANSWER_MAX]
    return text


def _action_digest(call_name: str, arguments: object) -> str:
    body = msgspec.json.encode([call_name, arguments], order="sorted")
    return hashlib.blake2b(body, digest_size=8).hexdigest()


class AttemptOutputs(Projection[dict[str, AttemptOutput]]):
    """Per attempt: verdict, answer, tool calls, invalid actions and repeats; the eval suite's input."""

    name: ClassVar[str] = "attempt_outputs"
    version: ClassVar[int] = 2
    """2: a number a tool call gave as its answer is submitted as its text."""
    reads = frozenset({AttemptStarted.TYPE, AttemptFinished.TYPE, ModelResponse.TYPE, ToolInvoked.TYPE,
                       ToolReturned.TYPE, EnvObservation.TYPE})
    state_type = dict[str, AttemptOutput]

    def initial(self) -> dict[str, AttemptOutput]:
        """No attempts yet."""
        return {}

    def fold(self, state: dict[str, AttemptOutput], record: Record) -> dict[str, AttemptOutput]:
        """Update the output of the record's attempt."""
        where = _attempt_of(record.subject)
        if where is None:
            return state
        out = state.get(where[0])
        if out is None:
            out = state[where[0]] = AttemptOutput(*where[1:])
        event = record.event
        if isinstance(event, ToolInvoked):
            call = event.call
            out.tool_calls[call.name] = out.tool_calls.get(call.name, 0) + 1
            out.actions += 1
            digest = _action_digest(call.name, call.input)
            out.repeat = out.repeat + 1 if digest == out.last_action else 1
            out.last_action = digest
            out.longest_repeat = max(out.longest_repeat, out.repeat)
            answer = call.input.get("answer") if isinstance(call.input, dict) else None
            if isinstance(answer, str):
                if answer:
                    out.submitted = _cut(out, answer)
            elif isinstance(answer, int | float) and not isinstance(answer, bool):
                out.submitted = str(answer)  # as a final_answer tool takes a number (hx.environments.gaia)
        elif isinstance(event, ToolReturned):
            out.tool_errors += event.result.is_error
        elif isinstance(event, EnvObservation):
            out.invalid_actions += bool(event.info.get("invalid"))
            out.env_done = out.env_done or event.done
            out.env_success = out.env_success or event.success
        elif isinstance(event, ModelResponse):
            if event.role == MAIN_ROLE and event.content:
                out.answer = _cut(out, event.content)
        elif isinstance(event, AttemptStarted):
            out.model = event.model
            out.harness_digest = event.harness_digest
        elif isinstance(event, AttemptFinished):
            out.finished = True
            out.status = event.status
            out.passed = event.passed
            out.score = event.score
            out.steps = event.steps
            out.reason = event.reason
        return state
