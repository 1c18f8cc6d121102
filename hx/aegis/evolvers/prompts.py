"""The LLM evolver's prompts: the job, the round's evidence, the harnesses, the levers, the reply format.

Everything here is generic: the prompts describe harnesses, hooks, failure categories
and the reply format, never a benchmark, a game or a task beyond the ids the round's
digests carry. Sections are plain text with fenced YAML and JSON, built from the
landscape, the digests, the run state and the processor catalog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import yaml

from hx.aegis.evolvers.base import Context, Proposal
from hx.harness.contracts import PERMITTED
from hx.harness.processor import Processor
from schemas.hooks import HOOK_EVENT_TYPES, HOOK_NAMES
from schemas.landscape import FAILURE_CATEGORIES, Landscape, TaskDigest
from schemas.messages import Message, TaskSpec, ToolCall, ToolResult, ToolSchema

MAX_DIGESTS = 40
MAX_SOLVED = 40
MAX_LIST = 12
DIMENSIONS = {"D1": "model selection", "D2": "context", "D3": "memory", "D4": "tools", "D5": "environment",
              "D6": "evaluation", "D7": "control", "D8": "observability", "D9": "training bridge"}

REPLY_FORMAT = """{"candidates": [
  {"variant": "v0",
   "operations": [
     {"op": "attach", "processor": "<registry name, or the file name of your new code>",
      "hooks": ["<hook>", "..."], "params": {"<name>": "<value>"}},
     {"op": "replace", "group": "<singleton group>", "processor": "<name>", "params": {}},
     {"op": "remove", "group": "<singleton group>"},
     {"op": "reparam", "group": "<singleton group>", "params": {"<name>": "<new value>"}}],
   "manifest": {"intended_effect": "<the behaviour that should change, in one or two sentences>",
                "categories": ["<failure category it addresses>"],
                "predicted_flips": ["<failing task id expected to pass>"],
                "at_risk": ["<passing task id it might break>"],
                "attribution": "<singleton group whose trigger must show on a flipped task>",
                "expected_min_calls": 1,
                "capability_evidence": [{"kind": "builtin_processor|code_smoke|other",
                                         "claim": "<what the edit relies on>",
                                         "evidence": "<what you observed that shows it: a registry entry, a trace>"}],
                "stabilise": ["<solved task that passes only sometimes and should pass every attempt>"],
                "accepted_regressions": [{"task": "<a regression of this round you do not undo>",
                                          "why": "<why that is acceptable>"}]},
   "code": [{"name": "<file>.py", "source": "<python source>"}]}]}"""

NEW_CODE = '''A new processor is a Python module with exactly one class that subclasses
`hx.harness.processor.Processor` and defines `async def process(self, event)`, a generator
yielding the events that go on: the same event (pass), a changed copy, several (split) or
none (intercept); raising `hx.harness.errors.Interrupt(reason)` ends the attempt. The type
annotation of `event` (hook event types from `schemas.hooks`, a union for several hooks)
decides where it may be attached. Rules:
- declare `dimension: ClassVar[str]` (D1..D9) and optionally `addresses` (failure categories),
  `_order` (0 early, 50 normal, 100 late) and `_singleton_group` (only to replace a group);
- do not set `name`: hx names the processor after its content;
- parameters are annotated fields with JSON-compatible defaults; per-attempt state is set up
  in `__post_init__` (a fresh instance serves each attempt);
- never modify the event in place: yield `msgspec.structs.replace(event, ...)`, changing only
  what the hook permits;
- import only the standard library, msgspec and hx; no network, files or subprocesses.
In operations, name a new processor by its file name (or class name); hx rewrites the name.
Before it can ship, the code is imported in a sandbox, driven through synthetic events of
every hook it accepts, and its effect on the model input is checked.

```python
from collections.abc import AsyncIterator
from typing import ClassVar

import msgspec

from hx.harness.processor import Processor
from schemas.hooks import AfterTool, BeforeModel
from schemas.messages import Message


class ErrorReminder(Processor, kw_only=True, dict=True, forbid_unknown_fields=True, omit_defaults=True):
    """Show the model the last error a tool reported, once, before its next call."""

    dimension: ClassVar[str] = "D3"
    addresses: ClassVar[tuple[str, ...]] = ("invalid_action",)
    prefix: str = "Your last action failed:"

    def __post_init__(self) -> None:
        self._pending = ""

    async def process(self, event: AfterTool | BeforeModel) -> AsyncIterator[AfterTool | BeforeModel]:
        if isinstance(event, AfterTool):
            if event.result.is_error:
                self._pending = event.result.output[:200]
            yield event
        elif self._pending:
            note = Message(role="user", content=f"{self.prefix} {self._pending}")
            self._pending = ""
            yield msgspec.structs.replace(event, messages=(*event.messages, note))
        else:
            yield event
```'''

SYSTEM = f"""You are the evolver of a harness-evolution loop. An agent's harness is everything around
its model: processors attached to lifecycle hooks that frame the task, keep or trim the
history, shape the tools offered, correct calls, and decide when an attempt stops. The
agent has just run a batch of tasks under its harness variants; the failures were digested
and mapped. Propose candidate edits that should make failing tasks pass without breaking
passing ones.

