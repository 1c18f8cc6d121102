"""Small helpers shared by processors: user notes at before_model, glob lists, state keys, JSONL output."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import msgspec

from schemas.hooks import BeforeModel
from schemas.messages import Message

NoteMode = Literal["append", "edit"]
"""How a before_model note reaches the model: a new user message, or added to a trailing user message."""


def add_user_note(event: BeforeModel, text: str, mode: NoteMode = "append") -> BeforeModel:
    """``event`` with ``text`` shown to the model, within the before_model contract.

    ``append`` adds one user message; ``edit`` extends the last message's content when
    that message is the last user message (otherwise it appends, so a note never lands
    in the middle of the history).
    """
    messages = event.messages
    if mode == "edit" and messages and messages[-1].role == "user":
        last = messages[-1]
        edited = msgspec.structs.replace(last, content=f"{last.content}\n\n{text}" if last.content else text)
        return msgspec.structs.replace(event, messages=(*messages[:-1], edited))
    return msgspec.structs.replace(event, messages=(*messages, Message(role="user", content=text)))


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    """True when ``name`` matches one of the shell-style globs (case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def selected(name: str, allow: Iterable[str], deny: Iterable[str] = ()) -> bool:
    """True when ``name`` matches an ``allow`` glob (an empty ``allow`` admits every name) and no ``deny`` glob."""
    allow = tuple(allow)
    return (not allow or matches_any(name, allow)) and not matches_any(name, deny)


def compile_patterns(patterns: Iterable[str], what: str, flags: int = 0) -> tuple[re.Pattern[str], ...]:
    """Compile regular expressions, naming the parameter in the error (raised when a processor is built)."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, flags))
        except re.error as exc:
            raise ValueError(f"{what}: invalid regular expression {p!r}: {exc}") from None
    return tuple(out)


def state_key(text: str) -> str:
    """A short stable digest of a text (for remembering observations without storing them twice)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def append_lines(path: str | Path, lines: bytes) -> None:
    """Append encoded lines to ``path`` (its folder made if missing) in one write, so writers never interleave."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("ab") as fh:
        fh.write(lines)
