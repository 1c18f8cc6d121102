"""The rules of a run's variants, folded from its ledger: which rule each harness held, since when, on what support.

A harness holds its rules as the program of its rule interpreter (the ``rule_program``
group, ``schemas.edits.RULE_GROUP``); an ``AddRule`` edit puts one in, with the support it
was induced from, and a ``DropRule`` takes one out. ``rule_history(ledger)`` walks every
harness version of the run (``RunLedger.versions``) in ledger order and compares each one's
program with the rules its variant held before: a rule that appears is a ``RuleRecord`` (its
round, the candidate that carried it, its support from that candidate's ``AddRule``), a
rule that disappears is marked dropped (when, by which candidate). A fork starts with the
rules its parent held. Reading the programs of the recorded harnesses, not only the
operations, keeps every way a program can change honest (a processor replaced or removed
with its rules). "Which rules did this run ship" is answered here and nowhere else.

>>> from schemas.rules import Avoid, Pattern, Rule
>>> from schemas.harness import HarnessSpec, ProcessorSpec
>>> rule = Rule(do=Avoid(what=Pattern(starts="eat")))
>>> spec = HarnessSpec(processors=(ProcessorSpec(type="rule_program", hooks=("before_model",),
...                                              params={"rules": [msgspec.to_builtins(rule)]}),))
>>> rules_in(spec) == (rule,)
True
"""

from __future__ import annotations

import msgspec

from projections.errors import UnreadableRules
from projections.ledger import RunLedger
from projections.ledger_records import HarnessVersion
from schemas.edits import RULE_GROUP, AddRule
from schemas.harness import HarnessSpec
from schemas.rules import Rule, RuleSupport, rule_lever, sentence


class RuleRecord(msgspec.Struct, kw_only=True):
    """One rule a variant's harness held: where it came from and whether it is still there."""

    variant: str
    rule: Rule
    round: int
    """The round it was shipped (or forked) in; -1: it was in the run's starting harness."""
    kind: str
    """``opened`` (the starting harness), ``ship`` or ``fork``: the ledger event that put it in."""
    position: int
    """The ledger position of that event."""
    candidate: str = ""
    """The candidate that carried it (empty for the starting harness)."""
    support: RuleSupport | None = None
    """What it was induced from, as its ``AddRule`` recorded (None: not induced, or no ``AddRule`` carried it)."""
    inherited_from: str = ""
    """For a fork: the parent variant that held it when the fork was made."""
    dropped_round: int | None = None
    """The round a later version of the variant's harness no longer held it (None: it is still in force)."""
    dropped_by: str = ""
    """The candidate whose ship took it out."""

    @property
    def shipped(self) -> bool:
        """True when evolution put it in (not the starting harness)."""
        return self.kind != "opened"

    @property
    def in_force(self) -> bool:
        """True while the variant's latest harness holds it."""
        return self.dropped_round is None

    @property
    def status(self) -> str:
        """``in force`` or ``dropped in round N by C``, and where a fork inherited it from."""
        fate = "in force" if self.in_force else (f"dropped in round {self.dropped_round}"
                                                 + (f" by {self.dropped_by}" if self.dropped_by else ""))
        return fate + (f" (inherited from {self.inherited_from})" if self.inherited_from else "")

    @property
    def lever(self) -> str:
        """The lever name of adding it (``rule:<12 hex>``)."""
        return rule_lever(self.rule)

    @property
    def sentence(self) -> str:
        """The rule as a plain sentence, with its support when it has one."""
        return sentence(self.rule, self.support)

    def as_dict(self) -> dict[str, object]:
        """The structured form exports write: the rule, its sentence, support, lever, round and fate."""
        return {"variant": self.variant, "round": self.round, "kind": self.kind, "candidate": self.candidate,
                "lever": self.lever, "sentence": self.sentence,
                "support": msgspec.to_builtins(self.support) if self.support is not None else None,
                "rule": msgspec.to_builtins(self.rule), "inherited_from": self.inherited_from,
                "in_force": self.in_force, "dropped_round": self.dropped_round, "dropped_by": self.dropped_by}


def rules_in(harness: HarnessSpec, group: str = RULE_GROUP) -> tuple[Rule, ...]:
    """The program of the harness's rule interpreter (empty when it has none); ``UnreadableRules`` if it does not
    decode."""
    spec = next((p for p in harness.processors if p.type == group), None)
    if spec is None:
        return ()
    try:
        return msgspec.convert(spec.params.get("rules", []), tuple[Rule, ...])
    except msgspec.ValidationError as exc:
        raise UnreadableRules(f"the {group} program of a recorded harness is not one this hx reads: {exc}") from None


def _carrier(ledger: RunLedger, version: HarnessVersion, rule: Rule) -> tuple[str, RuleSupport | None]:
    """(candidate, support) of the ``AddRule`` that put ``rule`` into this version (("", None): none did)."""
    for cid in version.candidates:
        cand = ledger.candidates.get(cid)
        ops = cand.proposal.operations if cand is not None else version.operations
        op = next((o for o in ops if isinstance(o, AddRule) and o.rule == rule), None)
        if op is not None:
            return cid, op.support
    return (version.candidates[0] if version.candidates else ""), None


def rule_history(ledger: RunLedger) -> list[RuleRecord]:
    """Every rule each variant's harness held over the run, in the order they came in."""
    out: list[RuleRecord] = []
    held: dict[str, list[RuleRecord]] = {}
    for name, version in ledger.versions():
        try:
            program = rules_in(version.harness)
        except UnreadableRules as exc:
            raise UnreadableRules(f"variant {name!r}, round {version.round}: {exc}") from None
        mine = held.setdefault(name, [])
        if version.kind == "fork":
            parent = ledger.variants[name].parent
            copies = [msgspec.structs.replace(r, variant=name, inherited_from=r.inherited_from or parent)
                      for r in held.get(parent, []) if r.in_force]
            mine += copies
            out += copies
        by = version.candidates[0] if version.candidates else ""
        for record in mine:
            if record.in_force and record.rule not in program:
                record.dropped_round, record.dropped_by = version.round, by
        present = {r.rule for r in mine if r.in_force}
        for rule in program:
            if rule in present:
                continue
            candidate, support = _carrier(ledger, version, rule)
            record = RuleRecord(variant=name, rule=rule, round=version.round, kind=version.kind,
                                position=version.position, candidate=candidate, support=support)
            mine.append(record)
            out.append(record)
    return out


def shipped_rules(ledger: RunLedger) -> list[RuleRecord]:
    """The rules evolution put into some variant's harness (not the starting harness's own), in order."""
    return [r for r in rule_history(ledger) if r.shipped]
