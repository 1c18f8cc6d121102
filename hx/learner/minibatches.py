"""A training pass's minibatches: samples encoded once, shuffled under a seed, padded to one shape.

A sample's row (its policy kind's encoding of the logged request and response) depends on
the kind and its sizes, never on the parameters, so it is made once and kept for as long as
its trajectory stays in the replay buffer's window. A pass then arranges the rows into
minibatches with the behaviour, reference and advantage arrays the algorithm's loss reads. Every
shuffle is seeded by (seed, round), so a redone pass sees the same batches in the same order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from hx.learner.errors import Unservable
from hx.learner.policy import Batch, Policy, Sample, bucket
from hx.learner.policy_gradient import PolicyGradientConfig

TurnKey = tuple[int, str, int, int, str]
"""A sample's place: (trace round, task, attempt, step, role)."""
_UNSERVABLE = object()


class Minibatches:
    """Encodes a pass's samples into padded minibatches, keeping each sample's row across passes."""

    def __init__(self) -> None:
        self._rows: dict[TurnKey, Any] = {}
        """Rows of the window's samples (or ``_UNSERVABLE``), kept across passes."""

    def of_pass(self, policy: Policy, reference: Policy | None, samples: Sequence[tuple[TurnKey, Sample]],
                config: PolicyGradientConfig, skipped: Counter[str], through: int) -> list[Batch]:
        """``epochs`` passes of encoded minibatches; samples left out are counted in ``skipped`` by reason."""
        rows: list[tuple[Any, Sample]] = []
        kept: dict[TurnKey, Any] = {}
        for key, sample in samples:
            row = self._rows.get(key)
            if row is None:
                try:
                    row = policy.row(sample)
                except Unservable:
                    row = _UNSERVABLE
            kept[key] = row
            if row is _UNSERVABLE:
                skipped["unservable"] += 1
            else:
                rows.append((row, sample))
        self._rows = kept  # rows of trajectories that left the window go
        rng = np.random.default_rng([config.seed, through])
        order = rng.permutation(len(rows))
        encoded = []
        size = bucket(min(config.minibatch, len(rows)))  # every minibatch of the pass has the first one's shape
        for start in range(0, len(rows), config.minibatch):
            chunk = [rows[i] for i in order[start:start + config.minibatch]]
            batch = collate(policy, reference, chunk, skipped, size)
            if batch is not None:
                encoded.append(batch)
        return [encoded[i] for _ in range(config.epochs) for i in rng.permutation(len(encoded))]


def collate(policy: Policy, reference: Policy | None, chunk: Sequence[tuple[Any, Sample]], skipped: Counter[str],
            rows: int) -> Batch | None:
    """One minibatch of ``rows`` rows with its loss arrays; None when no sample in it has the kind's units."""
    batch = padded(policy.collate([row for row, _ in chunk]), rows)
    mask = batch["mask"]
    old = np.zeros_like(mask)
    adv = np.zeros(mask.shape[0], np.float32)
    for i, (_, s) in enumerate(chunk):
        n = int(mask[i].sum())
        if len(s.logprobs) != n:
            mask[i] = 0.0  # the logged units are not this kind's units: leave the sample out
            skipped["unit_mismatch"] += 1
            continue
        old[i, :n] = s.logprobs
        adv[i] = s.advantage
    if not mask.any():
        return None
    batch["old_lp"], batch["adv"] = old, adv
    batch["ref_lp"] = reference.units(batch)[0] if reference is not None else np.zeros_like(mask)
    return batch


def padded(batch: Batch, rows: int) -> Batch:
    """``batch`` with rows of zeros (no units) up to ``rows``: a pass's last, short minibatch keeps the step's shape."""
    have = batch["mask"].shape[0]
    if have >= rows:
        return batch
    return {k: np.concatenate([v, np.zeros((rows - have, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}
