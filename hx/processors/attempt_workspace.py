"""D5 ``attempt_workspace``: a fresh working directory for every attempt, removed when it ends.

Failure addressed: side effects leaking between attempts. When code-running tools share
one directory, a file written by attempt 1 (a cached answer, a half-written script, a
corrupted data file) is visible to attempt 2, so attempts are not independent samples,
pass@k is inflated or deflated, and a replay cannot reproduce what the agent saw.

How tools find the directory: the run loop awaits processors and tools inside the
attempt's own asyncio task, so the workspace is published as an attempt-scoped context
variable (``current_workspace()``), the way a process has a current directory. Attempts
run concurrently (``asyncio.gather``) each get their own copy of the context, so they
cannot see each other's workspace. The path never enters an event body (it is random),
which keeps logged bodies comparable on replay.

The root comes from the ``root`` parameter (a processor does not see the harness slots;
pass ``Slots.workspace`` here when one is configured); empty means the system temporary
directory.
"""

from __future__ import annotations

import contextvars
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import ClassVar

from hx.harness.processor import PRE, Processor
from schemas.hooks import TaskEnd, TaskStart

_CURRENT: contextvars.ContextVar[Path | None] = contextvars.ContextVar("hx_attempt_workspace", default=None)


def current_workspace() -> Path | None:
    """The workspace directory of the attempt running in this context, if a processor opened one."""
    return _CURRENT.get()


def _safe_prefix(task_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id)[:48].strip("._") or "task"


def _relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"files: {path!r} must be a relative path inside the workspace")
    return rel


class AttemptWorkspace(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Open a private directory at task_start, publish it to tools, remove it at task_end."""

    name: ClassVar[str] = "attempt_workspace"
    _order: ClassVar[int] = PRE
    dimension: ClassVar[str] = "D5"

    root: str = ""
    """Parent of the per-attempt directories; empty means the system temporary directory."""
    keep_failed: bool = False
    """Keep the directory of an attempt that did not pass, for inspection."""
    files: dict[str, str] = {}
    """Files written into every fresh workspace (relative path -> text), e.g. task fixtures."""

    def __post_init__(self) -> None:
        for path in self.files:
            _relative(path)
        self._path: Path | None = None

    @property
    def path(self) -> Path | None:
        """This attempt's directory while it exists."""
        return self._path

    async def process(self, event: TaskStart | TaskEnd) -> AsyncIterator[TaskStart | TaskEnd]:
        """Create the workspace at task_start; clean it up at task_end. Events pass unchanged."""
        if isinstance(event, TaskStart):
            self._open(event.task.id)
        else:
            self._close(keep=self.keep_failed and not event.passed)
        yield event

    def _open(self, task_id: str) -> None:
        if self._path is not None:  # a second task_start in one attempt: start clean
            self._close(keep=False)
        root = Path(self.root) if self.root else Path(tempfile.gettempdir())
        root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"{_safe_prefix(task_id)}-", dir=root))
        for rel, text in self.files.items():
            target = path / _relative(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        self._path = path
        _CURRENT.set(path)

    def _close(self, *, keep: bool) -> None:
        if self._path is not None and not keep:
            shutil.rmtree(self._path, ignore_errors=True)
        self._path = None
        _CURRENT.set(None)
