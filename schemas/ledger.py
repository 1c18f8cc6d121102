"""The edit ledger: what AEGIS decided, round by round, as immutable events on ``HX_LEDGER``.

Every event of a run's ledger names the run and carries ``prev``, the digest of the event
before it (``ledger_digest``), so the ledger of a run is a hash chain: an edited, dropped
or reordered event breaks it. The events carry the edits (``schemas.edits``) and the
round's digests and landscape (``schemas.landscape``); the gate's checks, a round's
metrics and the held-out scores are defined here, since only these events carry them.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from schemas.edits import AnyEditOp, Bucket, CodeAsset, Manifest
from schemas.envelope import encode_body, later_fields
from schemas.event import Event, Payload
from schemas.harness import HarnessSpec
from schemas.landscape import Landscape, TaskDigest
from schemas.messages import Usage, summed

RoundOutcome = Literal["below_actionability", "empty_landscape", "no_candidate", "all_rejected", "waiting",
                       "shipped"]


# --- value types the events carry -------------------------------------------------------------


class GateCheck(Payload, frozen=True, kw_only=True):
    """One deterministic check of the gate and how it came out."""

    name: str
    passed: bool
    detail: str = ""


class TaskFlip(Payload, frozen=True, kw_only=True):
    """A task's pass state before (the variant's last round) and under the candidate (fresh attempts)."""

    task: str
    before: bool
    after: bool
    attempts: int = 0
    passes: int = 0
    base_attempts: int = 0
    """The variant's attempts of the task on the same seeds (its main rollout's, and its waves under the
    sequential rule); 0 where a verdict did not record them (before the sequential rule)."""
    base_passes: int = 0
    decision: str = ""
    """``held`` or ``regressed`` (a solved task), ``gained`` or ``missed`` (a predicted flip); "" before it was
    recorded."""


class RoundTokens(Payload, frozen=True, kw_only=True):
    """The tokens (and provider-reported cost) a round spent: the meta-model per stage, the task agent per task.

    The task agent's figures cover the same attempts as ``RoundMetrics.rollouts``; a stage that made no
    call (an offline evolver, a random agent) is counted as zeros, never left blank.
    """

    meta: dict[str, Usage] = {}
    """Stage (``digester``, ``planner``, ``evolver``, ``revise``, ``critic``) -> its meta-model calls this round;
    every stage is listed, zeros when it made no call."""
    agent: Usage = Usage()
    """Every model call of the round's attempts."""
    tasks: dict[str, Usage] = {}
    """Task -> its attempts' calls (empty when a trace round had too many attempts to list them)."""

    @property
    def meta_total(self) -> Usage:
        """The meta-model's calls over every stage."""
        return summed(self.meta.values())


class RoundMetrics(Payload, frozen=True, kw_only=True):
    """What a round measured: adaptation pass@k, and how good the loop's predictions were."""

    tasks: int = 0
    passes: int = 0
    pass_at_k: float | None = None
    """Mean over the round's adaptation tasks of pass@k (k = attempts per task)."""
    predicted: int = 0
    """Flips the previous round's ships predicted, on tasks this round evaluated."""
    realised: int = 0
    attribution: float | None = None
    """Of the realised flips, the share on which the shipped processor triggered."""
    regressions: int = 0
    lever_mix: dict[str, int] = {}
    """Shipped edits so far per bucket."""
    rollouts: int = 0
    """Attempts this round ran: its main rollouts and its gate evaluations (retries included; held-out rounds and
    co-evolution's policy gate are not), counted on the log from the trace rounds the round cites."""
    tokens: RoundTokens | None = None
    """The tokens of the meta-model's stages and of those attempts (None: decided before hx counted tokens)."""

    @property
    def hit_rate(self) -> float | None:
        """The previous round's ships' hit rate: realised over predicted flips (None when nothing was predicted)."""
        return self.realised / self.predicted if self.predicted else None


class GameScore(Payload, frozen=True, kw_only=True):
    """Aggregate held-out figures of one game: no per-task verdict."""

    game: str
    tasks: int
    pass_at_1: float | None = None
    pass_at_2: float | None = None


# --- the ledger events --------------------------------------------------------------------------


class LedgerEvent(Event, frozen=True, kw_only=True):
    """Base of every ledger event: the run, the digest of the run's previous ledger event, and its signature."""

    VERSION = 3
    READS = (1, 2)
    """Version 1 had no ``signature`` (and ``ledger.opened`` no ``public_key``); version 2 no ``at_ns``."""

    run_id: str
    prev: str = ""
    """``ledger_digest`` of the event before this one in the run's ledger (empty for the first)."""
    signature: str = ""
    """``ed25519:<base64>``: the writer's signature over this event's ``ledger_digest`` (empty: unsigned, as every
    event written before hx signed its ledgers). Left out of the digest it signs."""
    at_ns: int = 0
    """When the event was recorded (wall clock, ns). In the body, unlike a trace event's time, so that the digest
    and the signature cover it: an auditor can trust when a decision was made. 0: recorded before hx kept it."""


