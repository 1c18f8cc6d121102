"""A ledger's signed head: what an auditor keeps, and a later check that the ledger still reaches it.

A chain proves order, not that nothing was rewritten: whoever holds the signing key (root on
the host, say) can rewrite a ledger and sign it anew. What they cannot do is make the new
ledger reach a head an auditor kept elsewhere: the digest of event N, signed by the run's key.
``hx audit head RUN`` prints that head as one JSON line; ``hx audit verify RUN --head HEAD``
checks that the ledger holds exactly that event at that position, signed by the same key (a
ledger cut before it, or different at it, does not reach it).

>>> head = SignedHead(run="r", position=3, type="ledger.round_decided", digest="sha256:ab", signature="", key="")
>>> parse_head(head.line()) == head
True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from hx.replay.errors import AuditError
from hx.replay.ledger_checks import Problem
from projections.ledger import RunLedger
from projections.ledger_records import LedgerEntry
from schemas.ledger import ledger_digest
from streams.signing import fingerprint, verify


class SignedHead(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The last event of a run's ledger as an auditor keeps it."""

    run: str
    position: int
    type: str
    digest: str
    """``ledger_digest`` of the event at ``position``: it covers every event before it, through the chain."""
    signature: str
    """The event's own signature over ``digest`` (empty for an unsigned ledger)."""
    key: str
    """The key the run's ledger is signed with (empty: unsigned)."""
    fingerprint: str = ""

    def line(self) -> str:
        """The head as one JSON line."""
        return msgspec.json.encode(self).decode()


def head_of(ledger: RunLedger) -> SignedHead:
    """The signed head of a run's ledger (its last event)."""
    last = ledger.entries[-1]
    key = ledger.opened.public_key if ledger.opened is not None else ""
    return SignedHead(run=ledger.run_id, position=last.position, type=last.type, digest=ledger_digest(last.event),
                      signature=last.event.signature, key=key, fingerprint=fingerprint(key) if key else "")


def parse_head(text: str) -> SignedHead:
    """A head given on the command line: its JSON line, or a file holding it; ``AuditError`` naming what is wrong."""
    raw = text.strip()
    if not raw.startswith("{"):
        path = Path(raw)
        try:
            raw = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditError(f"--head {text!r} is neither a head's JSON line (hx audit head prints it) nor a "
                             f"readable file: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return msgspec.json.decode(raw, type=SignedHead)
    except msgspec.DecodeError as exc:
        raise AuditError(f"--head is not a ledger head as hx audit head prints it: {exc}") from None


def check_head(entries: Sequence[LedgerEntry], key: str, head: SignedHead) -> list[Problem]:
    """Why the ledger does not reach ``head`` (none when it holds that very event, signed by the same key)."""
    at = head.position
    if head.key != key:
        theirs = fingerprint(head.key) if head.key else "none"
        ours = fingerprint(key) if key else "none"
        return [Problem("head", f"the head was signed by key {theirs}; this ledger's key is {ours}: another "
                                "writer's ledger", at)]
    if key:
        why = verify(key, head.digest, head.signature)
        if why:
            return [Problem("head", f"the head's own signature is not good: {why}", at)]
    entry = next((e for e in entries if e.position == at), None)
    if entry is None:
        last = entries[-1].position if entries else 0
        return [Problem("head", f"the ledger ends at event {last}, before the kept head (event {at}, {head.type}): "
                                "events were cut from its end", at)]
    digest = ledger_digest(entry.event)
    if digest != head.digest:
        return [Problem("head", f"{entry.label} hashes to {digest[:19]}..., the kept head says {head.digest[:19]}... "
                                f"({head.type}): the ledger was rewritten up to there", at)]
    return []
