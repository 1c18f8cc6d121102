"""Strict parsing of a meta-model's JSON reply, with errors that say what is wrong and where.

A reply is one JSON object, either the whole text or the content of a fenced block
(```` ```json ````). It is converted with msgspec into wire types whose operations are the
ledger's own edit operations, so an unknown op, a missing field, an unknown key or a
wrong type is an ``EvolverReplyError`` naming its place: ``candidates[1].operations[0]:
unknown op 'append'``.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from hx.aegis.errors import EvolverReplyError
from schemas.edits import AcceptedRegression, AnyEditOp, CapabilityEvidence

T = TypeVar("T")
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)```", re.S)
_AT = re.compile(r"(.*) - at `\$(.*)`", re.S)
_OPS = "attach, replace, remove, reparam"


class WireCode(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A new module as the model writes it."""

    name: str
    source: str


class WireManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A manifest as the model writes it (evidence anchors are hx's to fill)."""

    intended_effect: str
    categories: tuple[str, ...] = ()
    predicted_flips: tuple[str, ...] = ()
    at_risk: tuple[str, ...] = ()
    attribution: str = ""
    capability_evidence: tuple[CapabilityEvidence, ...] = ()
    stabilise: tuple[str, ...] = ()
    expected_min_calls: int = 0
    accepted_regressions: tuple[AcceptedRegression, ...] = ()


class WireCandidate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One candidate as the model writes it."""

    variant: str
    operations: tuple[AnyEditOp, ...]
    manifest: WireManifest
    code: tuple[WireCode, ...] = ()


class WireReply(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The evolver's reply."""

    candidates: tuple[WireCandidate, ...]


def json_object(text: str) -> dict[str, Any]:
    """The JSON object of a reply: the whole text, or the first fenced block's content."""
    body = text.strip()
    if not body.startswith("{"):
        match = _FENCE.search(text)
        if match is None:
            raise EvolverReplyError("reply: not a JSON object (nor one inside a ```json fence)"
                                    + (f": {body[:80]!r}" if body else ": empty"))
        body = match.group(1).strip()
    try:
        value = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise EvolverReplyError(f"reply: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise EvolverReplyError(f"reply: expected a JSON object, got {type(value).__name__}")
    return value


def _located(message: str) -> str:
    """A msgspec validation message as ``place: problem`` (``$.a[0].b`` becomes ``a[0].b``)."""
    match = _AT.fullmatch(message)
    problem, path = (match.group(1), match.group(2).lstrip(".")) if match else (message, "")
    if (path == "op" or path.endswith(".op")) and problem.startswith("Invalid value "):
        where = path[:-3].rstrip(".") or "reply"
        return f"{where}: unknown op {problem.removeprefix('Invalid value ')}; ops: {_OPS}"
    problem = problem[:1].lower() + problem[1:]
    return f"{path or 'reply'}: {problem}"


def convert(value: Any, kind: type[T]) -> T:
    """``value`` as ``kind``, or ``EvolverReplyError`` naming where it does not fit."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise EvolverReplyError(_located(str(exc))) from None


def parse(text: str, kind: type[T]) -> T:
    """Parse a reply's JSON object strictly into ``kind``."""
    return convert(json_object(text), kind)