class LedgerOpened(LedgerEvent, frozen=True, kw_only=True):
    """An evolution run began: its initial harness (variant ``v0``) and settings."""

    TYPE = "ledger.opened"

    strategy: str
    harness: HarnessSpec
    """The initial harness (``HarnessConfig.spec()``)."""
    digest: str
    variant: str = "v0"
    settings: dict[str, Any] = {}
    """The run's job as plain data (``hx.aegis.job.EvolveJob``, credentials masked), read back typed by
    ``recorded_job`` (the flat shape older runs wrote too). Plain data here, not the Struct: the job's types
    live above this layer, and a signed event must re-encode to the bytes it was chained by."""
    heldout_digest: str = ""
    public_key: str = ""
    """``ed25519:<hex>``: the key every event of this ledger is signed with (empty: an unsigned ledger)."""


class RoundDigested(LedgerEvent, frozen=True, kw_only=True):
    """The digester's output for a round, with the actionability score."""

    TYPE = "ledger.round_digested"

    round: int
    actionability: float
    digests: tuple[TaskDigest, ...] = ()
    trace_rounds: tuple[int, ...] = ()
    """The trace rounds (``hx.trace.<run>.<round>``) the digests were read from."""
    rested: tuple[str, ...] = ()
    """Adaptation tasks that sat out the round (co-evolution's ``rest_barren``), in name order."""


class ModelChanged(LedgerEvent, frozen=True, kw_only=True):
    """From this round on the task agent runs another model (co-evolution's policy after a learner pass).

    Written before the round's rollouts, only when the model differs from the one in force
    (the run's configured model until the first of these): the round's digests and the gate's
    verdicts are made under it, and a verdict holds for the (harness, model) pair it judged.
    """

    TYPE = "ledger.model_changed"

    round: int
    model: str
    """The task agent's model spec from ``round`` on (``policy:<version>`` for a trained policy)."""
    previous: str = ""


class LandscapePlanned(LedgerEvent, frozen=True, kw_only=True):
    """The planner's landscape for a round."""

    TYPE = "ledger.landscape_planned"

    round: int
    landscape: Landscape


class CandidateProposed(LedgerEvent, frozen=True, kw_only=True):
    """An evolver proposed a candidate: typed operations on a variant, with its manifest."""

    TYPE = "ledger.candidate_proposed"

    round: int
    candidate: str
    variant: str
    evolver: str
    operations: tuple[AnyEditOp, ...]
    buckets: tuple[Bucket, ...]
    dimensions: tuple[str, ...] = ()
    manifest: Manifest
    base_digest: str
    digest: str
    """The digest of the harness the operations produce (empty when they do not build)."""
    code: tuple[CodeAsset, ...] = ()
    risk: float = 0.0
    build_error: str = ""
    """Why the operations do not build a valid harness (the gate then rejects it)."""


class CandidateRevised(LedgerEvent, frozen=True, kw_only=True):
    """A candidate changed after the critic's (single) revision request."""

    TYPE = "ledger.candidate_revised"

    round: int
    candidate: str
    reason: str
    operations: tuple[AnyEditOp, ...]
    manifest: Manifest
    digest: str
    build_error: str = ""


class CandidateConcern(Payload, frozen=True, kw_only=True):
    """The critic's objections to one candidate."""

    candidate: str
    concerns: tuple[str, ...]


class CriticJudged(LedgerEvent, frozen=True, kw_only=True):
    """The critic's verdict on a round's candidates: a ship ranking, or no-op."""

    TYPE = "ledger.critic_judged"

    round: int
    ranking: tuple[str, ...] = ()
    no_op: bool = False
    concerns: tuple[CandidateConcern, ...] = ()
    revisions: tuple[str, ...] = ()
    """Candidates it asked to revise (once)."""
    strategy_concern: str = ""
    banned: tuple[str, ...] = ()
    """Levers the strategy concern bans for the next round."""
    critic: str = "deterministic"
    overlaps: tuple[CandidateConcern, ...] = ()
    """Per candidate, what it shares with the harness it edits (groups it touches, hooks it joins)."""
    unaddressed: tuple[str, ...] = ()
    """The round's regressions no candidate addresses or accepts with a reason: the round is a no-op."""


class ApprovalRequested(LedgerEvent, frozen=True, kw_only=True):
    """A candidate above the risk threshold waits for a human."""

    TYPE = "ledger.approval_requested"

    round: int
    candidate: str
    risk: float
    reason: str


class ApprovalGiven(LedgerEvent, frozen=True, kw_only=True):
    """A human answered an approval request."""

    TYPE = "ledger.approval_given"

    candidate: str
    approved: bool
    by: str = ""
    note: str = ""


class GateJudged(LedgerEvent, frozen=True, kw_only=True):
    """The deterministic gate's verdict on one candidate: every check, the first failure, per-task flips."""

    TYPE = "ledger.gate_judged"

    round: int
    candidate: str
    variant: str
    passed: bool
    checks: tuple[GateCheck, ...]
    first_failure: str = ""
    flips: tuple[TaskFlip, ...] = ()
    outcome: Literal["ship", "fork", "reject"] = "reject"
    clusters: tuple[str, ...] = ()
    """For a fork: the task clusters the new variant would serve."""
    trace_rounds: tuple[int, ...] = ()
    """The trace rounds of the gate's fresh attempts."""


