"""The kinds of trainable policy, by name: entry points of the group ``hx.policies``, loaded on first use.

hx ships ``scorer`` and ``lm`` (declared in its ``pyproject.toml``); naming them here imports
neither, so the command line lists kinds without loading JAX.

>>> sorted(KINDS)
['lm', 'scorer']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hx.entry_points import Registry

if TYPE_CHECKING:  # the policy module brings JAX
    from hx.learner.policy import Policy

KINDS: Registry[type[Policy]] = Registry("hx.policies", "policy kind")
"""The policy kinds, by name (``policy:<kind>``, ``--kind``)."""
