"""Errors of harness composition and of the hook contracts."""

from __future__ import annotations

from schemas.errors import HxError


class CompositionError(HxError):
    """A harness cannot be built: raised before anything runs, naming the processor and the rule."""


class ContractViolation(HxError):
    """A processor changed a field its hook does not permit."""

    def __init__(self, processor: str, hook: str, field: str, detail: str = "") -> None:
        self.processor = processor
        self.hook = hook
        self.field = field
        msg = f"processor {processor!r} at hook {hook!r} changed {field!r}, which {hook} does not permit"
        super().__init__(msg + (f": {detail}" if detail else ""))


class InPlaceEdit(ContractViolation):
    """A processor tried to change its input event in place, which immutable hook payloads refuse."""

    def __init__(self, processor: str, hook: str, field: str, detail: str) -> None:
        super().__init__(processor, hook, field)
        self.args = (f"processor {processor!r} at hook {hook!r} tried to change {field!r} of its input in place: "
                     f"{detail}",)


class Interrupt(HxError):
    """Raised by a processor to end the attempt; the reason is recorded on the log."""

    def __init__(self, reason: str, *, status: str = "interrupted") -> None:
        self.reason = reason
        self.status = status
        super().__init__(reason)