A candidate is a short list of typed operations on one variant's harness plus a change
manifest, a falsifiable claim the next round will check:
- base every candidate on the evidence: predict flips only for tasks listed as failing with
  a category the candidate claims to address; a few well-supported candidates beat many guesses;
- regressions come first: when a recent ship broke tasks that used to pass, undo or repair it;
  every regression must be predicted to flip back by some candidate, or listed in a manifest's
  accepted_regressions with why it is acceptable, or the critic turns the whole round down;
- capability_evidence says what you observed that shows the edit's mechanism works; stabilise
  lists solved tasks that pass only sometimes and should pass every attempt;
- weigh edit kinds and dimensions the loop has not tried against those that keep missing;
  never use a banned lever, and answer the strategy concern when there is one;
- parameters and code must generalise: never write a task id, a solution step or an expected
  answer into them (a gate rejects any edit that does);
- operations must compose: attach only at hooks the processor accepts, one processor per
  singleton group; replace, remove and reparam name a group the variant holds;
- `attribution` names the singleton group whose activity should show on a flipped task.
A deterministic gate then decides: the edit must build, pass its smoke test, keep solved tasks
solved and realise at least one predicted flip.

Operations: `attach` a processor at hooks with parameters; `replace` the processor of a group;
`remove` a group; `reparam` changes some parameters of a group's processor (others keep theirs).

{NEW_CODE}

Reply with one JSON object and nothing else, in this shape (omit "code" when there is none):
```json
{REPLY_FORMAT}
```"""


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _names(items: Sequence[str], cap: int = MAX_LIST) -> str:
    more = f", ... ({len(items) - cap} more)" if len(items) > cap else ""
    return ", ".join(items[:cap]) + more if items else "none"


def landscape_text(landscape: Landscape) -> str:
    """The planner's landscape: regressions first, failure groups, edit kinds, levers, concern and bans."""
    out = ["## Regressions (tasks that passed before and fail now)"]
    out += [f"- {r.task} on {r.variant}, passing in round {r.since_round}; suspected ships: {_names(r.suspects)}"
            for r in landscape.regressions] or ["none"]
    out.append("## Failure groups")
    out += [f"- {g.category}: {len(g.tasks)} task(s) ({_names(g.tasks)}); implicated: {_names(g.implicated)}"
            for g in landscape.failures] or ["none"]
    out.append("## Edit kinds")
    out.append(f"buckets tried: {_names(landscape.tried_buckets)}; never tried: {_names(landscape.untried_buckets)}")
    out.append(f"dimensions tried: {_names(landscape.tried_dimensions)}; "
               f"never tried: {_names(landscape.untried_dimensions)}")
    out.append("## Lever records on this run")
    fresh = [lv.name for lv in landscape.levers if not lv.proposed and not lv.banned]
    out.append(f"never proposed: {_names(fresh, len(fresh))}")
    for lv in landscape.levers:
        if lv.name in fresh:
            continue
        rate = f"{lv.hit_rate:.0%}" if lv.hit_rate is not None else "untested"
        out.append(f"- {lv.name} [{lv.bucket}{', ' + lv.dimension if lv.dimension else ''}]: proposed {lv.proposed}, "
                   f"shipped {lv.shipped}, flips predicted {lv.predicted} / realised {lv.realised} ({rate})"
                   + (" BANNED" if lv.banned else ""))
    out.append(f"## Strategy concern from the last critic\n{landscape.concern or 'none'}")
    out.append(f"## Banned levers this round\n{_names(landscape.banned)}")
    return "\n".join(out)


def digests_text(digests: Sequence[TaskDigest], cap: int = MAX_DIGESTS) -> str:
    """The failing tasks (capped), then the ids of the solved ones (what an edit could break)."""
    failing = [d for d in digests if not d.solved]
    solved = [d.task for d in digests if d.solved]
    out = [f"## Failing tasks ({len(failing)}{f', first {cap} shown' if len(failing) > cap else ''})"]
    for d in failing[:cap]:
        feats = ", ".join(f"{k}={v:g}" for k, v in sorted(d.features.items()) if v)
        out.append(f"- {d.task} [{d.variant}, cluster {d.cluster}] {d.passes}/{d.attempts} passed; "
                   f"category {d.category or 'unknown'}; {d.continuity}; implicated: {_names(d.implicated)}"
                   + (f"; features: {feats}" if feats else ""))
        if d.summary:
            out.append(f"  summary: {_clip(d.summary, 400)}")
    out.append(f"## Solved tasks ({len(solved)}): {_names(solved, MAX_SOLVED)}")
    return "\n".join(out)


