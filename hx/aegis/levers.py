"""Levers: the edits the evolvers can make, and each lever's record on a run.

A lever is a library processor that declares the failure categories it addresses
(``Processor.addresses``): attaching it is the edit. Removing or re-parameterising a
group already in a harness are levers too (``remove:<group>``, ``reparam:<group>``). A
lever's record is read off the ledger: how often it was proposed and shipped, and of the
flips its ships predicted on tasks evaluated in the next round, how many happened (its
hit rate, the reputation the evolvers and the critic weigh).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from hx.aegis.operations import bucket_of
from hx.aegis.state import RunState
from hx.harness.processor import Processor, registered
from projections.ledger_records import Ship
from schemas.edits import RULE_GROUP, AnyEditOp, Attach, Remove, Reparam
from schemas.landscape import Lever


def catalog(*, standalone: bool = False) -> dict[str, type[Processor]]:
    """Every registered processor that declares what it addresses (only those useful with their defaults)."""
    return {name: cls for name, cls in registered().items() if cls.addresses and (cls.standalone or not standalone)}


def ship_outcome(state: RunState, ship: Ship) -> tuple[int, int]:
    """(predicted, realised) flips of one ship, on the tasks the next round digested."""
    nxt = state.digests.get(ship.round + 1)
    if nxt is None:
        return 0, 0
    solved = {d.task: d.solved for d in nxt}
    predicted = [t for t in ship.manifest.predicted_flips if t in solved]
    return len(predicted), sum(solved[t] for t in predicted)


def hit_rates(state: RunState, lever: str) -> dict[int, float]:
    """The lever's hit rate per round it shipped in (rounds whose outcome is known)."""
    out: dict[int, tuple[int, int]] = {}
    for ship in state.ships:
        if lever in ship.levers:
            p, r = ship_outcome(state, ship)
            if p:
                old = out.get(ship.round, (0, 0))
                out[ship.round] = (old[0] + p, old[1] + r)
    return {rnd: r / p for rnd, (p, r) in out.items()}


def records(state: RunState, names: Iterable[str], banned: Iterable[str] = ()) -> tuple[Lever, ...]:
    """The record of each named lever on this run."""
    ban, known = set(banned), catalog()
    out = []
    for name in names:
        proposed = sum(1 for c in state.candidates.values() if name in c.levers)
        ships = [s for s in state.ships if name in s.levers]
        outcomes = [ship_outcome(state, s) for s in ships]
        cls = known.get(name)
        out.append(Lever(name=name, bucket=bucket_of(edit_of(name)), dimension=cls.dimension if cls else "",
                         addresses=tuple(cls.addresses) if cls else (), proposed=proposed, shipped=len(ships),
                         predicted=sum(p for p, _ in outcomes), realised=sum(r for _, r in outcomes),
                         banned=name in ban))
    return tuple(out)


def edit_of(lever: str) -> AnyEditOp:
    """An edit that pulls ``lever`` (what its bucket is read from): the inverse of ``lever_of``."""
    kind, _, group = lever.partition(":")
    if kind in ("rule", "drop-rule"):
        return Reparam(group=RULE_GROUP, params={})  # a rule edits the interpreter's program: its bucket
    if kind == "remove" and group:
        return Remove(group=group)
    if kind == "reparam" and group:
        return Reparam(group=group, params={})
    return Attach(processor=lever, hooks=())


def reputation(lever: Lever) -> float:
    """How much an evolver should trust a lever: untried ones first, then by hit rate."""
    if not lever.proposed:
        return 1.5
    rate = lever.hit_rate
    return 0.5 if rate is None else 0.5 + rate


def with_flag(lever: Lever, banned: bool) -> Lever:
    """The lever, marked banned or not."""
    return msgspec.structs.replace(lever, banned=banned)
