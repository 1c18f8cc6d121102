"""``policy:``: the trainable Flax policy as a model provider, like ``random:`` to the run loop.

Specs:

- ``policy:scorer`` or ``policy:lm``: a freshly initialised policy of that kind (option
  ``init_seed``, default 0; option ``config`` for the kind's settings);
- ``policy:<version>``: a checkpoint from the log's object store, by its full version or a
  prefix of at least 8 hex digits;
- ``policy:<directory>`` (a path with a ``/``): a checkpoint directory on disk.

Every response names the checkpoint version that produced it and carries the log-probability
of every unit it produced. Sampling is the default (temperature 1; a memoryless greedy policy
loops in these games) and is seeded from (seed, task, attempt, step, role) like ``random:``,
so a replay of an attempt is the same episode. Loaded policies are kept in the ``PolicyStore``
the command lends its providers (``ProviderResources``; one of their own when it lends none):
the attempts given one store share one copy, the trainer files its new policies there, and a
copy is never trained in place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from nats.js.errors import NotFoundError

from hx.learner import checkpoint
from hx.learner.errors import PolicyError
from hx.learner.kinds import KINDS
from hx.learner.policy import Policy
from hx.learner.store import PolicyStore
from hx.runtime.errors import ModelSpecError, ProviderError
from hx.runtime.providers.base import CallContext, Completion, Provider
from hx.runtime.providers.random import seed_for
from schemas.identities import POLICY_SCHEME, PolicyVersion, is_version
from schemas.messages import Message, ToolSchema, Usage
from streams.log import EventLog
from streams.topology import BLOB_STORE


async def resolve_version(log: EventLog, prefix: str) -> PolicyVersion:
    """The one stored policy version that starts with ``prefix``; ``PolicyError`` when none or several do."""
    if len(prefix) == 64:
        return PolicyVersion(prefix)
    blobs = await log.js.object_store(BLOB_STORE)
    try:
        names = [info.name for info in await blobs.list()]
    except NotFoundError:
        names = []
    found = sorted({n.split("/")[1] for n in names if n.startswith(f"policy/{prefix}") and n.count("/") == 1})
    if len(found) != 1:
        raise PolicyError(f"policy version {prefix!r} matches {len(found)} stored checkpoints"
                          + (f": {', '.join(v[:12] for v in found)}" if found else ""))
    return PolicyVersion(found[0])


class PolicyProvider(Provider):
    """Answers with a trainable policy: a fresh one of a kind, a stored checkpoint, or a checkpoint directory."""

    scheme = POLICY_SCHEME

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.store = self.resources.setdefault(PolicyStore, PolicyStore)
        """Where loaded policies are kept: the command's store, shared with its trainer, when it lends one."""

    @classmethod
    def check(cls, model: str, options: Mapping[str, Any]) -> None:
        """The spec names a kind, a version (hex) or a directory."""
        if model in KINDS or "/" in model or is_version(model):
            return
        raise ModelSpecError(f"policy:{model!r}: expected a kind ({', '.join(sorted(KINDS))}), a checkpoint version "
                             "(at least 8 hex digits) or a checkpoint directory path")

    def _key(self) -> str:
        # a stored version is its own key (the learner files its fresh copies under it); a fresh
        # policy depends on its seed and settings too; a prefix is resolved to its version first
        if self.model in KINDS:
            return f"{self.model}\x1f{self.options.get('init_seed', 0)}\x1f{self.options.get('config', {})}"
        return self.model

    async def policy(self) -> tuple[Policy, PolicyVersion]:
        """The policy this spec names and its version, loaded once per store."""
        self.check(self.model, self.options)
        key = self._key()
        if key not in self.store and is_version(self.model) and len(self.model) < 64:
            if self.log is None:
                raise PolicyError(f"policy:{self.model}: loading a stored checkpoint needs the log")
            key = await resolve_version(self.log, self.model)
        kept = self.store.get(key)
        if kept is not None:
            return kept
        if self.model in KINDS:
            pol = checkpoint.create(self.model, self.options.get("config"), seed=int(self.options.get("init_seed", 0)))
            ver = checkpoint.version(pol)
        elif "/" in self.model:
            pol = checkpoint.load(self.model)
            ver = checkpoint.version(pol)
        else:
            if self.log is None:
                raise PolicyError(f"policy:{self.model}: loading a stored checkpoint needs the log")
            ver = PolicyVersion(key)
            pol = await checkpoint.fetch(self.log, ver)
        self.store.put(key, pol, ver)
        if self.model != key:  # a prefix: the next call of this spec must not list the object store again
            self.store.put(self.model, pol, ver)
        return pol, ver

    async def complete(self, messages: tuple[Message, ...], tools: tuple[ToolSchema, ...],
                       params: Mapping[str, Any], ctx: CallContext) -> Completion:
        """Sample an answer from the policy; a request it cannot serve is a ``ProviderError`` naming why."""
        try:
            pol, ver = await self.policy()
            # in a worker thread: an LM's decoding takes milliseconds a token, and other attempts wait meanwhile
            out = await asyncio.to_thread(pol.act, messages, tools, seed=seed_for(ctx),
                                          temperature=float(params.get("temperature", 1.0)),
                                          max_tokens=int(params.get("max_tokens", 32)))
        except PolicyError as exc:
            raise ProviderError("other", f"policy:{self.model[:16]}: {exc}") from None
        return Completion(content=out.content, tool_calls=out.tool_calls, stop_reason=out.stop_reason,
                          usage=Usage(output_tokens=len(out.logprobs)), logprobs=out.logprobs, model_version=ver)
