"""How HTTP model APIs say what went wrong: status codes and retry hints to ``ProviderError`` kinds."""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping

from hx.runtime.errors import ContextTooLong, ProviderError
from streams.redaction import scrub

CONTEXT_TOO_LONG = re.compile(
    r"prompt is too long|input is too long|context[ _]length|context window|context size|context limit|"
    r"maximum context",
    re.IGNORECASE,
)
"""Wording servers use when a request does not fit the context window (Anthropic, OpenAI, vLLM, llama.cpp)."""


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), if given."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify_status(status: int, message: str, headers: Mapping[str, str], secrets: tuple[str, ...],
                    where: str) -> ProviderError:
    """The ``ProviderError`` an HTTP error status stands for, with secrets removed from the message."""
    text = scrub(f"{where}: HTTP {status}: {message}", secrets)
    if status == 429:
        return ProviderError("rate_limit", text, retry_after=retry_after(headers))
    if status in (401, 403):
        return ProviderError("authentication", text)
    if status in (400, 413, 422) and CONTEXT_TOO_LONG.search(message):
        return ContextTooLong(text)
    if status == 408:
        return ProviderError("connection", text)
    if status >= 500:
        return ProviderError("server", text, retry_after=retry_after(headers))
    return ProviderError("other", text)
