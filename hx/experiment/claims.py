"""Claims and their test ranges: a test task judges one claim once.

A spec with ``claim`` set is a pre-registered claim. Its test-split tasks
(``<bench>:<game>:test:<n>``) may be no other claim's: not those of another claim spec in the
registry directory (the committed specs, ``hx experiment run --registry DIR``, by default the
spec's own directory), nor a range the registry declares spent in ``spent-test-ranges.yaml``
(figures made before claims were pre-registered)::

    - {tasks: "<bench>:<game>:test:0-199", by: "figures before pre-registration"}

A spec is not in conflict with itself: the same file, or a registry spec with the same spec
digest (a bench runs a copy of the committed spec in its data directory), its controlled harness
path read from where each spec lies (the copy may name the file by its absolute path). A registry spec under
the same claim name whose digest differs is another claim's. Two registry specs under one claim
name with different digests are an error naming both files (which one is the claim?). Anything
else is one line naming the task and the claim that used it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from hx.experiment.errors import SpecRejected
from hx.experiment.spec import parse_spec, spec_digest
from schemas.documents import read_document
from schemas.experiment import ExperimentSpec

SPENT = "spent-test-ranges.yaml"
_RANGE = re.compile(r"^(?P<game>[^:]+:[^:]+):test:(?P<low>\d+)(?:-(?P<high>\d+))?$")


def test_tasks(tasks: Any) -> set[str]:
    """The test-split task ids among ``tasks``."""
    return {str(t) for t in tasks or () if isinstance(t, str) and ":test:" in t}


def _spent(path: Path) -> Iterator[tuple[str, str]]:
    """(task, who used it) for every task of every range the spent file declares."""
    data = read_document(path, "spent test ranges", SpecRejected)
    if not isinstance(data, list):
        raise SpecRejected(f"{path}: a list of {{tasks: <bench:game:test:low-high>, by: <who>}}, not "
                           f"{type(data).__name__}")
    for i, entry in enumerate(data):
        found = _RANGE.match(str(entry.get("tasks", ""))) if isinstance(entry, dict) else None
        if found is None:
            raise SpecRejected(f"{path}: [{i}].tasks: not <bench>:<game>:test:<low>-<high>")
        low, high = int(found["low"]), int(found["high"] or found["low"])
        for n in range(low, high + 1):
            yield f"{found['game']}:test:{n}", f"{entry.get('by') or 'a spent range'} ({path.name})"


def claim_digest(spec: ExperimentSpec, path: Path | None) -> str:
    """The spec's digest with its controlled harness path resolved against the spec's folder: one claim's copies
    agree wherever they lie."""
    harness = spec.controlled_variables.get("harness")
    if not isinstance(harness, str) or not harness:
        return spec_digest(spec)
    folder = path.parent if path is not None else Path(".")
    controlled = {**spec.controlled_variables, "harness": str((folder / harness).resolve())}
    return spec_digest(msgspec.structs.replace(spec, controlled_variables=controlled))


@dataclass(frozen=True)
class RegisteredClaim:
    """A claim spec of the registry: its claim name, file, spec digest and test tasks."""

    name: str
    path: Path
    digest: str
    tasks: frozenset[str]

    @classmethod
    def of(cls, path: Path, spec: ExperimentSpec) -> RegisteredClaim:
        """The claim the spec read from ``path`` registers."""
        return cls(spec.claim, path, claim_digest(spec, path), frozenset(test_tasks(spec.tasks)))


def _claims(registry: Path, own: Path | None) -> list[RegisteredClaim]:
    """Every claim spec in the registry but ``own``; two specs under one claim name must be the same spec."""
    found: dict[str, RegisteredClaim] = {}
    out: list[RegisteredClaim] = []
    for path in sorted(registry.iterdir()):
        if path.suffix not in (".yaml", ".yml", ".json", ".toml") or path.name == SPENT:
            continue
        data = read_document(path, "spec", SpecRejected)
        if not isinstance(data, dict) or not data.get("claim"):
            continue
        claim = RegisteredClaim.of(path, parse_spec(data, where=str(path)))
        first = found.setdefault(claim.name, claim)
        if first.digest != claim.digest:
            raise SpecRejected(f"{registry}: claim {claim.name!r} is registered by two different specs, "
                               f"{first.path.name} and {path.name}; a claim is one spec")
        if own is None or path.resolve() != own.resolve():
            out.append(claim)
    return out


def check_claim(spec: ExperimentSpec, path: Path | None, registry: Path) -> None:
    """Raise SpecRejected when a claim spec's test tasks are another claim's or spent; nothing for other specs."""
    mine = test_tasks(spec.tasks)
    if not spec.claim or not mine:
        return
    where = str(path) if path is not None else "spec"
    if not registry.is_dir():
        raise SpecRejected(f"{where}: claim: no registry directory {str(registry)!r} to check its test tasks against")
    used: dict[str, str] = {}
    if (registry / SPENT).is_file():
        used.update(_spent(registry / SPENT))
    digest = claim_digest(spec, path)
    for other in _claims(registry, path):
        if other.digest == digest:  # this very spec, registered (a bench runs a copy of it)
            continue
        same = " under this claim's name, a different spec" if other.name == spec.claim else ""
        for task in other.tasks:
            used.setdefault(task, f"claim {other.name!r} ({other.path.name}{same})")
    clash = sorted(mine & set(used), key=lambda t: (t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])))
    if clash:
        more = f" and {len(clash) - 1} more" if len(clash) > 1 else ""
        raise SpecRejected(f"{where}: tasks: {clash[0]}{more} already used by {used[clash[0]]}; a test task judges "
                           "one claim once")
