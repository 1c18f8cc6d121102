"""An example projection plugin: how often each tool was called, and how often it failed, per run.

Run it against any hx log without installing anything:

    hx projections run docs/examples/tool_usage.py:ToolUsage          # build it, then follow the log
    hx projections run docs/examples/tool_usage.py:ToolUsage --once   # build it, print the tally, stop

or, with ``docs/examples`` on ``PYTHONPATH``, as ``tool_usage:ToolUsage``; or register it in
a package's ``pyproject.toml`` and it shows up in ``hx projections list``:

    [project.entry-points."hx.projections"]
    tool_usage = "tool_usage:ToolUsage"
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from projections.base import Projection
from schemas.envelope import Record
from schemas.tools import ToolInvoked, ToolReturned
from streams.topology import TraceAddress


class ToolTally(msgspec.Struct):
    """One tool in one run: calls made, results that were errors."""

    calls: int = 0
    errors: int = 0


ToolUsageState = dict[str, dict[str, ToolTally]]
"""Run id -> tool name -> tally (str keys: the canonical digest sorts them)."""


class ToolUsage(Projection[ToolUsageState]):
    """Per run and tool: how many calls, how many error results."""

    name: ClassVar[str] = "tool_usage"
    version: ClassVar[int] = 1
    reads = frozenset({ToolInvoked.TYPE, ToolReturned.TYPE})  # only these reach fold()
    state_type = ToolUsageState

    def initial(self) -> ToolUsageState:
        """No run yet."""
        return {}

    def fold(self, state: ToolUsageState, record: Record) -> ToolUsageState:
        """Count a call, or an error result, under its run and tool."""
        run = TraceAddress.parse(record.subject).run
        event = record.event
        if isinstance(event, ToolInvoked):
            state.setdefault(run, {}).setdefault(event.call.name, ToolTally()).calls += 1
        elif isinstance(event, ToolReturned) and event.result.is_error:
            state.setdefault(run, {}).setdefault(event.result.name, ToolTally()).errors += 1
        return state

    def summary(self, state: ToolUsageState) -> str:
        """The tally, one line per run and tool (``hx projections run --once`` and ``rebuild`` print it)."""
        return "\n".join(f"  {run}  {tool}: {tally.calls} call(s), {tally.errors} error(s)"
                         for run, tools in sorted(state.items()) for tool, tally in sorted(tools.items()))
