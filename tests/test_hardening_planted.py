"""Files another user planted or could change are refused, like ssh's StrictModes: the data dir, ``nats/``, secrets.

The tests run as root (here and in CI): ``os.chown(path, 65534, 65534)`` plants a file "owned by
another user", and chmod g+w / o+w makes one others can change.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hx_cli import error_line, hx

from streams.errors import UnsafePath
from streams.private import check_private, private_dir, read_private, write_private
from streams.processes import process_args
from streams.server import EmbeddedServer

OTHER = 65534
"""nobody: the uid of "another user"."""
NOT_YOURS = f"owned by uid {OTHER}, not by you (uid {os.geteuid()})"


def planted_data_dir(root: Path) -> Path:
    """A data dir as another user might prepare it: the writer's credentials already there (mode 0600)."""
    data = root / "data"
    (data / "nats").mkdir(parents=True)
    for d in (data, data / "nats"):
        os.chmod(d, 0o700)
    creds = data / "nats" / "credentials.json"
    creds.write_text(json.dumps({"user": "hx", "password": "planted-by-someone-else"}))
    os.chmod(creds, 0o600)
    return data


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under ``root``: mode, owner, size, modification time."""
    out = {}
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns)
    return out


def servers_on(store: Path) -> list[int]:
    """Pids of nats-servers started on ``store``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            args = process_args(int(entry.name)) or []
            if args and Path(args[0]).name == "nats-server" and str(store) in args:
                found.append(int(entry.name))
    return found


def chown(path: Path) -> None:
    os.chown(path, OTHER, OTHER, follow_symlinks=False)


def chmod(mode: int) -> Callable[[Path], None]:
    return lambda path: os.chmod(path, mode)


def symlink(path: Path) -> None:
    target = path.with_name("elsewhere.json")
    path.rename(target)
    path.symlink_to(target)


def planted_file(text: str) -> Callable[[Path], None]:
    def plant(path: Path) -> None:
        path.write_text(text)
        os.chmod(path, 0o600)
        chown(path)
    return plant


CASES = [  # (what is touched, how, what the error line says)
    (".", chown, NOT_YOURS),
    (".", chmod(0o770), "writable by group (mode 0770)"),
    (".", chmod(0o707), "writable by others (mode 0707)"),
    ("nats", chown, NOT_YOURS),
    ("nats", chmod(0o720), "writable by group (mode 0720)"),
    ("nats/credentials.json", chown, NOT_YOURS),
    ("nats/credentials.json", chmod(0o602), "writable by others (mode 0602)"),
    ("nats/credentials.json", chmod(0o640), "readable by group (mode 0640)"),
    ("nats/credentials.json", symlink, "it is a symbolic link"),
    ("nats/auditor.json", planted_file('{"user": "auditor", "password": "planted-auditor"}'), NOT_YOURS),
    ("nats/server.conf", planted_file("authorization {}\n"), NOT_YOURS),
    ("nats/server.json", planted_file('{"pid": 1, "host": "127.0.0.1", "port": 4222}'), NOT_YOURS),
]


@pytest.mark.parametrize(("where", "how", "why"), CASES, ids=[f"{w}-{y.split(' (')[0]}" for w, _, y in CASES])
def test_a_planted_or_open_path_is_refused_in_one_line_and_nothing_is_written_or_started(
        tmp_path: Path, where: str, how: Callable[[Path], None], why: str) -> None:
    data = planted_data_dir(tmp_path)
    target = data / where
    how(target)
    before = snapshot(tmp_path)
    for args in (("log", "dump"), ("audit", "verify", "some-run"), ("server",)):
        line = error_line(hx("--data-dir", str(data), *args))
        shown = data if where == "." else target
        assert line.startswith(f"error: refusing {shown}: {why}; another user could have planted"), line
    assert snapshot(tmp_path) == before  # nothing written
    assert not servers_on(data / "nats" / "store")  # nothing started


def test_the_library_refuses_planted_credentials_too(tmp_path: Path) -> None:
    data = planted_data_dir(tmp_path)
    chown(data / "nats" / "credentials.json")
    with pytest.raises(UnsafePath, match=f"credentials.json: owned by uid {OTHER}"):
        EmbeddedServer(data).acquire()
    with pytest.raises(UnsafePath, match=f"credentials.json: owned by uid {OTHER}"):
        EmbeddedServer(data).credentials()
    assert not (data / "nats" / "server.conf").exists()


# --- the functions other secrets use ------------------------------------------------------

def test_write_private_makes_an_owner_only_file_and_read_private_reads_it(tmp_path: Path) -> None:
    keys = private_dir(tmp_path / "data" / "keys")
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    key = keys / "ledger.key"
    write_private(key, b"first")
    write_private(key, b"second, replaced whole")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and read_private(key) == b"second, replaced whole"
    check_private(key)
    check_private(tmp_path / "missing")  # nothing there: nothing planted
    with pytest.raises(FileNotFoundError):
        read_private(tmp_path / "missing")
    assert [p.name for p in keys.iterdir()] == ["ledger.key"]  # no temporary file left


@pytest.mark.parametrize("plant", ["owner", "mode", "dir"])
def test_a_private_file_someone_else_could_have_written_is_refused(tmp_path: Path, plant: str) -> None:
    keys = private_dir(tmp_path / "keys")
    key = keys / "ledger.key"
    write_private(key, b"secret")
    if plant == "owner":
        chown(key)
    elif plant == "mode":
        os.chmod(key, 0o620)
    else:
        chown(keys)
    for check in (check_private, read_private, lambda p: write_private(p, b"replaced")):
        with pytest.raises(UnsafePath, match=r"refusing .*(owned by uid 65534|writable by group)"):
            check(key)
    if plant != "dir":
        os.chown(key, 0, 0)
        os.chmod(key, 0o600)
    assert plant == "dir" or read_private(key) == b"secret"
