"""Where the log lives: the embedded server's data directory or an external NATS URL."""

from __future__ import annotations

import math
import os
import ssl
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from streams.errors import LogError
from streams.redaction import mask_url

DEFAULT_DATA_DIR = ".hx"


_ENV_FIELDS = {
    "HX_NATS_URL": "url", "HX_NATS_USER": "user", "HX_NATS_PASSWORD": "password", "HX_NATS_TOKEN": "token",
    "HX_NATS_CREDS": "creds_file", "HX_NATS_TLS_CA": "tls_ca", "HX_NATS_TLS_CERT": "tls_cert",
    "HX_NATS_TLS_KEY": "tls_key", "HX_NATS_AUDITOR_USER": "auditor_user",
    "HX_NATS_AUDITOR_PASSWORD": "auditor_password", "HX_NATS_AUDITOR_CREDS": "auditor_creds_file",
}
ENV_KEYS = (*_ENV_FIELDS, "HX_DATA_DIR", "HX_ACK_TIMEOUT")
"""Every environment variable ``NatsSettings.from_env`` reads."""


def _seconds(name: str, text: str) -> float:
    """A positive number of seconds from environment variable ``name``, or a ``LogError`` naming it."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and math.isfinite(value)):
        raise LogError(f"{name} must be a positive number of seconds, not {text!r}")
    return value


@dataclass(frozen=True)
class NatsSettings:
    """Connection settings, read from ``HX_*`` environment variables.

    With no ``url`` hx starts (or joins) an embedded nats-server under ``data_dir``.
    Secrets are kept out of ``repr`` so they never reach a log line or an error.
    """

    url: str | None = None
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    auditor_user: str | None = None
    """The read-only auditor's credentials on an external server (``hx audit``, ``hx ledger``); the embedded
    server's are in its data directory."""
    auditor_password: str | None = field(default=None, repr=False)
    auditor_creds_file: str | None = None
    ack_timeout: float = 5.0

    def __repr__(self) -> str:
        # A URL may carry user:password@ too; the generated repr would show it.
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if self.url is not None:
            shown["url"] = mask_url(self.url)
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> NatsSettings:
        """Build settings from ``HX_NATS_URL``, ``HX_DATA_DIR`` and the credential variables."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {field: env.get(key) or None for key, field in _ENV_FIELDS.items()}
        values["data_dir"] = Path(env.get("HX_DATA_DIR") or DEFAULT_DATA_DIR)
        if env.get("HX_ACK_TIMEOUT"):
            values["ack_timeout"] = _seconds("HX_ACK_TIMEOUT", env["HX_ACK_TIMEOUT"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values["data_dir"], str):
            values["data_dir"] = Path(values["data_dir"])
        return cls(**values)

    @property
    def embedded(self) -> bool:
        """True when hx runs its own nats-server instead of using ``url``."""
        return self.url is None

    @property
    def has_auditor(self) -> bool:
        """True when the environment gives the auditor's own credentials (an external server)."""
        return any(v is not None for v in (self.auditor_user, self.auditor_password, self.auditor_creds_file))

    def connect_options(self, *, auditor: bool = False) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` carrying credentials and TLS.

        With ``auditor`` the auditor's credentials replace the writer's when the environment
        gives them (``has_auditor``); otherwise the one user configured reads too.
        """
        opts: dict[str, Any] = {}
        mine = (self.auditor_user, self.auditor_password, None, self.auditor_creds_file) if (
            auditor and self.has_auditor) else (self.user, self.password, self.token, self.creds_file)
        for key, value in zip(("user", "password", "token", "user_credentials"), mine, strict=True):
            if value is not None:
                opts[key] = value
        if self.tls_ca or self.tls_cert:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            opts["tls"] = ctx
        return opts
