"""The edit ledger of a run folded once: the one read model every question about its decisions is answered from.

``RunLedger`` folds one run's ledger events (``schemas.ledger``) in order and keeps what they
say, as data: every event with its position, each variant and every version of its harness
(the round and position it came in, the operations that made it, the candidates it carried),
each candidate (as proposed, as revised, its gate verdict, its approval, where it shipped),
the ships and forks, the routing of task clusters, each round's records, the held-out scores,
the model in force, the run's end. It builds no harness and re-runs no check: the loop
(``hx.aegis``) builds harnesses from these versions and the audit (``hx.replay.audit``)
re-checks the decisions against them. "Which harness did variant v run in round r" is
``RunLedger.as_of(r)[v]``, here and nowhere else.

A ledger that does not make sense folds anyway, so an auditor can read it: each event that
cannot be taken (a message on the run's subject that is no ledger event, a position repeated
or skipped, a first event that is not ``ledger.opened``, an event after
``ledger.evolution_finished``, a verdict or ship naming a candidate or variant the ledger never
made, a ``prev`` that is not the digest of the event before) is a ``Fault`` naming the event,
and is not applied. A command that must not act on such a ledger refuses it by its first fault.

What the fold keeps is in ``projections.ledger_records``; ``projections.ledger_reader`` reads a
run's ledger off ``HX_LEDGER`` into it, and folds the whole stream as the ``edit_ledger`` projection.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from projections.ledger_records import (
    CandidateRecord,
    Fault,
    HarnessVersion,
    LedgerEntry,
    RoundRecords,
    Ship,
    ShipRecord,
    Variant,
    revised,
)
from schemas.landscape import Regression, TaskDigest
from schemas.ledger import (
    ApprovalGiven,
    ApprovalRequested,
    CandidateProposed,
    CandidateRevised,
    CriticJudged,
    EvolutionFinished,
    GateJudged,
    HarnessShipped,
    HeldoutScored,
    LandscapePlanned,
    LedgerEvent,
    LedgerOpened,
    ModelChanged,
    RoundDecided,
    RoundDigested,
    VariantForked,
    VariantRetired,
    ledger_digest,
)

Routing = Literal["own_cluster_first"]
ROUTING: Routing = "own_cluster_first"
"""The rule ``RunLedger.unserved`` routes a cluster no fork serves by; a job records it (``loop.routing``) so an audit
applies the rule its run ran under, whatever a later hx routes by."""


class RunLedger(msgspec.Struct):
    """One run's ledger, folded: variants and harness versions, candidates, ships, rounds, and what did not fold."""

    run_id: str = ""
    entries: list[LedgerEntry] = []
    """Every event taken, in order."""
    arrived: list[LedgerEntry] = []
    """Every ledger event read, in the order read, taken or not (what the chain is checked on)."""
    opened: LedgerOpened | None = None
    head: str = ""
    """The digest of the last event taken."""
    variants: dict[str, Variant] = {}
    routing: dict[str, str] = {}
    """Task cluster -> the variant it runs under."""
    candidates: dict[str, CandidateRecord] = {}
    shipments: list[ShipRecord] = []
    """Every ship and fork, in order."""
    ships: list[Ship] = []
    """Every candidate shipped or forked, in order."""
    rounds: dict[int, RoundRecords] = {}
    heldout: list[HeldoutScored] = []
    answers: dict[str, ApprovalGiven] = {}
    models: list[ModelChanged] = []
    concern: str = ""
    banned: tuple[str, ...] = ()
    banned_round: int = -1
    """The round whose critic issued the ban (it holds for the round after)."""
    finished: EvolutionFinished | None = None
    faults: list[Fault] = []
    last_position: int = 0
    pending: list[ShipRecord] = []
    """Ships since the last round digest (the next digest's ``between``)."""

    @classmethod
    def of(cls, events: Iterable[LedgerEvent]) -> RunLedger:
        """Fold a run's ledger events held in memory (positions 1, 2, ...)."""
        run = cls()
        for event in events:
            run.fold(event)
        return run

    # --- folding ----------------------------------------------------------------------------

    def fold(self, event: LedgerEvent, position: int | None = None, seq: int = 0) -> None:
        """Take the run's next ledger event (at ``position``, read from its subject; the next one when None)."""
        position = self.last_position + 1 if position is None else position
        entry = LedgerEntry(position, seq, event)
        self.arrived.append(entry)
        if not self._placed(position, type(event).TYPE, seq):
            return
        self.last_position = position
        problem = self._misplaced(event)
        if problem:
            if self.opened is not None or not any(f.text == problem for f in self.faults):
                self._fault(entry, problem)  # a ledger without its opening is one fault, not one per event
            return
        if event.prev != self.head:
            before = f"event {self.entries[-1].position}" if self.entries else "nothing"
            self._fault(entry, f"prev {event.prev[:19] or '(empty)'} is not the digest of {before} "
                               f"({self.head[:19] or 'none'})", kind="chain")
        self.entries.append(entry)
        self.head = ledger_digest(event)
        problem = self._apply(entry)
        if problem:
            self._fault(entry, problem)

    def foreign(self, position: int, seq: int, type_name: str, why: str) -> None:
        """A message on the run's ledger subject that is not a ledger event (another type, or undecodable)."""
        if self._placed(position, type_name, seq):
            self.last_position = position
            self.faults.append(Fault(position, type_name, why, seq=seq))

    def _fault(self, entry: LedgerEntry, text: str, kind: str = "structure") -> None:
        self.faults.append(Fault(entry.position, entry.type, text, kind, entry.seq))

    def _placed(self, position: int, type_name: str, seq: int) -> bool:
        """Check a position against the last one: a repeat is refused, a jump noted; True when it may be taken."""
        if position <= self.last_position:
            taken = next((e for e in self.entries if e.position == position), None)
            if taken is None:
                self.faults.append(Fault(position, type_name, f"arrives after event {self.last_position}: out of "
                                         "order", "reordered", seq))
                return False
            self.faults.append(Fault(position, type_name, f"written again on the subject of {taken.label}, message "
                                     f"{taken.seq}: a ledger position is written once", "duplicate", seq))
            return False
        if position > self.last_position + 1:
            first, last = self.last_position + 1, position - 1
            missing = f"event {first}" if first == last else f"events {first}-{last}"
            self.faults.append(Fault(position, type_name, f"{missing} missing before it (positions skip from "
                                     f"{self.last_position} to {position})", "dropped", seq))
        return True

    def _misplaced(self, event: LedgerEvent) -> str:
        """Why ``event`` cannot be taken where it stands ("" when it can)."""
        if self.opened is None and not isinstance(event, LedgerOpened):
            return "a run's ledger starts with ledger.opened"
        if self.opened is not None and isinstance(event, LedgerOpened):
            return f"a second ledger.opened (the run's is event {self.entries[0].position})"
        if self.opened is not None and event.run_id != self.run_id:
            return f"belongs to run {event.run_id!r}, not {self.run_id!r}"
        if self.finished is not None:
            return (f"follows ledger.evolution_finished (event {self.finished_position}): nothing is recorded after "
                    "a run's end")
        return ""

    @property
    def finished_position(self) -> int:
        """The position of ``ledger.evolution_finished`` (0: the run has not finished)."""
        return next((e.position for e in self.entries if isinstance(e.event, EvolutionFinished)), 0)

    def _apply(self, entry: LedgerEntry) -> str:
        """Apply one event; why it cannot apply ("" when it did)."""
        ev, position = entry.event, entry.position
        match ev:
            case LedgerOpened():
                self.opened, self.run_id = ev, ev.run_id
                self.variants[ev.variant] = Variant(ev.variant, [HarnessVersion(-1, position, entry.seq, ev.digest,
                                                                                ev.harness)])
            case RoundDigested():
                rnd = self.round(ev.round)
                rnd.digested, rnd.between = ev, list(self.pending)
                self.pending.clear()
            case LandscapePlanned():
                self.round(ev.round).landscape = ev
            case ModelChanged():
                self.models.append(ev)
                self.round(ev.round).model = ev
            case CandidateProposed():
                if ev.candidate in self.candidates:
                    return f"proposes candidate {ev.candidate} again (first proposed at event " \
                           f"{self.candidates[ev.candidate].position})"
                if ev.variant not in self.variants:
                    return f"proposes a candidate on variant {ev.variant!r}, which the ledger never made"
                self.candidates[ev.candidate] = CandidateRecord(ev, ev, position)
                self.round(ev.round).proposed.append(ev)
            case CandidateRevised():
                cand = self.candidates.get(ev.candidate)
                if cand is None:
                    return _unknown(ev.candidate)
                cand.proposal, cand.revision = revised(cand.proposal, ev), ev
                self.round(ev.round).revised[ev.candidate] = ev
            case CriticJudged():
                named = [*ev.ranking, *ev.revisions, *(c.candidate for c in ev.concerns)]
                missing = [c for c in dict.fromkeys(named) if c not in self.candidates]
                if missing:
                    return _unknown(missing[0])
                self.concern, self.banned, self.banned_round = ev.strategy_concern, ev.banned, ev.round
                self.round(ev.round).critic = ev
            case GateJudged():
                cand = self.candidates.get(ev.candidate)
                if cand is None:
                    return _unknown(ev.candidate)
                if ev.variant != cand.proposal.variant:
                    return f"judges {ev.candidate} on variant {ev.variant!r}; it was proposed on " \
                           f"{cand.proposal.variant!r}"
                cand.gate, cand.gate_position = ev, position
                self.round(ev.round).gates[ev.candidate] = ev
            case ApprovalRequested():
                cand = self.candidates.get(ev.candidate)
                if cand is None:
                    return _unknown(ev.candidate)
                cand.request = ev
                self.round(ev.round).approvals.append(ev)
            case ApprovalGiven():
                cand = self.candidates.get(ev.candidate)
                if cand is None:
                    return _unknown(ev.candidate)
                if cand.request is None:
                    return f"answers for candidate {ev.candidate}, for which no earlier approval_requested asked"
                cand.answer, cand.answer_position = ev, position
                self.answers[ev.candidate] = ev
            case HarnessShipped() | VariantForked():
                return self._ship(ShipRecord(ev, position, entry.seq))
            case VariantRetired():
                variant = self.variants.get(ev.variant)
                if variant is None or variant.retired:
                    return f"retires variant {ev.variant!r}, which is {'retired' if variant else 'not'} in the pool"
                variant.retired_round, variant.retired_position = ev.round, position
                self.routing = {c: v for c, v in self.routing.items() if v != ev.variant}
                self.round(ev.round).retired.append(ev)
            case HeldoutScored():
                self.heldout.append(ev)
                if ev.round >= 0:
                    self.round(ev.round).heldout.append(ev)
            case RoundDecided():
                self.round(ev.round).decided = ev
            case EvolutionFinished():
                self.finished = ev
        return ""

    def _ship(self, record: ShipRecord) -> str:
        ev = record.event
        missing = [c for c in record.candidates if c not in self.candidates]
        if missing:
            return _unknown(missing[0])
        base = self.variants.get(record.on)
        if base is None or base.retired:
            return f"edits variant {record.on!r}, which is {'retired' if base else 'not in the pool'}"
        version = HarnessVersion(record.round, record.position, record.seq, record.digest, ev.harness,
                                 kind=record.kind, candidates=list(record.candidates), operations=ev.operations,
                                 base=base.current.digest)
        if isinstance(ev, HarnessShipped):
            base.versions.append(version)
        else:
            if ev.variant in self.variants:
                return f"forks variant {ev.variant!r}, which already exists"
            self.variants[ev.variant] = Variant(ev.variant, [version], parent=ev.parent, born=ev.round)
            for cluster in ev.clusters:
                self.routing[cluster] = ev.variant
        self.shipments.append(record)
        self.round(record.round).ships.append(record)
        self.pending.append(record)
        for cid in record.candidates:
            cand = self.candidates[cid]
            cand.shipped_position = record.position
            p = cand.proposal
            self.ships.append(Ship(record.round, record.variant, cid, cand.levers, p.buckets, p.manifest,
                                   record.position))
        return ""

    # --- questions ----------------------------------------------------------------------------

    def round(self, n: int) -> RoundRecords:
        """The records of round ``n`` (created empty on first use)."""
        rnd = self.rounds.get(n)
        if rnd is None:
            rnd = self.rounds[n] = RoundRecords(n)
        return rnd

    def ordered(self) -> list[RoundRecords]:
        """The rounds in order."""
        return [self.rounds[n] for n in sorted(self.rounds)]

    @property
    def digests(self) -> dict[int, tuple[TaskDigest, ...]]:
        """Round -> its task digests."""
        return {n: r.digested.digests for n, r in sorted(self.rounds.items()) if r.digested is not None}

    @property
    def decisions(self) -> dict[int, RoundDecided]:
        """Round -> its decision."""
        return {n: r.decided for n, r in sorted(self.rounds.items()) if r.decided is not None}

    @property
    def model(self) -> str:
        """The task agent's model in force (the run's configured one until a ``ModelChanged``)."""
        if self.models:
            return self.models[-1].model
        return str(self.opened.settings.get("model", "")) if self.opened is not None else ""

    @property
    def model_since(self) -> int:
        """The round the model in force came into force."""
        return self.models[-1].round if self.models else 0

    @property
    def next_round(self) -> int:
        """The first round without a decision."""
        return max(self.decisions, default=-1) + 1

    @property
    def idle(self) -> int:
        """Rounds in a row without a ship, as of the last decision."""
        decisions = self.decisions
        return decisions[max(decisions)].idle if decisions else 0

    @property
    def root(self) -> str:
        """The initial variant (``v0``)."""
        return self.opened.variant if self.opened is not None else "v0"

    def live(self) -> list[str]:
        """The variants not retired, in the order they were made."""
        return [n for n, v in self.variants.items() if not v.retired]

    def route(self, cluster: str) -> str:
        """The variant a task cluster runs under: the one serving it, else ``unserved(cluster)``."""
        variant = self.routing.get(cluster)
        if variant is not None and variant in self.variants and not self.variants[variant].retired:
            return variant
        return self.unserved(cluster)

    def clusters(self) -> list[str]:
        """Every cluster the run has routed or run, in name order."""
        return sorted({*self.routing, *(d.cluster for digests in self.digests.values() for d in digests)})

    def success(self, cluster: str = "") -> dict[str, float]:
        """Each live variant's success: the share of its tasks (of ``cluster``, when named) solved in the latest
        round it ran any of them."""
        live = set(self.live())
        out: dict[str, float] = {}
        for digests in reversed(self.digests.values()):  # the newest round first: a variant's latest evidence wins
            ran: dict[str, list[bool]] = {}
            for d in digests:
                if not cluster or d.cluster == cluster:
                    ran.setdefault(d.variant, []).append(d.solved)
            out |= {v: sum(s) / len(s) for v, s in ran.items() if v in live and v not in out}
        return out

    def unserved(self, cluster: str = "") -> str:
        """The variant a cluster no variant serves runs under: the live one with the best success on the cluster's
        own tasks, or, when no live variant has run them (a cluster not run yet), the best overall ``success``.

        Ties go to the variant made first (the root before its forks); the root when no live variant has run a
        round yet. The cluster's own evidence comes first so that a cluster the root has been playing is not
        handed, unjudged by any gate, to a fork that did better elsewhere. A fold of the ledger: the loop and
        every reader of the ledger derive the same route.
        """
        rates = (self.success(cluster) if cluster else {}) or self.success()
        made = {name: i for i, name in enumerate(self.variants)}
        return max(rates, key=lambda v: (rates[v], -made[v]), default=self.root)

    def task_history(self, before: int) -> dict[str, list[bool]]:
        """Each task's pass@k states in the rounds before ``before``, oldest first."""
        out: dict[str, list[bool]] = {}
        for rnd, digests in self.digests.items():
            if rnd < before:
                for d in digests:
                    out.setdefault(d.task, []).append(d.solved)
        return out

    def ban_in_force(self, round: int) -> tuple[str, ...]:
        """The levers the last strategy concern bans for ``round`` (the round after the critic's)."""
        return self.banned if self.banned_round == round - 1 else ()

    def pending_approval(self) -> list[CandidateRecord]:
        """Candidates that passed the gate and wait for (or have) a human's answer, not yet shipped."""
        return [c for c in self.candidates.values()
                if c.gate is not None and c.gate.passed and not c.shipped_position and (c.waiting or c.approval)]

    def shipped(self) -> set[str]:
        """The candidates that shipped or forked."""
        return {s.candidate for s in self.ships}

    def as_of(self, round: int) -> dict[str, HarnessVersion]:
        """Each variant's harness version in force during ``round`` (shipped in earlier rounds), if it was live."""
        out: dict[str, HarnessVersion] = {}
        for name, variant in self.variants.items():
            if variant.retired_round is not None and variant.retired_round < round:
                continue
            version = variant.during(round)
            if version is not None:
                out[name] = version
        return out

    def active(self) -> dict[str, HarnessVersion]:
        """The current version of each variant not retired."""
        return {n: v.current for n, v in self.variants.items() if not v.retired and v.versions}

    def versions(self) -> list[tuple[str, HarnessVersion]]:
        """Every (variant, version), in ledger order."""
        return sorted(((n, v) for n, var in self.variants.items() for v in var.versions), key=lambda nv: nv[1].position)

    def regressions(self, round: int, digests: Sequence[TaskDigest]) -> tuple[Regression, ...]:
        """Tasks solved in the round before ``round`` and not in ``digests``, with the ships to their variant since."""
        before = {d.task: d for d in self.digests.get(round - 1, ())}
        out = []
        for d in digests:
            prev = before.get(d.task)
            if prev is not None and prev.solved and not d.solved:
                suspects = tuple(s.candidate for s in self.ships if s.round == round - 1 and s.variant == d.variant)
                out.append(Regression(task=d.task, variant=d.variant, since_round=round - 1, suspects=suspects))
        return tuple(out)

    def entry_of(self, event: LedgerEvent) -> LedgerEntry:
        """The entry (position, sequence) of an event the fold took."""
        return next(e for e in self.entries if e.event is event)

    @property
    def first_fault(self) -> Fault | None:
        """The fault at the earliest position (None when the ledger folded whole)."""
        return min(self.faults, key=lambda f: (f.position, f.seq)) if self.faults else None


def _unknown(candidate: str) -> str:
    return f"names candidate {candidate}, which no earlier candidate_proposed proposed"
