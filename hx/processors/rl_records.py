"""D9 ``rl_records``: write each attempt's model turns as RL records to a JSONL file as it ends.

Failure addressed: trajectories that never become training data. Every run produces
exactly the samples an RL or fine-tuning job needs, but a trainer outside hx (TRL,
OpenRLHF, a notebook) cannot read the event log. This processor collects, from the hook
events of one attempt, each model turn's prompt (as the model received it), its
completion (as the trajectory continued with it) and the attempt's verdict, and at
task_end appends one ``RLRecord`` per turn (JSON, one per line) to ``path``.

The log stays the source of truth, and hx's own learner reads it through
``hx.processors.training_bridge.attempt_to_rl_records``, which also recovers what hook
events lack: behaviour log-probabilities (on ``ModelResponse`` only, unless
``AfterModel`` gains a read-only ``logprobs`` field, which this processor then uses),
whether a processor edited the completion (``on_policy``), the run, attempt and harness
digest. Records written here say ``source: "hooks"``; their ``run_id``, ``attempt`` and
``harness_digest`` are empty, since processors do not see them.

Attach with ``attach(RlRecords.accepted_hooks(), RlRecords(path="data/rl.jsonl"))``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar, Literal

import msgspec

from hx.harness.processor import POST, Processor
from hx.processors._hookutil import append_lines
from hx.processors.training_bridge import RLRecord
from schemas.hooks import AfterModel, BeforeModel, TaskEnd, TaskStart
from schemas.lifecycle import SCORED_STATUSES
from schemas.messages import Message, ToolSchema

_encoder = msgspec.json.Encoder()
RlHook = TaskStart | BeforeModel | AfterModel | TaskEnd


def read_rl_records(path: str | Path) -> list[RLRecord]:
    """The records in a JSONL file written by ``rl_records``."""
    decoder = msgspec.json.Decoder(RLRecord)
    return [decoder.decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()]


class RlRecords(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Collect (prompt, completion, reward) per model turn; append them to a JSONL file at task_end."""

    name: ClassVar[str] = "rl_records"
    _order: ClassVar[int] = POST  # the prompt as sent and the completion as kept
    dimension: ClassVar[str] = "D9"

    path: str
    """The JSONL file records are appended to (created with its directory)."""
    reward: Literal["score", "passed"] = "score"
    """What the reward is: the verifier's score, or 1.0 / 0.0 for passed."""
    only_passed: bool = False
    """Write only attempts that passed (rejection-sampling data)."""
    statuses: tuple[str, ...] = SCORED_STATUSES
    """Attempt statuses whose records are written (interrupted and failed ones are left out by default)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("rl_records needs a path")
        self._task = ""
        self._prompt: tuple[Message, ...] = ()
        self._tools: tuple[ToolSchema, ...] = ()
        self._turns: list[RLRecord] = []
        self.written = 0
        """Records written at the end of this attempt."""

    async def process(self, event: RlHook) -> AsyncIterator[RlHook]:
        """Remember prompts and completions; write the records when the attempt ends."""
        if isinstance(event, TaskStart):
            self._task = event.task.id
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)  # an unwritable place fails before any spend
        elif isinstance(event, BeforeModel):
            self._prompt, self._tools = event.messages, event.tools
        elif isinstance(event, AfterModel):
            self._turns.append(RLRecord(
                group=self._task, task_id=self._task, turn=len(self._turns), step=event.step, model=event.model,
                prompt=self._prompt, tools=self._tools,
                completion=Message(role="assistant", content=event.content, tool_calls=event.tool_calls),
                source="hooks"))  # log-probs live on model.response, which hooks do not see
        else:
            self._write(event)
        yield event

    def _write(self, end: TaskEnd) -> None:
        turns, self._turns = self._turns, []
        if not turns or end.status not in self.statuses or (self.only_passed and not end.passed):
            return
        value = float(end.passed) if self.reward == "passed" else end.score
        lines = b"".join(_encoder.encode(msgspec.structs.replace(
            t, reward=value, passed=end.passed, status=end.status, task_id=end.task_id or t.task_id,
            group=end.task_id or t.group)) + b"\n" for t in turns)
        append_lines(self.path, lines)  # one write per attempt: attempts of one process never interleave lines
        self.written = len(turns)
