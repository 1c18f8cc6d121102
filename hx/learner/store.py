"""The policies loaded in one session, by key: what the trainer files and the ``policy:`` provider serves.

Whoever runs a co-evolution, a learner or a fork creates one ``PolicyStore`` and hands it
to both sides: the trainer files each new policy under its version, and the provider (which
finds the store in its ``ProviderResources``) serves it from there without fetching the
checkpoint again. The store is bounded: the least recently used policy is dropped first.
A store is never shared by two sessions unless they are given the same one.

>>> store = PolicyStore(capacity=2)
>>> for key in "abc":
...     store.put(key, None, f"v-{key}")  # type: ignore[arg-type]
>>> "a" in store, len(store), store.get("c")
(False, 2, (None, 'v-c'))
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from hx.learner.policy import Policy
from schemas.identities import PolicyVersion

CAPACITY = 4
"""Policies a store keeps: the rollouts' current one, its parent, a gate's candidate, a spare."""


class PolicyStore:
    """A bounded least-recently-used map from a key (a spec's model part, a version) to a loaded policy."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._loaded: OrderedDict[str, tuple[Policy, PolicyVersion]] = OrderedDict()

    def put(self, key: str, policy: Policy, version: PolicyVersion) -> None:
        """Keep ``policy`` (of ``version``) under ``key``, dropping the least recently used beyond the capacity."""
        self._loaded[key] = (policy, version)
        self._loaded.move_to_end(key)
        while len(self._loaded) > self.capacity:
            self._loaded.popitem(last=False)

    def get(self, key: str) -> tuple[Policy, PolicyVersion] | None:
        """The policy kept under ``key`` and its version (None: not kept), now the most recently used."""
        found = self._loaded.get(key)
        if found is not None:
            self._loaded.move_to_end(key)
        return found

    def __contains__(self, key: object) -> bool:
        return key in self._loaded

    def __iter__(self) -> Iterator[str]:
        """The keys kept, least recently used first."""
        return iter(self._loaded)

    def __len__(self) -> int:
        return len(self._loaded)
