"""D7 ``loop_detector``: notice when the agent repeats itself, tell it, and stop it if it persists.

Failure addressed: action loops. An agent that gets the same observation for the same
action tends to try it again (re-reading a file, re-running a failing command,
alternating between two pages), burning the step budget without progress. This
processor watches every tool call and result (after_tool) as an (action, observation)
signature and, before the next model call, looks for a repeating tail: one signature
repeated, or a cycle of up to ``max_period`` signatures. When the tail repeats
``warn_after`` times it appends a user message naming the loop; every further
``warn_after`` repeats it warns again; at ``interrupt_after`` repeats it ends the
attempt (``Interrupt``, status ``interrupted``).

Attach with ``attach(LoopDetector.accepted_hooks(), LoopDetector())``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import ClassVar

from hx.harness.errors import Interrupt
from hx.harness.processor import NORMAL, Processor
from hx.processors._hookutil import add_user_note, state_key
from schemas.hooks import AfterTool, BeforeModel

DEFAULT_MESSAGE = ("You are repeating yourself: {what} {times} times in a row with the same results. Doing it "
                   "again will not change the outcome. Try a different action, or answer with what you know.")


def repeats(signatures: list[str], max_period: int) -> tuple[int, int]:
    """(times, period) of the longest repeating tail of ``signatures`` (times 1 when nothing repeats)."""
    best = (1, 1)
    for period in range(1, max_period + 1):
        if len(signatures) < 2 * period:
            break
        block = signatures[-period:]
        times = 1
        while len(signatures) >= (times + 1) * period and \
                signatures[-(times + 1) * period:-times * period] == block:
            times += 1
        if times > best[0]:
            best = (times, period)
    return best


class LoopDetector(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Warn, then interrupt, when tool calls and their results repeat."""

    name: ClassVar[str] = "loop_detector"
    _order: ClassVar[int] = NORMAL
    dimension: ClassVar[str] = "D7"
    addresses: ClassVar[tuple[str, ...]] = ("loop",)
    limits: ClassVar[tuple[str, ...]] = ("warn_after", "interrupt_after")  # not max_period: larger catches more

    warn_after: int = 3
    """Repeats of the same action and observation that trigger a warning."""
    interrupt_after: int = 6
    """Repeats that end the attempt (0: never)."""
    max_period: int = 3
    """Longest cycle of distinct calls recognised as a loop (1: only the same call repeated)."""
    message: str = DEFAULT_MESSAGE
    """The warning; ``{what}`` and ``{times}`` are filled in."""

    def __post_init__(self) -> None:
        if self.warn_after < 2 or self.max_period < 1:
            raise ValueError("warn_after must be >= 2 and max_period >= 1")
        if self.interrupt_after and self.interrupt_after < self.warn_after:
            raise ValueError("interrupt_after must be 0 or >= warn_after")
        try:
            self.message.format(what="", times=0)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"message: only {{what}} and {{times}} may be filled in ({exc})") from None
        self._signatures: list[str] = []
        self._labels: list[str] = []
        self._warned = 0

    def _label(self, event: AfterTool) -> str:
        args = json.dumps(event.call.input, sort_keys=True, default=str)
        return f"{event.call.name}({args if len(args) <= 80 else args[:77] + '...'})"

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        """Record each tool exchange; act before the next model call."""
        if isinstance(event, AfterTool):
            action = json.dumps([event.call.name, event.call.input], sort_keys=True, default=str)
            observation = json.dumps([event.result.output, event.result.is_error])
            self._signatures.append(state_key(action) + state_key(observation))
            self._labels.append(self._label(event))
            yield event
            return
        times, period = repeats(self._signatures, self.max_period)
        if times < self.warn_after:
            self._warned = 0
            yield event
            return
        what = " then ".join(self._labels[-period:])
        if self.interrupt_after and times >= self.interrupt_after:
            raise Interrupt(f"loop_detector: {what} repeated {times} times with the same results")
        if times >= self._warned + self.warn_after:
            self._warned = times
            yield add_user_note(event, self.message.format(what=f"calling {what}", times=times))
            return
        yield event
