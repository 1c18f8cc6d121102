"""What an edit is: the typed operations on a harness, the code and the claim a candidate brings."""

from __future__ import annotations

from typing import Any, Literal

from schemas.event import Payload

Bucket = Literal["prompt", "tools", "config", "processor"]
BUCKETS: tuple[Bucket, ...] = ("prompt", "tools", "config", "processor")


class Anchor(Payload, frozen=True, kw_only=True):
    """Evidence: a position on ``HX_TRACE`` (message sequence, index in its frame) and what it shows."""

    seq: int
    index: int = 0
    note: str = ""


class EditOp(Payload, frozen=True, kw_only=True, tag_field="op"):
    """A typed builder operation on a harness (base of the four kinds)."""


class Attach(EditOp, frozen=True, kw_only=True, tag="attach"):
    """Attach a library processor at some hooks."""

    processor: str
    hooks: tuple[str, ...]
    params: dict[str, Any] = {}


class Replace(EditOp, frozen=True, kw_only=True, tag="replace"):
    """Replace the processor of a singleton group (same hooks)."""

    group: str
    processor: str
    params: dict[str, Any] = {}


class Remove(EditOp, frozen=True, kw_only=True, tag="remove"):
    """Remove the processor of a singleton group."""

    group: str


class Reparam(EditOp, frozen=True, kw_only=True, tag="reparam"):
    """Change some parameters of the processor of a singleton group (the others keep their values)."""

    group: str
    params: dict[str, Any]


AnyEditOp = Attach | Replace | Remove | Reparam


class CodeAsset(Payload, frozen=True, kw_only=True):
    """New processor source a candidate brings: kept in the object store by content digest."""

    name: str
    """The module's file name."""
    digest: str
    """``sha256:`` of the source; the object-store key."""
    size: int
    processor: str
    """The registry name of the processor it defines."""


class Manifest(Payload, frozen=True, kw_only=True):
    """A candidate's falsifiable claim: what it should change, on which tasks, shown by what."""

    intended_effect: str = ""
    categories: tuple[str, ...] = ()
    """The failure categories it addresses."""
    predicted_flips: tuple[str, ...] = ()
    """Failing tasks it should make pass."""
    at_risk: tuple[str, ...] = ()
    """Passing tasks it might break."""
    evidence: tuple[Anchor, ...] = ()
    attribution: str = ""
    """The singleton group whose trigger must appear on a flipped task (attribution signature)."""
