"""hx: a harness foundry for AI agents.

>>> from hx import HarnessConfig, ModelConfig
>>> agent = ModelConfig(main="random:").agentic(HarnessConfig())
"""

import hx.processors  # noqa: F401 - registers the processor library under its short names
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