class HarnessShipped(LedgerEvent, frozen=True, kw_only=True):
    """A variant's harness changed: the candidates shipped, digests before and after, the new harness."""

    TYPE = "ledger.harness_shipped"

    round: int
    variant: str
    candidates: tuple[str, ...]
    digest_before: str
    digest_after: str
    operations: tuple[AnyEditOp, ...]
    harness: HarnessSpec
    """The harness the operations made (``HarnessConfig.spec()``)."""


class VariantForked(LedgerEvent, frozen=True, kw_only=True):
    """A candidate that helps some tasks and hurts others became a variant of its own."""

    TYPE = "ledger.variant_forked"

    round: int
    parent: str
    variant: str
    candidate: str
    digest: str
    operations: tuple[AnyEditOp, ...]
    harness: HarnessSpec
    """The harness the operations made (``HarnessConfig.spec()``)."""
    clusters: tuple[str, ...] = ()
    """The task clusters the new variant serves better."""


class VariantRetired(LedgerEvent, frozen=True, kw_only=True):
    """A variant left the pool (the weakest, when the pool was full)."""

    TYPE = "ledger.variant_retired"

    round: int
    variant: str
    reason: str


class HeldoutScored(LedgerEvent, frozen=True, kw_only=True):
    """The frozen held-out split evaluated: aggregates only."""

    TYPE = "ledger.heldout_scored"

    round: int
    trace_round: int
    heldout_digest: str
    tasks: int
    pass_at_1: float | None = None
    pass_at_2: float | None = None
    games: tuple[GameScore, ...] = ()


class RoundDecided(LedgerEvent, frozen=True, kw_only=True):
    """What a round did and why: below actionability, empty landscape, no candidate, all rejected, shipped."""

    TYPE = "ledger.round_decided"

    round: int
    outcome: RoundOutcome
    reason: str = ""
    shipped: tuple[str, ...] = ()
    metrics: RoundMetrics = RoundMetrics()
    idle: int = 0
    """Rounds in a row without a ship, this one included (patience counts these)."""


class EvolutionFinished(LedgerEvent, frozen=True, kw_only=True):
    """The run ended: why, after how many rounds."""

    TYPE = "ledger.evolution_finished"

    rounds: int
    status: Literal["completed", "patience", "failed", "cancelled"] = "completed"
    reason: str = ""


LEDGER_EVENTS: tuple[type[LedgerEvent], ...] = (
    LedgerOpened, ModelChanged, RoundDigested, LandscapePlanned, CandidateProposed, CandidateRevised, CriticJudged,
    ApprovalRequested, ApprovalGiven, GateJudged, HarnessShipped, VariantForked, VariantRetired, HeldoutScored,
    RoundDecided, EvolutionFinished)


# The digest leaves out ``signature`` (it signs the digest) and an empty ``public_key``: an event written before
# ledgers were signed digests to the very bytes it was chained by then.
_plain = msgspec.msgpack.Encoder()  # keeps a map's order: the body's own (fields in order, nested maps sorted)
# Fields added to ledger events later (``later_fields`` below) are left out of the body at their defaults, so an
# event of an older shape digests (and encodes) to the very bytes it was chained by.


def digested_body(event: LedgerEvent) -> bytes:
    """The bytes a ledger event's digest covers: its encoded body without its signature (nor an empty key)."""
    fields: dict[str, Any] = msgspec.msgpack.decode(encode_body(event))
    del fields["signature"]
    for absent in ("public_key", "at_ns"):  # fields added later: their empty values leave old digests as they were
        if fields.get(absent) in ("", 0):
            del fields[absent]
    return _plain.encode(fields)


def ledger_digest(event: LedgerEvent) -> str:
    """The digest a ledger event is chained and signed by: sha256 over its type and its body without signature."""
    return "sha256:" + hashlib.sha256(type(event).TYPE.encode() + b"\0" + digested_body(event)).hexdigest()


def chained(event: LedgerEvent, prev: str) -> LedgerEvent:
    """``event`` with ``prev`` set: the next link of a chain whose head is ``prev``."""
    return msgspec.structs.replace(event, prev=prev)


_MANIFEST_LATER = {"capability_evidence": (), "stabilise": (), "expected_min_calls": 0, "accepted_regressions": ()}
later_fields(CandidateProposed, {"manifest": _MANIFEST_LATER})
later_fields(CandidateRevised, {"manifest": _MANIFEST_LATER})
later_fields(GateJudged, {"flips": [{"base_attempts": 0, "base_passes": 0, "decision": ""}]})
later_fields(CriticJudged, {"overlaps": (), "unaddressed": ()})
later_fields(RoundDecided, {"metrics": {"tokens": None}})
"""``RoundMetrics.tokens``: None on a round decided before hx counted tokens."""
