"""``hx export`` replaces only what an earlier ``hx export`` wrote: never the data dir, a folder around or in it,
the current or home directory, or a user's folder (a fake ``~/.ssh`` here), ``--force`` or not.

One real evolution run on the toyworld bench, on the embedded nats-server of a data dir that
sits in a user's working folder; every refusal leaves every file under the root byte for byte
as it was, and says why in one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import toyworld  # noqa: F401 - registers the toyworld benchmark with the in-process command
from click.testing import Result
from hx_cli import error_line, hx, ok

RUN = "export-target"


@dataclass(frozen=True)
class Place:
    """The root of the test's files, the user's home and working folder, and the data dir inside it."""

    root: Path
    home: Path
    work: Path
    data: Path

    def export(self, target: Path | str, *extra: str) -> Result:
        """``hx --data-dir DATA export RUN target *extra`` (the embedded server of the data dir)."""
        return hx("--data-dir", str(self.data), "export", RUN, str(target), *extra)


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    root = tmp_path_factory.mktemp("export-target")
    home = root / "home"
    work = home / "work"
    data = work / ".hx"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "plan.md").write_text("mine\n")
    ssh = home / ".ssh"
    ssh.mkdir()
    (ssh / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    (ssh / "known_hosts").write_text("example.org ssh-ed25519 AAAA\n")
    ok(hx("--data-dir", str(data), "evolve", "--bench", "toyworld:rooms", "--tasks", "4", "--heldout-tasks", "2",
          "--rounds", "1", "--max-steps", "20", "--seed", "3", "--run-id", RUN))
    assert (data / "nats" / "store").is_dir() and (data / "nats" / "credentials.json").is_file()
    yield Place(root, home, work, data)


def files(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``, by relative path."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


REFUSED: dict[str, tuple[Callable[[Place], Path], tuple[str, ...], str]] = {
    "the data dir": (lambda p: p.data, ("--force",), "it is hx's data dir"),
    "the data dir, no --force": (lambda p: p.data, (), "it is hx's data dir"),
    "a folder containing the data dir": (lambda p: p.work, ("--force",), "it contains hx's data dir"),
    "the root above it": (lambda p: p.root, ("--force",), "it contains hx's data dir"),
    "a folder of the data dir": (lambda p: p.data / "nats", ("--force",), "it is inside hx's data dir"),
    "a new folder in the data dir": (lambda p: p.data / "exports" / "x", (), "it is inside hx's data dir"),
    "a user's folder": (lambda p: p.home / ".ssh", (), "not an hx export"),
    "a user's folder, --force": (lambda p: p.home / ".ssh", ("--force",), "not an hx export"),
    "a folder of notes, --force": (lambda p: p.work / "notes", ("--force",), "not an hx export"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_target_is_left_as_it_was_with_one_line(place: Place, case: str) -> None:
    where, extra, reason = REFUSED[case]
    target = where(place)
    before = files(place.root)
    result = place.export(target, *extra)
    line = error_line(result)
    assert result.stderr.strip().splitlines() == [line]
    assert reason in line and str(target) in line, line
    assert files(place.root) == before  # the store, credentials, server config and keys: every byte kept


def test_a_forged_or_unreadable_marker_is_no_export(place: Place, tmp_path: Path) -> None:
    for text in ("", "yes, an export\n", json.dumps({"kind": "hx export", "run_id": RUN}) + "\n"):
        folder = tmp_path / f"f{len(text)}"
        folder.mkdir()
        (folder / ".hx-export").write_text(text)
        (folder / "mine.txt").write_text("keep me")
        before = files(tmp_path)
        assert "not an hx export" in error_line(place.export(folder, "--force"))
        assert files(tmp_path) == before


def test_the_current_and_home_directories_are_refused_even_with_a_marker(place: Place, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    marker = json.dumps({"kind": "hx export", "run_id": RUN, "hx_version": "0.1.0"}) + "\n"
    home, parent = tmp_path / "user", tmp_path / "projects"
    cwd = parent / "here"
    for folder in (home, parent, cwd):  # each looks like an earlier export: the rule alone refuses it
        folder.mkdir(parents=True)
        (folder / ".hx-export").write_text(marker)
        (folder / "mine.txt").write_text("keep me")
    before = files(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    for target, what in ((home, "the home directory"), (".", "the current directory"),
                         (parent, "the current directory")):
        assert f"it is {what} or one of its parents" in error_line(place.export(target, "--force"))
    assert files(tmp_path) == before


def test_an_earlier_export_is_replaced_only_with_force(place: Place, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok(place.export(out))
    marker = json.loads((out / ".hx-export").read_text())
    assert marker["kind"] == "hx export" and marker["run_id"] == RUN and marker["hx_version"]
    first = files(out)
    assert "INDEX.md" in first and "audit.jsonl" in first
    (out / "INDEX.md").write_text("edited by hand")
    line = error_line(place.export(out))
    assert f"{out} holds an earlier export (run {RUN}); pass --force to replace it" in line
    assert (out / "INDEX.md").read_text() == "edited by hand"
    ok(place.export(out, "--force"))
    assert files(out) == first  # the same ledger, the same bytes, the edit replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no scratch or replaced folder left behind
