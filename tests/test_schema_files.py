"""The committed JSON Schemas are exactly what the Structs produce now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest

from schemas.event import event_types
from schemas.jsonschema import DOCUMENT_SCHEMAS, JSON_DIR, render_all, schema_of, write_all

REGENERATE = "run `python -m schemas.jsonschema` and commit schemas/json/"


def committed() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(JSON_DIR.glob("*.json"))
            if path.name not in DOCUMENT_SCHEMAS}  # the suite's document schemas: test_eval_suite_file


def test_json_dir_is_the_package_folder() -> None:
    assert Path(__file__).resolve().parents[1] / "schemas" / "json" == JSON_DIR
    assert JSON_DIR.is_dir()


def test_committed_schema_files_match_the_structs() -> None:
    rendered = render_all()
    files = committed()
    missing = sorted(set(rendered) - set(files))
    extra = sorted(set(files) - set(rendered))
    differing = sorted(name for name in set(rendered) & set(files) if rendered[name] != files[name])
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if extra:
        problems.append(f"no such event type any more: {', '.join(extra)}")
    if differing:
        problems.append(f"out of date: {', '.join(differing)}")
    assert not problems, f"schemas/json disagrees with the event Structs ({'; '.join(problems)}); {REGENERATE}"


def test_one_file_per_registered_type() -> None:
    assert sorted(committed()) == sorted(f"{name}.json" for name in event_types()), REGENERATE


@pytest.mark.parametrize("name", sorted(event_types()))
def test_schema_file_names_its_type_and_version(name: str) -> None:
    path = JSON_DIR / f"{name}.json"
    assert path.is_file(), f"{path.name} missing; {REGENERATE}"
    schema = json.loads(path.read_text())
    cls = event_types()[name]
    assert schema["x-hx-type"] == name == cls.TYPE, REGENERATE
    assert schema["x-hx-schema-version"] == cls.VERSION, REGENERATE
    assert schema["title"] == name
    assert schema["$id"] == f"https://hx.dev/schemas/{name}.json"
    # the top-level reference resolves to an object schema with the Struct's fields
    ref = schema["$ref"].rsplit("/", 1)[1]
    body = schema["$defs"][ref]
    assert body["type"] == "object"
    assert set(body["properties"]) == set(cls.__struct_fields__)
    assert body.get("additionalProperties") is False  # forbid_unknown_fields is part of the contract


def test_rendering_is_canonical() -> None:
    first = render_all()
    assert first == render_all()
    for name, text in first.items():
        assert text.endswith("\n")
        assert json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n" == text, name


def test_schema_of_adds_metadata() -> None:
    cls = event_types()["run.started"]
    schema = schema_of("run.started", cls)
    assert schema["x-hx-type"] == "run.started"
    assert schema["x-hx-schema-version"] == cls.VERSION


def test_write_all_regenerates_and_prunes(tmp_path: Path) -> None:
    stale = tmp_path / "gone.type.json"
    stale.write_text("{}")
    unrelated = tmp_path / "README.txt"
    unrelated.write_text("keep me")
    written = write_all(tmp_path)
    assert not stale.exists()
    assert unrelated.read_text() == "keep me"
    assert sorted(p.name for p in written) == sorted(render_all())
    assert {p.name: p.read_text() for p in tmp_path.glob("*.json")} == render_all()


class _Indented(msgspec.Struct):
    """One line.

    An indented paragraph, as 3.11 and 3.12 keep it and 3.13 strips it.
    """

    VERSION: ClassVar[int] = 1
    note: str = "kept"


def test_descriptions_are_the_same_whatever_the_interpreter_did_to_the_docstring() -> None:
    # Set the docstring both ways by hand, so this interpreter's compile-time stripping doesn't matter.
    expected = "One line.\n\nAn indented paragraph, as 3.11 and 3.12 keep it and 3.13 strips it."
    for doc in ("One line.\n\n    An indented paragraph, as 3.11 and 3.12 keep it and 3.13 strips it.\n    ",
                "One line.\n\nAn indented paragraph, as 3.11 and 3.12 keep it and 3.13 strips it.\n"):
        _Indented.__doc__ = doc
        schema = schema_of("test.indented", _Indented)
        assert schema["$defs"]["_Indented"]["description"] == expected


def test_write_all_keeps_the_document_schemas(tmp_path: Path) -> None:
    for name in DOCUMENT_SCHEMAS:  # hx.eval.suite_schema's files share the folder: not the event writer's to prune
        (tmp_path / name).write_text("{}")
    write_all(tmp_path)
    assert all((tmp_path / name).read_text() == "{}" for name in DOCUMENT_SCHEMAS)
