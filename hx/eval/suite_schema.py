"""Publish the JSON Schemas of the suite file and the generated-tasks file to ``schemas/json/``.

They are the contract an editor or an external task generator writes against; a test fails when
the files and the Structs of ``hx.eval.suite`` disagree. Regenerate with
``python -m hx.eval.suite_schema``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from hx.eval.suite import GeneratedTasks, Suite
from schemas.jsonschema import JSON_DIR, clean_descriptions

DOCUMENTS: dict[str, type[msgspec.Struct]] = {"suite.json": Suite, "generated-tasks.json": GeneratedTasks}
"""File name to the Struct whose schema it holds (``schemas.jsonschema.DOCUMENT_SCHEMAS`` names the same files)."""


def schema_of(fname: str, cls: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema of one document type, with its id and title."""
    schema: dict[str, Any] = clean_descriptions(msgspec.json.schema(cls))
    schema["$id"] = f"https://hx.dev/schemas/{fname}"
    schema["title"] = fname.removesuffix(".json")
    return schema


def render_schemas() -> dict[str, str]:
    """Each document schema as canonical JSON text, keyed by file name."""
    return {fname: json.dumps(schema_of(fname, cls), indent=2, sort_keys=True) + "\n"
            for fname, cls in DOCUMENTS.items()}


def write_schemas(directory: Path = JSON_DIR) -> list[Path]:
    """Write the document schemas."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for fname, text in render_schemas().items():
        path = directory / fname
        path.write_text(text)
        paths.append(path)
    return paths


if __name__ == "__main__":
    written = write_schemas()
    sys.stdout.write(f"wrote {len(written)} schemas to {JSON_DIR}\n")
