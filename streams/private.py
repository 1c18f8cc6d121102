"""Files only their owner may use: the data directory, ``nats/``, and every secret hx keeps there.

Like ssh's ``StrictModes``, hx refuses a private path that another user could have planted
or could change: a directory or file the current user does not own, or one that group or
others can write; a secret file must not be readable by them either, nor be a symbolic
link. A file planted in advance by another user (say ``nats/credentials.json``) would
otherwise be used as is, and its author would read and append to the log with it.

``check_private`` checks a path, ``read_private`` reads a secret after checking the very file
it opened (no window between check and read), ``write_private`` writes one mode 0600, and
``private_dir`` makes (or checks) a directory of the owner's.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> write_private(d / "key", b"secret")
>>> read_private(d / "key")
b'secret'
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from streams.errors import UnsafePath

SECRET_MODE = 0o600
DIR_MODE = 0o700


def _why(st: os.stat_result, *, secret: bool) -> tuple[str, str] | None:
    """What makes ``st`` unsafe to trust and how to fix it, or None."""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by you (uid {uid})", "remove it if you did not put it there"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if mode & bit)
        return f"writable by {who} (mode {mode:04o})", f"chmod {'600' if secret else 'go-w'} it"
    if secret and mode & 0o044:
        return f"readable by {'group' if mode & 0o040 else 'others'} (mode {mode:04o})", "chmod 600 it"
    return None


def _refuse(path: Path, why: str, fix: str) -> UnsafePath:
    return UnsafePath(f"refusing {path}: {why}; another user could have planted, changed or read it ({fix})")


def check_private(path: Path | str, *, secret: bool = True, what: str = "") -> None:
    """Raise ``UnsafePath`` naming ``path`` and why, unless it is ours and closed to others; a missing path passes.

    A directory must be owned by us and not writable by group or others. A file with
    ``secret`` (the default) must also be a regular file, not a symbolic link, and not
    readable by group or others; and the directory it is in passes the directory check
    (whoever can write there can swap the file).
    """
    path = Path(path)
    if secret:
        _check(path.parent, secret=False)
    _check(path, secret=secret, what=what)


def _check(path: Path, *, secret: bool, what: str = "") -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:  # a file where a directory should be, a folder we may not enter
        raise UnsafePath(f"cannot use {what + ' ' if what else ''}{path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        if secret:
            raise _refuse(path, "it is a symbolic link", "replace it with the file itself")
        try:
            st = os.stat(path)  # a data directory may be a link the user made: check what it points to
        except OSError as exc:
            raise UnsafePath(f"cannot check {path}: {exc.strerror or exc}") from None
    is_dir = stat.S_ISDIR(st.st_mode)
    if not is_dir and secret and not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "it is not a regular file", "remove it")
    found = _why(st, secret=secret and not is_dir)
    if found is not None:
        raise _refuse(path, *found)


def private_dir(path: Path | str, *, what: str = "") -> Path:
    """``path`` as a directory only its owner can change: made with mode 0700 if missing, else checked.

    Missing parents are made as the umask says; an existing directory is left as it is and
    refused (``UnsafePath``) if another user owns it or others can write it.
    """
    path = Path(path)
    check_private(path, secret=False, what=what)
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsafePath(f"cannot use {what + ' ' if what else ''}{path}: {exc.strerror or exc}") from None
    check_private(path, secret=False, what=what)  # made meanwhile by someone else: still ours only
    return path


def read_private(path: Path | str) -> bytes:
    """The bytes of secret file ``path``, checked as ``check_private`` does on the file actually opened.

    Raises ``FileNotFoundError`` when it does not exist, ``UnsafePath`` when it cannot be trusted.
    """
    path = Path(path)
    _check(path.parent, secret=False)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse(path, "it is a symbolic link", "replace it with the file itself") from None
        raise UnsafePath(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "it is not a regular file", "remove it")
        found = _why(st, secret=True)
        if found is not None:
            raise _refuse(path, *found)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_private(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by the owner only (mode 0600), replacing it whole and atomically.

    The directory it goes into is checked first (``check_private``), and so is a file it replaces.
    """
    path = Path(path)
    check_private(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, SECRET_MODE)
    try:
        os.fchmod(fd, SECRET_MODE)  # O_CREAT's mode only applies to a new file
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
