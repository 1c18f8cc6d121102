"""hx: a harness foundry for AI agents.

>>> from hx import HarnessConfig, ModelConfig
>>> agent = ModelConfig(main="random:").agentic(HarnessConfig())

Importing ``hx`` (which every ``hx.*`` import does first) imports nothing heavy: the names
below are loaded when first asked for, and the processor library is imported the first
time a processor is looked up by name (``hx.harness.libraries``), so a
command that never resolves a harness (``hx --help``, ``hx trace``) starts fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hx.harness.libraries import add_library
from hx.nats_websocket import defer_aiohttp

defer_aiohttp()  # before anything imports nats: aiohttp only when a ws:// NATS URL is used

if TYPE_CHECKING:
    from hx.harness.config import Attachment, HarnessConfig, Slots
    from hx.harness.errors import CompositionError, ContractViolation, Interrupt
    from hx.harness.processor import NORMAL, POST, PRE, Processor
    from hx.runtime.errors import ProviderError
    from hx.runtime.loop import AttemptResult, RunLoop
    from hx.runtime.models import Agent, ModelConfig
    from hx.runtime.providers.base import CallContext, Completion, Provider
    from hx.runtime.task import FunctionTool, Task, Tool
    from schemas.hooks import AfterModel, AfterTool, BeforeModel, BeforeTool, StepEnd, StepStart, TaskEnd, TaskStart

__all__ = [
    "NORMAL", "POST", "PRE", "AfterModel", "AfterTool", "Agent", "Attachment", "AttemptResult", "BeforeModel",
    "BeforeTool", "CallContext", "Completion", "CompositionError", "ContractViolation", "FunctionTool",
    "HarnessConfig", "Interrupt", "ModelConfig", "Processor", "Provider", "ProviderError", "RunLoop", "Slots",
    "StepEnd", "StepStart", "Task", "TaskEnd", "TaskStart", "Tool",
]


def _processor_library() -> None:
    import hx.processors  # noqa: F401 - registers the processor library under its short names


add_library(_processor_library)


def _exports() -> dict[str, Any]:
    # plain imports, so the layering check sees what the package's public names depend on
    import hx.harness.config
    import hx.harness.errors
    import hx.harness.processor
    import hx.runtime.errors
    import hx.runtime.loop
    import hx.runtime.models
    import hx.runtime.providers.base
    import hx.runtime.task
    import schemas.hooks

    modules = (hx.harness.config, hx.harness.errors, hx.harness.processor, hx.runtime.errors, hx.runtime.loop,
               hx.runtime.models, hx.runtime.providers.base, hx.runtime.task, schemas.hooks)
    return {name: getattr(module, name) for module in modules for name in __all__ if hasattr(module, name)}


def __getattr__(name: str) -> Any:
    """The public names of ``__all__``, imported on first use (``from hx import RunLoop``)."""
    if name not in __all__:
        raise AttributeError(f"module 'hx' has no attribute {name!r}")
    value = _exports()[name]
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy public ones included."""
    return sorted({*globals(), *__all__})
