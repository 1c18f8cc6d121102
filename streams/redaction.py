"""Secrets: credentials that must never reach the log, a trace, a report or an error message.

One redaction, ``scrub``, masks three kinds of secret wherever text is built for the outside:

- credentials inside a URL (``scheme://user:password@host``), whatever their length;
- the value of a query (or fragment) parameter whose name says it is a secret: it ends in
  key, token, secret, password, passwd, pass, pwd, auth, authorization, credential(s),
  signature, sig or jwt, in any case (``api_key``, ``apikey``, ``X-Api-Key``,
  ``access_token``, ``client_secret``, ``X-Amz-Signature``, ...), whatever its length;
- secret *values*: the API keys and NATS credentials of the usual environment variables,
  and every value registered with ``register`` (a password or key found in a model URL,
  the embedded server's generated password, an API key given as an option).

The event log applies it as a last line of defence (``scrub_body``): an encoded event that
contains a secret is decoded, scrubbed and encoded again before it is sent, so a provider
that echoes a key back, or a spec that slipped through unredacted, still never lands on the
log. The check is a few byte searches per message, so the run loop pays nothing measurable.

>>> scrub("openai:m@http://me:hunter2-hunter2@10.0.0.5:8000/v1 failed")
'openai:m@http://***@10.0.0.5:8000/v1 failed'
>>> scrub("openai:m@http://10.0.0.5/v1?api-version=2&X-Api-Key=k3y")
'openai:m@http://10.0.0.5/v1?api-version=2&X-Api-Key=***'
>>> register("sk-test-0123456789")
>>> scrub("key sk-test-0123456789 was refused")
'key *** was refused'
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any, TypeVar, cast
from urllib.parse import unquote, urlsplit

import msgspec

from schemas.envelope import decode_body, encode_body
from schemas.event import Event

E = TypeVar("E", bound=Event)
MASK = "***"
MIN_SECRET_LENGTH = 8
"""Shorter values are not masked as free text (they would mask ordinary words); in a URL they still are."""
SECRET_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "HX_OPENAI_API_KEY",
              "HX_NATS_PASSWORD", "HX_NATS_TOKEN", "HX_NATS_AUDITOR_PASSWORD")
"""Environment variables whose values are secrets."""

# scheme://userinfo@ : userinfo runs to the last '@' before the path (a password may hold an '@').
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s\"'<>]*@")
_URL_USERINFO_BYTES = re.compile(rb"://[^/?#\s\"'<>]*@")  # a literal start: the engine's fast search finds it
_SECRET_NAME_ENDS = ("key", "token", "secret", "password", "passwd", "pass", "pwd", "auth", "authorization",
                     "credential", "credentials", "signature", "sig", "jwt")
"""How a query parameter's name ends when its value is a secret (compared in lower case)."""
_ENDS = "|".join(sorted(_SECRET_NAME_ENDS, key=len, reverse=True))
# [?&;#]name=value: the name runs to its '=', the value to the next '&', '#', space or quote, less
# the punctuation of the sentence around it ("...?key=***: refused" stays readable, masking is idempotent).
# ASCII case folding, as the byte search below does (str's would also fold the Kelvin sign to 'k').
_QUERY_SECRET = re.compile(rf"([?&;#][^=&;#?\s\"'<>]*?(?:{_ENDS})=)[^&#\s\"'<>]+?(?=[:,;.!?)\]]*(?:[&#\s\"'<>]|$))",
                           re.IGNORECASE | re.ASCII)
# An '=' that ends such a name: the pattern starts with the literal '=' (rare in event bodies: a few
# hundred in megabytes of trace), which the engine finds fast, then looks behind it for a name's end.
_QUERY_SECRET_BYTES = re.compile(b"=(?:" + b"|".join(b"(?<=" + n.encode() + b"=)" for n in _SECRET_NAME_ENDS) + b")",
                                 re.IGNORECASE)
_AT, _EQUALS = ord("@"), ord("=")
_registered: set[str] = set()
_lock = threading.Lock()
_decoder = msgspec.msgpack.Decoder()
_encoder = msgspec.msgpack.Encoder(order="deterministic")


def register(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (values shorter than ``MIN_SECRET_LENGTH`` are ignored)."""
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _registered.add(value)


def secret_name(name: str) -> bool:
    """True when a query parameter's name says its value is a secret (``api_key``, ``X-Api-Key``, ``token``, ...)."""
    return name.lower().endswith(_SECRET_NAME_ENDS)


def register_url(url: str | None) -> None:
    """Register the password (and user:password) of a URL that carries credentials, and its secret query values."""
    if not url or ("@" not in url and "=" not in url):
        return
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    if parts.password:
        register(parts.password)
        register(unquote(parts.password))
        register(f"{parts.username or ''}:{parts.password}")
    for part in (parts.query, parts.fragment):
        for raw in re.split(r"[&;]", part):
            name, sep, value = raw.partition("=")
            if sep and secret_name(unquote(name)):
                register(value)
                register(unquote(value.replace("+", " ")))


def secrets() -> tuple[str, ...]:
    """Every secret value known now: the registered ones and those of ``SECRET_ENV``, longest first."""
    found = {v for name in SECRET_ENV if len(v := os.environ.get(name, "")) >= MIN_SECRET_LENGTH}
    with _lock:
        found |= _registered
    return tuple(sorted(found, key=len, reverse=True))  # a secret inside a longer one: mask the longer first


def mask_url(url: str) -> str:
    """A URL (or ``user:pass@host:port`` with no scheme) with its credentials and secret query values masked."""
    if "://" in url:
        return _mask_credentials(url)
    if "@" in url:
        url = f"{MASK}@{url.rsplit('@', 1)[1]}"
    return _mask_query(url)


def _mask_query(text: str) -> str:
    if "=" not in text:
        return text
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)


def _mask_credentials(text: str) -> str:
    """``text`` with the credentials of every URL and every secret query value masked (``scrub`` less known values)."""
    if "@" in text and "://" in text:
        text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    return _mask_query(text)


def scrub(text: str, extra: tuple[str, ...] = ()) -> str:
    """``text`` with URL credentials, secret query values and every known secret (and ``extra`` ones) masked."""
    text = _mask_credentials(text)
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
    """True when an encoded body may hold URL credentials, a secret query value or one of the ``known`` secrets.

    A cheap over-approximation (a name ending in key before any '=' counts), never an
    under-approximation: what it lets through holds none of what ``scrub`` masks.
    """
    # An int's membership is one memchr, several times faster than a one-byte bytes' on a short body.
    if _AT in body and b"://" in body and _URL_USERINFO_BYTES.search(body) is not None:
        return True
    if _EQUALS in body and _QUERY_SECRET_BYTES.search(body) is not None:
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
    value = _decoder.decode(body)
    clean = scrub_value(value)
    return body if clean == value else _encoder.encode(clean)  # a false alarm keeps its bytes


def scrub_event(event: E) -> E:
    """``event`` with its secrets masked (the very object when it holds none), for a store that does not scrub."""
    body = encode_body(event)
    clean = scrub_body(body)
    return event if clean is body else cast(E, decode_body(type(event).TYPE, type(event).VERSION, clean))


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
