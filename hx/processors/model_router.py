"""D1 model selection: the shared mechanism by which a processor picks the model role of a call.

The run loop calls the ``main`` role unless the before_model event names another role
in its ``route`` field (an extension of ``BeforeModel``: empty means ``main``). A router
processor sets that field; the role must exist in the ``ModelConfig`` (``judge``,
``evaluator`` or a name under ``roles``), whose fallback chain then applies as usual.

While the running hx lacks ``BeforeModel.route``, a router whose decision is ``main``
passes events through, and one that would pick another role stops the attempt with a
clear reason instead of silently calling the wrong model.
"""

from __future__ import annotations

import msgspec

from hx.harness.errors import Interrupt
from schemas.hooks import BeforeModel

ROUTE_FIELD = "route"
ROUTE_SUPPORTED = ROUTE_FIELD in BeforeModel.__struct_fields__
"""Whether this hx's ``BeforeModel`` carries the ``route`` hint the run loop honours."""
DEFAULT_ROLE = "main"


def current_route(event: BeforeModel) -> str:
    """The role the event currently routes to (``main`` when unset or unsupported)."""
    return str(getattr(event, ROUTE_FIELD, "")) or DEFAULT_ROLE


def with_route(event: BeforeModel, role: str, processor: str) -> BeforeModel:
    """``event`` routed to ``role``; unchanged when it already goes there."""
    if role == current_route(event):
        return event
    if not ROUTE_SUPPORTED:
        raise Interrupt(f"{processor} chose model role {role!r}, but this hx's BeforeModel has no "
                        f"'{ROUTE_FIELD}' field, so the run loop can only call 'main'", status="infra_failure")
    return msgspec.structs.replace(event, **{ROUTE_FIELD: "" if role == DEFAULT_ROLE else role})