def harnesses_text(context: Context) -> str:
    """Each live variant's harness as YAML, with the clusters routed to it."""
    out = []
    ledger = context.state.ledger
    routes, unserved = {c: ledger.route(c) for c in ledger.clusters()}, ledger.unserved()
    for name, variant in sorted(context.state.live().items()):
        clusters = sorted(c for c, v in routes.items() if v == name)
        others = "any cluster not run yet" if name == unserved else ""
        routed = ", ".join(x for x in (_names(clusters) if clusters else "", others) if x) or "none"
        body = yaml.safe_dump(variant.harness.to_dict(), sort_keys=False)
        out.append(f"## Variant {name} (digest {variant.harness.digest[:19]}; serves: {routed})\n```yaml\n{body}```")
    return "\n".join(out)


def _type_text(t: object) -> str:
    if isinstance(t, type) and not getattr(t, "__args__", None):
        return t.__name__
    return str(t).replace("typing.", "").replace("collections.abc.", "")


def params_text(cls: type[Processor]) -> str:
    """The parameters of a processor type, with their types and defaults."""
    parts = []
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            default = f" = {_clip(repr(f.default), 60)}"
        elif f.default_factory is not msgspec.NODEFAULT:
            default = f" = {_clip(repr(f.default_factory()), 60)}"
        else:
            default = " (required)"
        parts.append(f"{f.name}: {_type_text(f.type)}{default}")
    return "; ".join(parts) or "none"


def catalog_text(catalog: Mapping[str, type[Processor]]) -> str:
    """The library processors an edit can attach: dimension, hooks, what they address, summary, parameters."""
    out = []
    for name, cls in sorted(catalog.items()):
        doc = (cls.__doc__ or "").strip().splitlines()
        out.append(f"- {name} [{cls.dimension} {DIMENSIONS.get(cls.dimension, '')}; hooks: "
                   f"{', '.join(cls.accepted_hooks())}; addresses: {', '.join(cls.addresses)}; group: {cls.group()}]"
                   f"\n  {doc[0] if doc else ''}\n  params: {params_text(cls)}")
    return "\n".join(out)


def _fields(cls: type[msgspec.Struct]) -> str:
    return ", ".join(f.name for f in msgspec.structs.fields(cls))


def hooks_text() -> str:
    """Each hook's event fields and what a processor may change there, then the value types inside events."""
    out = [f"- {hook}: `{HOOK_EVENT_TYPES[hook].__name__}`({_fields(HOOK_EVENT_TYPES[hook])}); may change: "
           f"{PERMITTED[hook]}" for hook in HOOK_NAMES]
    out.append("Inside them (`schemas.messages`): " + "; ".join(
        f"`{cls.__name__}`({_fields(cls)})" for cls in (Message, ToolCall, ToolResult, ToolSchema, TaskSpec)))
    return "\n".join(out)


def propose_prompt(context: Context, k: int, catalog: Mapping[str, type[Processor]]) -> str:
    """The user message of a propose call."""
    return "\n\n".join([
        f"# Round {context.round}: propose at most {k} candidate(s)",
        f"Failure categories: {', '.join(FAILURE_CATEGORIES)}.",
        "# Landscape", landscape_text(context.landscape),
        "# Evidence", digests_text(context.digests),
        "# Current harnesses", harnesses_text(context),
        "# Library processors", catalog_text(catalog),
        "# Hooks", hooks_text(),
        f"Reply with the JSON object only: at most {k} candidate(s), or an empty list when nothing is worth trying.",
    ])


def revise_prompt(context: Context, proposal: Proposal, request: str, supported: Sequence[str]) -> str:
    """The user message of a revise call: the candidate, the critic's request, the evidence it rests on."""
    ops = msgspec.json.encode(list(proposal.operations)).decode()
    manifest = msgspec.json.encode(proposal.manifest).decode()
    cited = [d for d in context.digests if d.task in set(proposal.manifest.predicted_flips)]
    return "\n\n".join([
        f"# Round {context.round}: revise one candidate for variant {proposal.variant}",
        f"Operations: {ops}", f"Manifest: {manifest}",
        f"# The critic's request\n{request}",
        f"Predicted flips the evidence supports: {_names(list(supported), MAX_DIGESTS)}",
        "# Evidence on its predicted flips", digests_text(cited),
        "# Current harnesses", harnesses_text(context),
        "Reply with the JSON object only, holding exactly one revised candidate for the same variant, or an "
        "empty list to withdraw it. A new processor of this candidate may be kept under its current name "
        "(as in the operations above) without sending its code again.",
    ])
