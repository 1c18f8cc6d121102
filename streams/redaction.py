"""Secrets: credentials that must never reach the log, a trace, a report or an error message.

One redaction, ``scrub``, masks two kinds of secret wherever text is built for the outside:

- credentials inside a URL (``scheme://user:password@host``), whatever their length;
- secret *values*: the API keys and NATS credentials of the usual environment variables,
  and every value registered with ``register`` (a password found in a model URL, the
  embedded server's generated password, an API key given as an option).

The event log applies it as a last line of defence (``scrub_body``): an encoded event that
contains a secret is decoded, scrubbed and encoded again before it is sent, so a provider
that echoes a key back, or a spec that slipped through unredacted, still never lands on the
log. The check is a byte search per message, so the run loop pays nothing measurable.

>>> scrub("openai:m@http://me:hunter2-hunter2@10.0.0.5:8000/v1 failed")
'openai:m@http://***@10.0.0.5:8000/v1 failed'
>>> register("sk-test-0123456789")
>>> scrub("key sk-test-0123456789 was refused")
'key *** was refused'
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

MASK = "***"
MIN_SECRET_LENGTH = 8
"""Shorter values are not masked as free text (they would mask ordinary words); in a URL they still are."""
SECRET_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "HX_OPENAI_API_KEY",
              "HX_NATS_PASSWORD", "HX_NATS_TOKEN", "HX_NATS_AUDITOR_PASSWORD")
"""Environment variables whose values are secrets."""

# scheme://userinfo@ : userinfo runs to the last '@' before the path (a password may hold an '@').
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s\"'<>]*@")
_URL_USERINFO_BYTES = re.compile(rb"://[^/?#\s\"'<>]*@")  # a literal start: the engine's fast search finds it
_registered: set[str] = set()
_lock = threading.Lock()
_decoder = msgspec.msgpack.Decoder()
_encoder = msgspec.msgpack.Encoder(order="deterministic")


def register(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (values shorter than ``MIN_SECRET_LENGTH`` are ignored)."""
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _registered.add(value)


def register_url(url: str | None) -> None:
    """Register the password (and user:password) of a URL that carries credentials."""
    if not url or "@" not in url:
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.password:
        register(parts.password)
        register(unquote(parts.password))
        register(f"{parts.username or ''}:{parts.password}")


def secrets() -> tuple[str, ...]:
    """Every secret value known now: the registered ones and those of ``SECRET_ENV``, longest first."""
    found = {v for name in SECRET_ENV if len(v := os.environ.get(name, "")) >= MIN_SECRET_LENGTH}
    with _lock:
        found |= _registered
    return tuple(sorted(found, key=len, reverse=True))  # a secret inside a longer one: mask the longer first


def mask_url(url: str) -> str:
    """A URL (or ``user:pass@host:port`` with no scheme) with its credentials masked."""
    if "://" in url:
        return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", url)
    if "@" in url:
        return f"{MASK}@{url.rsplit('@', 1)[1]}"
    return url


def scrub(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with URL credentials and every known secret (and ``extra`` ones) masked."""
    if "@" in text and "://" in text:
        text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    for secret in (*extra, *secrets()):
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_value(value: Any) -> Any:
    """A decoded structure (maps, lists, strings) with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_value(k): scrub_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_value(v) for v in value]
    return value


def needs_scrub(body: bytes, known: tuple[bytes, ...]) -> bool:
    """True when an encoded body holds URL credentials or one of the ``known`` secrets (as UTF-8)."""
    if b"://" in body and _URL_USERINFO_BYTES.search(body) is not None:
        return True
    return any(s in body for s in known)


def known_bytes() -> tuple[bytes, ...]:
    """The known secrets as UTF-8, for ``needs_scrub``."""
    return tuple(s.encode() for s in secrets())


def scrub_body(body: bytes, known: tuple[bytes, ...] | None = None) -> bytes:
    """A msgpack event body with its secrets masked; the same object when it holds none."""
    known = known_bytes() if known is None else known
    if not needs_scrub(body, known):
        return body
    return _encoder.encode(scrub_value(_decoder.decode(body)))


_SECRET_KEY = re.compile(r"(^|[_-])(api[_-]?key|key|secret|password|passwd|token|auth|authorization|"
                         r"credentials?|cookie)$", re.I)


def public(value: Any) -> Any:
    """``value`` with secret-looking keys masked and every string scrubbed of credentials (for ``RunStarted``)."""
    if isinstance(value, Mapping):
        return {scrub(str(k)): MASK if _SECRET_KEY.search(str(k)) else public(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [public(v) for v in value]
    if isinstance(value, str):
        return scrub(value)
    return value
