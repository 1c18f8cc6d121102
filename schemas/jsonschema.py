"""Publish the JSON Schema of every event type to ``schemas/json/<type>.json``, and of the documents users write.

These files are the contract a consumer in another language decodes with; a test fails
when they and the Structs disagree. Regenerate with ``python -m schemas.jsonschema``.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

import schemas  # noqa: F401 - importing the package registers every event type
from schemas.event import event_types
from schemas.experiment import ExperimentSpec
from schemas.suite import GeneratedTasks, Suite

JSON_DIR = Path(__file__).parent / "json"


# Keys whose values are data (a default, an example), not schemas: a "description" inside them stays.
_DATA_KEYS = frozenset({"default", "const", "enum", "examples"})


def clean_descriptions(node: Any) -> Any:
    """The schema with every description in ``inspect.cleandoc`` form.

    Descriptions come from docstrings, and Python 3.13 strips a docstring's indentation when it
    compiles the class while 3.11 and 3.12 keep it; cleandoc gives one text on every interpreter.
    """
    if isinstance(node, dict):
        return {key: (inspect.cleandoc(value) if key == "description" and isinstance(value, str)
                      else value if key in _DATA_KEYS else clean_descriptions(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [clean_descriptions(item) for item in node]
    return node


def schema_of(name: str, cls: type[Any]) -> dict[str, Any]:
    """The JSON Schema of one event type, with its type name and version as metadata."""
    schema: dict[str, Any] = clean_descriptions(msgspec.json.schema(cls))
    schema["$id"] = f"https://hx.dev/schemas/{name}.json"
    schema["title"] = name
    schema["x-hx-type"] = name
    schema["x-hx-schema-version"] = cls.VERSION
    return schema


# Documents users write (not events): file stem -> Struct. Their schemas carry no event type or version.
DOCUMENTS: dict[str, type[Any]] = {"experiment-spec": ExperimentSpec, "suite": Suite, "generated-tasks": GeneratedTasks}


def document_schema(name: str, cls: type[Any]) -> dict[str, Any]:
    """The JSON Schema of a document a user writes (an experiment spec, a suite), as published."""
    schema: dict[str, Any] = clean_descriptions(msgspec.json.schema(cls))
    schema["$id"] = f"https://hx.dev/schemas/{name}.json"
    schema["title"] = name
    plain: dict[str, Any] = json.loads(json.dumps(schema))  # as a reader of the file sees it (tuples are lists)
    return plain


def _text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def render_all() -> dict[str, str]:
    """Every event type's and document's schema as canonical JSON text, keyed by file name."""
    rendered = {f"{name}.json": _text(schema_of(name, cls)) for name, cls in event_types().items()}
    rendered.update({f"{name}.json": _text(document_schema(name, cls)) for name, cls in DOCUMENTS.items()})
    return rendered


def write_all(directory: Path = JSON_DIR) -> list[Path]:
    """Write every schema file, removing ones for types that no longer exist."""
    directory.mkdir(parents=True, exist_ok=True)
    rendered = render_all()
    for stale in directory.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    paths = []
    for fname, text in rendered.items():
        path = directory / fname
        path.write_text(text)
        paths.append(path)
    return paths


if __name__ == "__main__":
    written = write_all()
    sys.stdout.write(f"wrote {len(written)} schemas to {JSON_DIR}\n")
