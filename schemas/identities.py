"""Identities that travel between stages: a trained policy's version, and the model spec that loads it.

On the wire they stay strings (an event field of type ``PolicyVersion`` encodes as ``str``); in
code they keep their type from where they are made (``hx.learner.checkpoint.version``) to where
they are printed, and the spec ``policy:<version>`` is made and read here only.

>>> v = PolicyVersion("3f9a0c1d" * 8)
>>> policy_spec(v)[:15], policy_version(policy_spec(v)) == v, short(v)
('policy:3f9a0c1d', True, '3f9a0c1d3f9a')
>>> policy_version("policy:lm"), policy_version("anthropic:claude-sonnet-4-6")
(None, None)
"""

from __future__ import annotations

import re
from typing import NewType

PolicyVersion = NewType("PolicyVersion", str)
"""A trained policy's version: sha256 hex over its checkpoint's files (a prefix of 8 or more hex digits names it
to the ``policy:`` provider, which resolves it against the object store)."""

NO_VERSION = PolicyVersion("")
"""No policy yet (a learner before it opened)."""

POLICY_SCHEME = "policy"
"""The provider scheme of the trainable policy."""

_PREFIX = POLICY_SCHEME + ":"
_HEX = re.compile(r"[0-9a-f]{8,64}")
SHORT = 12
"""Hex digits of a version shown where a full one would not fit (labels, candidate names)."""


def is_version(text: str) -> bool:
    """Whether ``text`` is a policy version or a prefix of one (8 to 64 hex digits)."""
    return _HEX.fullmatch(text) is not None


def policy_spec(version: PolicyVersion) -> str:
    """The model spec that loads ``version``: ``policy:<version>``."""
    return _PREFIX + version


def fresh_policy_spec(kind: str) -> str:
    """The model spec of a freshly initialised policy of ``kind`` (``policy:lm``, ``policy:scorer``)."""
    return _PREFIX + kind


def is_policy(spec: str) -> bool:
    """Whether a model spec names the trainable policy (any form: a kind, a version, a directory)."""
    return spec.startswith(_PREFIX)


def policy_version(spec: str) -> PolicyVersion | None:
    """The version a ``policy:<version>`` spec names; None for another provider, a kind or a directory."""
    rest = spec.removeprefix(_PREFIX)
    return PolicyVersion(rest) if rest != spec and is_version(rest) else None


def short(version: PolicyVersion) -> PolicyVersion:
    """The first ``SHORT`` hex digits: still a version prefix the ``policy:`` provider resolves."""
    return PolicyVersion(version[:SHORT])
