"""Logging for hx: structlog to stderr, a human console format by default, JSON lines on request.

Library code logs through ``structlog.get_logger("hx.<area>")``; the command line calls
``configure_logging`` once per invocation. Standard-library loggers (nats-py's) are routed
through the same renderer so every line on stderr has one shape.

>>> configure_logging(json=True, level="WARNING")
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from streams.redaction import scrub

_HANDLER_NAME = "hx"


class _StderrLoggerFactory:
    """Loggers writing to ``sys.stderr`` as it is when they are made (test runners swap the stream)."""

    def __call__(self, *args: Any) -> structlog.PrintLogger:
        """A print logger on the current stderr."""
        return structlog.PrintLogger(sys.stderr)


def _scrubbed(logger: Any, method: str, rendered: Any) -> Any:
    """The last processor: a rendered line with every secret masked (``streams.redaction``)."""
    return scrub(rendered) if isinstance(rendered, str) else rendered


_PY4J = f"{os.sep}py4j{os.sep}"


def _not_py4j(record: logging.LogRecord) -> bool:
    """Drop py4j's records: it logs a traceback on the *root* logger whenever a game JVM goes away
    (``logging.info(..., exc_info=True)``), which hx reports as its own error instead."""
    return _PY4J not in record.pathname


def _level(level: int | str) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {level!r}")
    return value


def configure_logging(json: bool = False, level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Send hx's logs to stderr (or ``stream``) at ``level``: console format, or JSON lines if ``json``."""
    lvl = _level(level)
    out = stream if stream is not None else sys.stderr
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    if json:
        renderer = structlog.processors.JSONRenderer()
        tail: list[Processor] = [structlog.processors.dict_tracebacks, renderer, _scrubbed]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
        tail = [renderer, _scrubbed]
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), *tail],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=(structlog.PrintLoggerFactory(out) if stream is not None else _StderrLoggerFactory()),
        # Not cached: a cached logger would keep writing to a stream that was swapped since.
        cache_logger_on_first_use=False,
    )

    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    if lvl > logging.DEBUG:
        handler.addFilter(_not_py4j)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)
    # nats-py logs every failed (re)connect with a traceback; hx reports those failures as
    # its own errors, so the client's log is only shown when debugging.
    logging.getLogger("nats").setLevel(lvl if lvl <= logging.DEBUG else logging.CRITICAL)
    # py4j (the TextWorldExpress and ScienceWorld gateways) announces every callback server at INFO, and
    # the HTTP clients of the model providers every request: the log has the calls, stderr needs not.
    for chatty in ("py4j", "httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(chatty).setLevel(lvl if lvl <= logging.DEBUG else logging.WARNING)
