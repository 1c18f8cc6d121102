"""Rule induction: rules learnt from the adaptation split's traces, judged by the critic and the gate like any edit.

``induce`` runs every method of ``methods`` over one round's recorded attempts
(``traces.read_traces``) and returns the rules the evidence supports, heaviest first.
"""

from __future__ import annotations

from collections.abc import Iterable

from hx.aegis.induction.index import Corpus
from hx.aegis.induction.methods import METHODS, Induced
from hx.aegis.induction.traces import AttemptTrace, Step, read_traces
from hx.aegis.settings import InductionSettings
from schemas.rules import sentence

__all__ = ["AttemptTrace", "Induced", "InductionSettings", "Step", "induce", "read_traces"]


def induce(traces: Iterable[AttemptTrace], settings: InductionSettings | None = None) -> list[Induced]:
    """The rules the attempts support, each once, heaviest first (ties: in method order, then by sentence)."""
    corpus = Corpus(traces)
    s = settings or InductionSettings()
    found: dict[str, tuple[int, Induced]] = {}
    for rank, method in enumerate(METHODS):
        for induced in method(corpus, s):
            key = sentence(induced.rule)
            if key not in found:
                found[key] = rank, induced
    ordered = sorted(found.items(), key=lambda kv: (-kv[1][1].weight, kv[1][0], kv[0]))
    return [induced for _, (_, induced) in ordered]
