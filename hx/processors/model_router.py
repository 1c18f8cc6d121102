"""D1 model selection: the shared mechanism by which a processor picks the model role of a call.

The run loop calls the ``main`` role unless the before_model event names another role
in its ``route`` field (empty means ``main``). A router processor sets that field; the
role must exist in the ``ModelConfig`` (``judge``, ``evaluator`` or a name under
``roles``), whose fallback chain then applies as usual.
"""

from __future__ import annotations

import msgspec

from schemas.hooks import BeforeModel

DEFAULT_ROLE = "main"


def current_route(event: BeforeModel) -> str:
    """The role the event currently routes to (``main`` when unset)."""
    return event.route or DEFAULT_ROLE


def with_route(event: BeforeModel, role: str) -> BeforeModel:
    """``event`` routed to ``role``; unchanged when it already goes there."""
    if role == current_route(event):
        return event
    return msgspec.structs.replace(event, route="" if role == DEFAULT_ROLE else role)
