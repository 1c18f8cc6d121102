"""Reading a document a user writes (a suite, an experiment spec) from YAML, TOML or JSON, by its suffix.

One reader, so every document hx reads fails the same way: one line naming the file and what is
wrong with it, raised as the caller's own error type.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

from schemas.errors import HxError

FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
"""A document's suffix to its format."""


def read_document(path: Path, what: str, error: type[HxError]) -> Any:
    """The decoded content of ``path``; an unknown suffix, an unreadable file or bad syntax raises ``error``."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise error(f"{what} {path}: unknown suffix {path.suffix or '(none)'!r}; use .yaml, .yml, .toml or .json")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path}: not UTF-8 text") from None
    try:
        if fmt == "yaml":
            return yaml.safe_load(text)
        if fmt == "toml":
            return tomllib.loads(text)
        return json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(f"{what} {path}: not valid {fmt}: {first}") from None
