"""Ordering within a hook and the dependency rules between singleton groups."""

from __future__ import annotations

import builtins
import heapq
from collections.abc import Sequence
from typing import Protocol, TypeVar

from hx.harness.errors import CompositionError
from hx.harness.processor import Processor
from schemas.hooks import HookName


class Attached(Protocol):
    """What ordering needs of an attachment."""

    @property
    def type(self) -> str: ...
    @property
    def hooks(self) -> tuple[HookName, ...]: ...
    def cls(self) -> builtins.type[Processor]: ...
    def group(self) -> str: ...


Attachment = TypeVar("Attachment", bound=Attached)


def check_dependencies(attachments: Sequence[Attachment]) -> None:
    """Every ``_after`` group is present, and the ``_after`` graph has no cycle."""
    by_group = {att.group(): att for att in attachments}
    for att in attachments:
        for dep in att.cls()._after:
            if dep not in by_group:
                raise CompositionError(f"processor {att.type!r} declares _after {dep!r}, which is not in the harness")
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(group: str, path: list[str]) -> None:
        if state.get(group) == 2:
            return
        if state.get(group) == 1:
            cycle = [*path[path.index(group):], group]
            procs = ", ".join(repr(by_group[g].type) for g in cycle[:-1])
            raise CompositionError(f"processors {procs} form an _after dependency cycle between singleton groups: "
                                   f"{' -> '.join(cycle)}")
        state[group] = 1
        for dep in by_group[group].cls()._after:
            visit(dep, [*path, group])
        state[group] = 2

    for group in by_group:
        visit(group, [])


def resolve_order(hook: HookName, attachments: Sequence[Attachment]) -> tuple[Attachment, ...]:
    """The attachments of ``hook`` ordered by ``_order``, then ``_after``, then attach order."""
    here = [(i, att) for i, att in enumerate(attachments) if hook in att.hooks]
    groups = {att.group(): (i, att) for i, att in here}
    indegree = {i: 0 for i, _ in here}
    edges: dict[int, list[int]] = {i: [] for i, _ in here}
    for i, att in here:
        cls = att.cls()
        for dep in cls._after:
            if dep in groups:
                j, dep_att = groups[dep]
                if dep_att.cls()._order > cls._order:
                    raise CompositionError(
                        f"processor {att.type!r} at {hook!r} runs _after {dep!r}, but its _order "
                        f"({cls._order}) puts it before {dep_att.type!r} ({dep_att.cls()._order})")
                edges[j].append(i)
                indegree[i] += 1
    ready = [(att.cls()._order, i) for i, att in here if indegree[i] == 0]
    heapq.heapify(ready)
    by_index = dict(here)
    out: list[Attachment] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(by_index[i])
        for k in edges[i]:
            indegree[k] -= 1
            if indegree[k] == 0:
                heapq.heappush(ready, (by_index[k].cls()._order, k))
    if len(out) != len(here):
        stuck = [by_index[i].type for i in indegree if indegree[i] > 0]
        raise CompositionError(f"dependency cycle at hook {hook!r} among {', '.join(stuck)}")
    return tuple(out)
