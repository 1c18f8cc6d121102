"""Signed ledger events: the writer's Ed25519 key in the data directory, and how a signature is checked.

Every event hx appends to a run's edit ledger carries ``signature``: an Ed25519 signature, by
the key of the data directory that wrote it, over the event's ``ledger_digest`` (which covers
its ``prev``, so a signature also vouches for the event's place in the chain). The public key
is recorded in the run's ``ledger.opened``. A process that can publish to ``HX_LEDGER`` but does
not hold the key cannot append an event that verifies; a copy of the ledger (``audit.jsonl``)
proves which key wrote it.

The private key lives in ``<data_dir>/keys/ledger.ed25519`` (PKCS#8 PEM, mode 0600, in a 0700
directory), made on first use; a key file or ``keys/`` directory another user owns or could change
is refused (``streams.private``). Whoever holds that file can sign as hx: keep it as private as the
NATS credentials beside it.

>>> key = LedgerKey.generate()
>>> verify(key.public_key, "sha256:00", key.sign("sha256:00"))
''
>>> verify(key.public_key, "sha256:01", key.sign("sha256:00"))
"the signature does not verify with the run's key"
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from streams.errors import SigningError
from streams.private import private_dir, read_private

ALGORITHM = "ed25519"
KEY_FILE = Path("keys") / "ledger.ed25519"
"""Where a data directory keeps its ledger signing key (relative to the data directory)."""
_CONTEXT = b"hx-ledger-event\0"
"""Signed before the digest: a signature made for a ledger event is good for nothing else."""


@dataclass(frozen=True)
class LedgerKey:
    """The Ed25519 key a data directory signs its ledger events with."""

    private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> LedgerKey:
        """A fresh key (kept in memory only)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def of(cls, data_dir: Path | str) -> LedgerKey:
        """The data directory's key, made (mode 0600) on first use."""
        path = Path(data_dir).resolve() / KEY_FILE
        private_dir(path.parent)  # refused when another user owns it or could plant a key in it
        try:
            data = read_private(path)
        except FileNotFoundError:
            key = cls.generate()
            if _create_private(path, key.private.private_bytes(serialization.Encoding.PEM,
                                                               serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption())):
                return key
            return cls.of(data_dir)  # another process made it first: use that one
        except OSError as exc:
            raise SigningError(f"cannot read the ledger signing key {path}: {exc.strerror or exc}") from None
        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise SigningError(f"{path} is not an Ed25519 private key in PEM: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise SigningError(f"{path} holds a {type(private).__name__}, not an Ed25519 key")
        return cls(private)

    @property
    def public_key(self) -> str:
        """``ed25519:<hex>`` of the raw public key, as ``ledger.opened`` records it."""
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return f"{ALGORITHM}:{raw.hex()}"

    def sign(self, digest: str) -> str:
        """``ed25519:<base64>``: the signature of a ledger event whose ``ledger_digest`` is ``digest``."""
        return f"{ALGORITHM}:{base64.b64encode(self.private.sign(_CONTEXT + digest.encode())).decode()}"


def _public(public_key: str) -> Ed25519PublicKey | None:
    algorithm, _, raw = public_key.partition(":")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(raw)) if algorithm == ALGORITHM else None
    except ValueError:
        return None


def verify(public_key: str, digest: str, signature: str) -> str:
    """Why ``signature`` is not ``public_key``'s over a ledger event with ``digest`` ("" when it is)."""
    key = _public(public_key)
    if key is None:
        return f"the run's key {public_key[:24]!r} is not an {ALGORITHM} public key"
    if not signature:
        return "it is not signed, though the run's ledger is"
    algorithm, _, encoded = signature.partition(":")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raw = b""
    if algorithm != ALGORITHM or len(raw) != 64:
        return f"its signature {signature[:24]!r} is not an {ALGORITHM} signature"
    try:
        key.verify(raw, _CONTEXT + digest.encode())
    except InvalidSignature:
        return "the signature does not verify with the run's key"
    return ""


def fingerprint(public_key: str) -> str:
    """A short name for a public key: the first 16 hex digits of its sha256 (what an auditor compares)."""
    return hashlib.sha256(public_key.encode()).hexdigest()[:16]


def _create_private(path: Path, data: bytes) -> bool:
    """Create ``path`` holding ``data``, readable by the owner only (in its private directory); False if it exists."""
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # whole or absent, and never over a key another process made meanwhile
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    except OSError as exc:
        raise SigningError(f"cannot write the ledger signing key {path}: {exc.strerror or exc}") from None
    return True
