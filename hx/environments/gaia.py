"""GAIA-style question answering from JSONL files on disk, judged by GAIA's normalised exact match.

Each line is an object in the shape of GAIA's ``metadata.jsonl``: ``Question``, ``Final answer``,
``Level`` and optionally ``task_id`` and ``file_name`` (an attachment next to the file). Where
the files are: the ``path`` option or ``HX_GAIA_PATH``, either one JSONL file (the ``dev``
split) or a folder holding ``dev.jsonl`` / ``test.jsonl`` / ``train.jsonl`` or GAIA's own
layout, ``validation/metadata.jsonl`` (dev) and ``test/metadata.jsonl`` (test).

Task ids are ``gaia:<level>:<split>:<n>``, the n-th question of that level in file order, with
``level`` one of ``level1``, ``level2``, ``level3`` or ``all``. The agent answers with the
``final_answer`` tool or in its last message (the text after ``FINAL ANSWER:`` if present).

>>> bench = GaiaBenchmark("tests/fixtures/gaia")
>>> [str(t) for t in bench.task_ids("level1", "dev", limit=2)]
['gaia:level1:dev:0', 'gaia:level1:dev:1']
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from hx.environments.errors import BenchmarkError
from hx.environments.gaia_scorer import gaia_match
from hx.environments.registry import SPLITS, Benchmark, TaskId
from hx.runtime.task import Task, Tool
from schemas.event import Event
from schemas.messages import TaskSpec, ToolCall, ToolResult, ToolSchema
from schemas.tools import EnvObservation, VerifierScore

ENV_VAR = "HX_GAIA_PATH"
LEVELS = ("all", "level1", "level2", "level3")
_LAYOUTS: dict[str, tuple[str, ...]] = {
    "train": ("train.jsonl", "train/metadata.jsonl"),
    "dev": ("dev.jsonl", "validation/metadata.jsonl", "validation.jsonl"),
    "test": ("test.jsonl", "test/metadata.jsonl"),
}
_FINAL = re.compile(r"final answer\s*:", re.IGNORECASE)
NO_REFERENCE = ("", "?")
"""Reference answers that mean the answer is withheld (GAIA's test split)."""

SYSTEM_PROMPT = ("Answer the question. When you know the answer, call `final_answer`, or reply with a last line "
                 "'FINAL ANSWER: <answer>': a number, a few words, or a comma-separated list, as short as possible.")

FINAL_ANSWER = ToolSchema(name="final_answer", description="Submit the final answer to the question.",
                          input_schema={"type": "object", "properties": {"answer": {"type": "string"}},
                                        "required": ["answer"]})


@dataclass(frozen=True)
class Question:
    """One question as read from the file."""

    question: str
    answer: str
    level: int
    gaia_id: str = ""
    file: str = ""
    """Absolute path of the attachment, or empty."""


def extract_answer(content: str) -> str:
    """The text after the last ``FINAL ANSWER:`` in a reply, or the whole reply, stripped."""
    parts = _FINAL.split(content)
    return parts[-1].strip()


def read_questions(path: Path) -> list[Question]:
    """Parse a GAIA-style JSONL file; errors name the file and line."""
    out: list[Question] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, level = row["Question"], int(row["Level"])
            except (ValueError, KeyError, TypeError) as exc:
                raise BenchmarkError(f"{path}:{number}: not a GAIA question (needs 'Question' and 'Level'): "
                                     f"{type(exc).__name__}: {exc}") from None
            attachment = str(row.get("file_name") or "")
            out.append(Question(question=str(question), answer=str(row.get("Final answer", "")).strip(),
                                level=level, gaia_id=str(row.get("task_id", "")),
                                file=str((path.parent / attachment).resolve()) if attachment else ""))
    return out


class Answering(Protocol):
    """A task that takes its answer through ``final_answer`` (a GAIA question, a suite's free task)."""

    def submit(self, answer: str) -> None:
        """Record the answer; the episode is over."""


class FinalAnswerTool(Tool):
    """Records the agent's answer and ends the episode."""

    schema = FINAL_ANSWER

    def __init__(self, task: Answering) -> None:
        self._task = task

    async def call(self, call: ToolCall) -> ToolResult:
        """Keep the answer; a missing one is an error the model sees."""
        answer = call.input.get("answer")
        if not isinstance(answer, str | int | float) or isinstance(answer, bool):
            return ToolResult(call_id=call.id, name=call.name, is_error=True, output="final_answer needs 'answer'")
        self._task.submit(str(answer))
        return ToolResult(call_id=call.id, name=call.name, output="Answer recorded.")


class GaiaTask(Task):
    """One question: a ``final_answer`` tool and the exact-match verifier."""

    system_prompt = SYSTEM_PROMPT

    def __init__(self, task_id: TaskId, question: Question) -> None:
        self.question = question
        text = question.question + (f"\n\nAttached file: {question.file}" if question.file else "")
        self.spec = TaskSpec(id=str(task_id), instruction=text, benchmark="gaia", split=task_id.split,
                             seed=task_id.seed, meta={"gaia_task_id": question.gaia_id, "level": question.level,
                                                      "file": question.file})
        self._tools: tuple[Tool, ...] = (FinalAnswerTool(self),)
        self._events: list[Event] = []
        self.answer: str | None = None
        """What the agent submitted through ``final_answer``."""

    def tools(self) -> Sequence[Tool]:
        """The ``final_answer`` tool."""
        return self._tools

    async def reset(self) -> str:
        """The question (and where its attachment is)."""
        self._events.append(EnvObservation(step=0, observation=self.spec.instruction,
                                           info={"level": self.question.level, "file": self.question.file}))
        return self.spec.instruction

    def submit(self, answer: str) -> None:
        """Record the answer; the episode is over."""
        self.answer = answer
        self._events.append(EnvObservation(step=1, observation=f"answer submitted: {answer}", done=True,
                                           info={"answer": answer}))

    def solution(self) -> tuple[str, ...]:
        """The reference answer."""
        return (self.question.answer,)

    def gold_answer(self) -> str:
        """The reference answer (for tests and the adapter kit)."""
        return self.question.answer

    @property
    def done(self) -> bool:
        """True once an answer was submitted."""
        return self.answer is not None

    def drain_events(self) -> list[Event]:
        """The question and the submission, as observations."""
        events, self._events = self._events, []
        return events

    async def verify(self, final_answer: str) -> VerifierScore:
        """GAIA's normalised exact match of the submitted (or last-message) answer."""
        answer = self.answer if self.answer is not None else extract_answer(final_answer)
        if self.question.answer in NO_REFERENCE:
            return VerifierScore(verifier="gaia:exact_match", passed=False,
                                 detail=f"no reference answer in the file; answer={answer!r}")
        passed = gaia_match(answer, self.question.answer)
        return VerifierScore(verifier="gaia:exact_match", passed=passed, score=float(passed), reward=float(passed),
                             detail=f"answer={answer!r}")


class GaiaBenchmark(Benchmark):
    """Questions from GAIA-style JSONL files, by level and split."""

    name: ClassVar[str] = "gaia"
    family: ClassVar[str] = "qa"

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        given = path if path is not None else os.environ.get(ENV_VAR)
        self.path = Path(given) if given else None
        self._splits: dict[str, list[Question]] = {}

    def games(self) -> tuple[str, ...]:
        """``all`` and the three levels."""
        return LEVELS

    def default_games(self) -> tuple[str, ...]:
        """The three levels: ``all`` holds the same questions again."""
        return tuple(level for level in LEVELS if level != "all")

    def file_for(self, split: str) -> Path:
        """The JSONL file holding a split's questions."""
        if split not in SPLITS:
            raise BenchmarkError(f"gaia: split {split!r} is not one of {', '.join(SPLITS)}")
        if self.path is None:
            raise BenchmarkError(f"gaia: no questions configured; set {ENV_VAR} or pass path= "
                                 "(a JSONL file, or a folder with dev.jsonl / validation/metadata.jsonl)")
        if self.path.is_file():
            if split != "dev":
                raise BenchmarkError(f"gaia: {self.path} is one file, the dev split; no {split} split")
            return self.path
        candidates = [self.path / name for name in _LAYOUTS[split]]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        raise BenchmarkError(f"gaia: no {split} questions; looked for {', '.join(map(str, candidates))}")

    def questions(self, game: str, split: str) -> list[Question]:
        """A level's questions of a split, in file order."""
        if game not in LEVELS:
            raise BenchmarkError(f"gaia has no level {game!r}; levels: {', '.join(LEVELS)}")
        rows = self._splits.get(split)
        if rows is None:
            rows = self._splits[split] = read_questions(self.file_for(split))
        return rows if game == "all" else [q for q in rows if f"level{q.level}" == game]

    def task_ids(self, game: str, split: str, limit: int | None = None) -> list[TaskId]:
        """The first ``limit`` questions of the level."""
        return self.first_ids(game, split, len(self.questions(game, split)), limit)

    def make_task(self, task_id: TaskId) -> GaiaTask:
        """A task for one question."""
        self.check_own(task_id)
        rows = self.questions(task_id.game, task_id.split)
        if not 0 <= task_id.seed < len(rows):
            raise BenchmarkError(f"task {str(task_id)!r}: {task_id.game} of {task_id.split} has {len(rows)} questions")
        return GaiaTask(task_id, rows[task_id.seed])

