"""The processor library: one small module per processor, registered by name on import.

Importing this package registers every library processor, so a harness config can
name them by their short registry names (``history_window``, ``tool_filter``, ...).
"""

from __future__ import annotations

# D1-D4 (model selection, context, memory, tools) and D5-D9 (environment, evaluation, control,
# observability, training bridge), in one sorted block
from hx.processors.action_pruner import ActionPruner
from hx.processors.attempt_workspace import AttemptWorkspace
from hx.processors.budget import Budget
from hx.processors.checklist_follower import ChecklistFollower
from hx.processors.cost_model_router import CostModelRouter
from hx.processors.explore_untried import ExploreUntried
from hx.processors.history_window import HistoryWindow
from hx.processors.llm_judge import LlmJudge
from hx.processors.loop_detector import LoopDetector
from hx.processors.observation_trim import ObservationTrim
from hx.processors.otel_spans import OtelSpanEmitter
from hx.processors.risky_tool_approval import RiskyToolApproval
from hx.processors.rl_records import RlRecords
from hx.processors.rule_program import RuleProgram
from hx.processors.sandbox import PythonSandboxTool, SandboxLimits
from hx.processors.self_check import SelfCheck
from hx.processors.sft_trajectories import SftTrajectories
from hx.processors.step_model_router import StepModelRouter
from hx.processors.structlog_events import StructlogEvents
from hx.processors.subprocess_sandbox import SubprocessSandbox
from hx.processors.system_prompt_template import SystemPromptTemplate
from hx.processors.task_notes import TaskNotes
from hx.processors.task_objects import TaskObjects
from hx.processors.tool_call_corrector import ToolCallCorrector
from hx.processors.tool_filter import ToolFilter
from hx.processors.tool_whitelist import ToolWhitelist
from hx.processors.training_bridge import RLRecord, attempt_to_rl_records, group_advantages
from hx.processors.undo_guard import UndoGuard
from hx.processors.visited_states import VisitedStates

__all__ = [
    "ActionPruner",
    "AttemptWorkspace",
    "Budget",
    "ChecklistFollower",
    "CostModelRouter",
    "ExploreUntried",
    "HistoryWindow",
    "LlmJudge",
    "LoopDetector",
    "ObservationTrim",
    "OtelSpanEmitter",
    "PythonSandboxTool",
    "RLRecord",
    "RiskyToolApproval",
    "RlRecords",
    "RuleProgram",
    "SandboxLimits",
    "SelfCheck",
    "SftTrajectories",
    "StepModelRouter",
    "StructlogEvents",
    "SubprocessSandbox",
    "SystemPromptTemplate",
    "TaskNotes",
    "TaskObjects",
    "ToolCallCorrector",
    "ToolFilter",
    "ToolWhitelist",
    "UndoGuard",
    "VisitedStates",
    "attempt_to_rl_records",
    "group_advantages",
]
