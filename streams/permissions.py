"""Who may do what on hx's NATS: the writer and the read-only auditor, and how a refusal reaches the user.

The embedded server has two users (``streams.server``); an external server or cluster is
configured the same way by hand (docs/streams.md, "Users and permissions"):

- the **writer** (every hx command but ``hx audit`` and ``hx ledger``) may publish and
  subscribe everywhere except the JetStream API requests that remove or rewrite messages of
  the ledger and of the trace it cites: deleting, purging or restoring ``HX_LEDGER`` or
  ``HX_TRACE``, deleting one of their messages, updating their configuration (a limit would
  evict events, rollups or per-message TTLs would delete them), moving their replicas away;
- the **auditor** may read every stream (stream info, direct and stored-message gets) and
  publish nothing a stream captures; it may create no consumer either (a push consumer can
  deliver one stream into another's subjects), so it reads with batched direct gets
  (``streams.direct``).

nats-py shows a permission violation only as a timeout of the request that caused it, and
passes the server's words to the connection's error callback. ``Refusals`` keeps those
words, so the error the user sees names the violation instead of "timeout".

>>> r = Refusals("auditor")
>>> r.add('nats: permissions violation for publish to "hx.ledger.x"')
True
>>> print(r.get("hx.ledger.x"))
NATS refused user 'auditor' to publish to "hx.ledger.x" (a permissions violation; see docs/streams.md)
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streams.errors import PermissionDenied, ServerError
from streams.private import read_private, write_private
from streams.redaction import register
from streams.topology import LEDGER, TRACE

WRITER_USER = "hx"
AUDITOR_USER = "auditor"

PROTECTED = (LEDGER.name, TRACE.name)
"""The streams nobody may delete from: the ledger, and the trace its verdicts cite."""
_REMOVING = ("STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE", "STREAM.UPDATE", "STREAM.RESTORE",
             "STREAM.PEER.REMOVE")
WRITER_DENIED: tuple[str, ...] = (*(f"$JS.API.{api}.{stream}" for stream in PROTECTED for api in _REMOVING),
                                  "$JS.API.ACCOUNT.PURGE.>")
"""What the writer may not publish: the JetStream API requests that would remove or rewrite those streams' messages."""

AUDITOR_PUBLISH: tuple[str, ...] = (
    "$JS.API.INFO", "$JS.API.STREAM.INFO.>", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.MSG.GET.>", "$JS.API.DIRECT.GET.>",
)
"""All the auditor may publish: read requests. No consumer: a push consumer could deliver one stream into another
(``streams.direct``), so it reads with batched direct gets."""
AUDITOR_SUBSCRIBE: tuple[str, ...] = ("_INBOX.>",)
"""Replies, direct gets' batches included, come to inboxes."""


@dataclass(frozen=True)
class User:
    """A NATS user of the embedded server: name and password (never shown)."""

    name: str
    password: str = field(repr=False)


def user_file(path: Path, name: str) -> User:
    """The user whose name and password ``path`` holds, made with a new password on first use (mode 0600).

    The password becomes a registered secret; a file another user could have planted is
    refused (``streams.private``).
    """
    try:
        data = json.loads(read_private(path))
        user = User(str(data["user"]), str(data["password"]))
    except FileNotFoundError:
        user = User(name, secrets.token_urlsafe(32))
        write_private(path, json.dumps({"user": user.name, "password": user.password}).encode())
    except (ValueError, KeyError, TypeError) as exc:
        raise ServerError(f"cannot read the server credentials {path}: {exc}; remove the file while no hx "
                          "process uses this data directory to make new ones") from None
    register(user.password)
    return user


def _list(subjects: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(s) for s in subjects) + "]"


def authorization(writer: User, auditor: User) -> str:
    """The ``authorization`` block of a nats-server configuration giving ``writer`` and ``auditor`` their rights."""
    def entry(user: User, permissions: str) -> str:
        return (f"    {{user: {json.dumps(user.name)}, password: {json.dumps(user.password)},\n"
                f"     permissions: {permissions}}}\n")
    def rights(publish: str, subscribe: Sequence[str]) -> str:
        return f"{{publish: {publish}, subscribe: {{allow: {_list(subscribe)}}}}}"
    writer_rights = rights(f"{{allow: [\">\"], deny: {_list(WRITER_DENIED)}}}", [">"])
    auditor_rights = rights(f"{{allow: {_list(AUDITOR_PUBLISH)}}}", AUDITOR_SUBSCRIBE)
    return ("authorization {\n  users: [\n" + entry(writer, writer_rights) + entry(auditor, auditor_rights)
            + "  ]\n}\n")


def config_digest(text: str) -> str:
    """The digest a server record keeps of the configuration it was started with (tells an outdated one)."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


_VIOLATION = re.compile(r"permissions violation for (publish|subscription) to \"?([^\"\s]+)\"?", re.I)


class Refusals:
    """The permission violations a server reported on one connection of ``user`` (None: not known)."""

    def __init__(self, user: str | None = None) -> None:
        self.user = user
        self._seen: dict[str, str] = {}
        """Subject (lower case: nats-py lowers the server's words) -> what was refused."""

    def add(self, message: str) -> bool:
        """Keep ``message`` if it reports a permission violation; True when it did."""
        found = _VIOLATION.search(message)
        if found is None:
            return False
        action = "publish" if found.group(1).lower() == "publish" else "subscribe"
        self._seen.setdefault(found.group(2).lower(), action)
        return True

    def get(self, subject: str) -> PermissionDenied | None:
        """The refusal of ``subject``, if the server reported one."""
        action = self._seen.get(subject.lower())
        return None if action is None else self._denied(action, subject)

    def first(self) -> PermissionDenied | None:
        """The first refusal reported on the connection, if any."""
        return next((self._denied(action, subject) for subject, action in self._seen.items()), None)

    def _denied(self, action: str, subject: str) -> PermissionDenied:
        who = f"user {self.user!r}" if self.user else "this connection's user"
        return PermissionDenied(f"NATS refused {who} to {action} to \"{subject}\" (a permissions violation; "
                                "see docs/streams.md)")
