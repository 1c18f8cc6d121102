"""The checks of a run's edit ledger against what it cites on ``HX_TRACE``: rounds, gate attempts, evidence.

Reads only what the ledger cites, by subject: the run's round-level events (one read: each
trace round's purpose, and its attempts' verdicts from ``RoundFinished``) and one message per
evidence anchor. Never an attempt's frames, except for rounds logged before ``RoundFinished``
recorded the verdicts.

- every trace round a round digest, a gate verdict or a held-out score cites exists on the
  trace for the run, finished, and is what the citation says: a main rollout of that round, the
  candidate's own gate attempts, a held-out round;
- every gate verdict that reached the seesaw is decided again by the gate's rule
  (``hx.gate.rule.seesaw``) from those rounds' verdicts, the variant's solved tasks (the round's
  digests) and the candidate's predicted flips: the recorded flips, seesaw, interval (when the
  run's job asks for it: against the variant's own attempts, the round's digests) and effect
  checks, outcome and clusters must be what the rule gives;
- every cited round played the harness it stands for, and a held-out score's tasks ran under the routing the
  ledger gave then (``hx.replay.played``);
- every evidence anchor of the candidates and the round digests resolves to an event of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hx.gate.rule import Fresh, Verdict, seesaw
from hx.gate.sequential import SequentialRule, Tries, decide
from hx.replay.anchors import AnchorResolver
from hx.replay.ledger_checks import Problem, gate_interval, gate_rule, gate_suite
from hx.replay.played import played
from hx.replay.suite_checks import recheck_suite, scoreboard, suite_checked
from hx.replay.trace_rounds import TraceRound, Verdicts, outcomes, trace_marks
from projections.ledger import RunLedger
from projections.ledger_records import CandidateRecord, LedgerEntry
from schemas.edits import Anchor
from schemas.ledger import LedgerEvent
from streams.log import EventLog
from streams.topology import TRACE


@dataclass
class TraceCheck:
    """What checking a ledger against the trace found."""

    rounds: int = 0
    """Distinct trace rounds cited and found."""
    anchors: int = 0
    """Evidence anchors resolved to trace events of the run."""
    recomputed: int = 0
    """Gate verdicts whose seesaw the rule gave again from the cited rounds."""
    played: int = 0
    """Rounds that played the harness they stand for (``hx.replay.played``: a held-out score's every round)."""
    problems: list[Problem] = field(default_factory=list)
    bad_candidates: set[str] = field(default_factory=set)
    """Candidates whose verdict's inputs are not on the trace as cited."""
    bad_rounds: set[int] = field(default_factory=set)
    """Evolution rounds whose digest cites what is not on the trace."""
    unchecked: list[str] = field(default_factory=list)
    """What could not be checked against the trace, and why."""


async def check_trace(log: EventLog, ledger: RunLedger) -> TraceCheck:
    """Check every trace citation of the ledger, recompute every gate verdict's seesaw, resolve every anchor."""
    run_id = ledger.run_id
    marks = await trace_marks(log, run_id)
    out = TraceCheck()
    cited: set[int] = set()
    for rnd in ledger.ordered():
        if rnd.digested is not None:
            if _cited(out, marks, ledger.entry_of(rnd.digested), rnd.digested.trace_rounds, purpose="main",
                      stage=rnd.round):
                out.bad_rounds.add(rnd.round)
            cited.update(rnd.digested.trace_rounds)
    for scored in ledger.heldout:
        _cited(out, marks, ledger.entry_of(scored), (scored.trace_round,), purpose="heldout", stage=None)
        cited.add(scored.trace_round)
    for cand in ledger.candidates.values():
        gate = cand.gate
        if gate is not None:
            if _cited(out, marks, ledger.entry_of(gate), gate.trace_rounds, purpose="gate", stage=gate.round,
                      candidate=gate.candidate, variant=gate.variant):
                out.bad_candidates.add(gate.candidate)
            cited.update(gate.trace_rounds)
    out.rounds = len(cited & set(marks))
    gated = [c for c in ledger.candidates.values() if c.gate is not None and c.id not in out.bad_candidates
             and any(check.name == "seesaw" for check in c.gate.checks)]
    verdicts = await outcomes(log, run_id, [marks[r] for c in gated for r in _rounds(c) if r in marks])
    for cand in gated:
        why = recheck_seesaw(ledger, cand, verdicts)
        if why:
            out.problems.append(Problem("decision", f"event {cand.gate_position} (ledger.gate_judged): {why}",
                                        cand.gate_position))
            out.bad_candidates.add(cand.id)
        else:
            out.recomputed += 1
    digest = gate_suite(ledger)
    suited = [c for c in gated if c.id not in out.bad_candidates and suite_checked(c)]
    scores = await scoreboard(log) if suited else {}
    for cand in suited:
        why = recheck_suite(cand, digest, scores)
        if why:
            out.problems.append(Problem("decision", f"event {cand.gate_position} (ledger.gate_judged): {why}",
                                        cand.gate_position))
            out.bad_candidates.add(cand.id)
    harnesses = played(marks, ledger)  # after the recomputation: a verdict on rounds of another harness is named twice
    out.played = harnesses.rounds
    out.problems += harnesses.problems
    out.bad_rounds |= harnesses.bad_rounds
    out.bad_candidates |= harnesses.bad_candidates
    out.unchecked += harnesses.unchecked
    await _anchors(out, AnchorResolver(log, run_id), ledger)
    out.problems.sort(key=lambda p: p.position)
    return out


def _rounds(cand: CandidateRecord) -> tuple[int, ...]:
    assert cand.gate is not None
    return cand.gate.trace_rounds


def _cited(out: TraceCheck, marks: dict[int, TraceRound], entry: LedgerEntry, rounds: Sequence[int], *,
           purpose: str, stage: int | None, candidate: str = "", variant: str = "") -> bool:
    """Check that each cited round is on the trace, finished, and what the citation says; True when one is not."""
    bad = False
    for r in rounds:
        tr = marks.get(r)
        why = ""
        if tr is None:
            why = f"cites trace round {r}, which is not on {TRACE.name} for run {entry.event.run_id!r}"
        elif tr.finished is None:
            why = f"cites trace round {r}, which never finished"
        elif tr.labelled:
            s = tr.started
            said = s.purpose if s.split != "heldout" else "heldout"
            if said != purpose or (stage is not None and s.stage_round != stage) or \
                    (candidate and s.candidate != candidate) or (variant and s.variant != variant):
                want = f"{purpose} round" + (f" of round {stage}" if stage is not None else "") + (
                    f" for {candidate} on {variant}" if candidate else "")
                got = f"{said} round" + (f" of round {s.stage_round}" if s.stage_round >= 0 else "") + (
                    f" for {s.candidate} on {s.variant}" if s.candidate else "")
                why = f"cites trace round {r} as a {want}; the trace says it is a {got}"
        if why:
            out.problems.append(Problem("input", f"{entry.label}: {why}", entry.position))
            bad = True
    return bad


def recheck_seesaw(ledger: RunLedger, cand: CandidateRecord, verdicts: dict[int, Verdicts]) -> str:
    """Why the gate's rule, applied again to the cited rounds, does not give the recorded verdict ("" when it does)."""
    gate = cand.gate
    assert gate is not None
    digested = ledger.rounds[gate.round].digested if gate.round in ledger.rounds else None
    mine = [d for d in (digested.digests if digested else ()) if d.variant == gate.variant]
    solved = [d.task for d in mine if d.solved]
    failing = {d.task for d in mine if not d.solved}
    flips = [t for t in dict.fromkeys(cand.proposal.manifest.predicted_flips) if t in failing and t not in solved]
    rule = gate_rule(ledger)
    base = {d.task: Tries(d.attempts, d.passes) for d in mine if d.task in (*solved, *flips)}
    fresh = _fresh(solved, flips, [verdicts.get(r, {}) for r in gate.trace_rounds], rule, base)
    if isinstance(fresh, str):
        return fresh
    before = [c for c in gate.checks if c.name not in ("seesaw", "interval", "suite", "effect")]
    # the suite check is decided again from its eval runs (``recheck_suite``): here it is taken as recorded
    suite = next((c for c in gate.checks if c.name == "suite"), None)
    again = seesaw(Verdict(checks=list(before)), fresh, allow_fork=ledger.opened is not None
                   and ledger.opened.strategy == "ensemble", interval=gate_interval(ledger), suite=suite,
                   rule=rule)
    recorded = Verdict.of(gate)
    if again.checks != recorded.checks:
        said = {c.name: c for c in recorded.checks}
        for c in again.checks[len(before):]:
            was = said.get(c.name)
            if was != c:
                shown = f"{'passed' if was.passed else 'failed'} ({was.detail})" if was else "missing"
                return (f"its {c.name} check is {shown}; from the trace rounds it cites "
                        f"({', '.join(map(str, gate.trace_rounds)) or 'none'}) the gate's rule gives "
                        f"{'passed' if c.passed else 'failed'} ({c.detail})")
        return "it records checks after the seesaw that the gate's rule does not give"
    if again.flips != recorded.flips:
        diff = next((f"{a.task}: {a.passes}/{a.attempts} passed" for a, b in zip(again.flips, recorded.flips,
                                                                                  strict=False) if a != b),
                    f"{len(again.flips)} flips against {len(recorded.flips)}")
        return f"its flips are not what the trace rounds it cites show ({diff})"
    if (again.outcome, again.clusters) != (recorded.outcome, recorded.clusters):
        return f"its outcome {recorded.outcome} is not what the gate's rule gives from the trace: {again.outcome}"
    return ""


def _fresh(solved: Sequence[str], flips: Sequence[str], rounds: Sequence[Verdicts], rule: SequentialRule | None,
           base: dict[str, Tries]) -> Fresh | str:
    """The candidate's fresh attempts as the gate saw them, from its rounds' verdicts (or why they do not fit)."""
    if not solved and not flips:
        return Fresh(solved={}, flips={}) if not rounds else "it cites trace rounds for a variant with nothing to run"
    if not rounds:
        return "it cites no trace round for its fresh attempts"
    paired, *later = rounds
    tries = _count(paired)
    wanted = [*solved, *flips]
    if sorted(tries) != sorted(wanted):
        return (f"its first trace round ran {', '.join(sorted(tries)) or 'nothing'}; the gate runs the variant's "
                f"solved tasks and the predicted flips ({', '.join(wanted)})")
    first = {t: tries[t] for t in solved}
    out = Fresh(solved=first, flips={t: tries[t] for t in flips}, base=base)
    why = _waves(out, later, rule) if rule is not None else _retries(out, later)
    return why or out


def _count(rounds: Verdicts, before: dict[str, Tries] | None = None) -> dict[str, Tries]:
    """Attempts and passes per task of a round's verdicts, added to ``before``."""
    out = dict(before or {})
    for (task, _), passed in rounds.items():
        out[task] = out.get(task, Tries(0, 0)) + Tries(1, int(passed))
    return out


def _retries(fresh: Fresh, rounds: Sequence[Verdicts]) -> str:
    """The ``retry`` rule's waves into ``fresh.retries`` (or why they are not the losses the rule retries)."""
    lost = [t for t, tries in fresh.solved.items() if tries.passes == 0]
    for wave in rounds:
        ran = sorted({task for task, _ in wave})
        if ran != sorted(lost):
            return (f"a retry round ran {', '.join(ran) or 'nothing'}; the solved tasks still lost were "
                    f"{', '.join(lost)}")
        fresh.retries.update(_count(wave, fresh.retries))
        lost = [t for t in lost if fresh.retries[t].passes == 0]
    return ""


def _waves(fresh: Fresh, rounds: Sequence[Verdicts], rule: SequentialRule) -> str:
    """The sequential rule's waves (a base round, then a candidate round) into ``fresh.waves`` (or why not)."""
    if len(rounds) % 2:
        return f"it cites {len(rounds)} trace round(s) after its paired one; the sequential rule plays them in pairs"
    zero = Tries(0, 0)
    going = [t for t in sorted(fresh.solved)
             if decide(rule, fresh.base.get(t, zero), fresh.solved[t], waves=1) == "continue"]
    for i in range(0, len(rounds), 2):
        wave = 2 + i // 2
        base_ran, cand_ran = (sorted({task for task, _ in r}) for r in rounds[i:i + 2])
        if wave > rule.waves or base_ran != going or cand_ran != going:
            return (f"its wave {wave} ran {', '.join(cand_ran) or 'nothing'}; the sequential rule plays "
                    f"{', '.join(going) or 'no wave'} there")
        more_base, more = _count(rounds[i]), _count(rounds[i + 1])
        for t in going:
            b0, c0, _ = fresh.waves.get(t, (zero, zero, 1))
            fresh.waves[t] = (b0 + more_base[t], c0 + more[t], wave)
        going = [t for t in going if decide(rule, fresh.base.get(t, zero) + fresh.waves[t][0],
                                            fresh.solved[t] + fresh.waves[t][1], waves=wave) == "continue"]
    return ""


async def _anchors(out: TraceCheck, resolver: AnchorResolver, ledger: RunLedger) -> None:
    """Resolve the evidence of every candidate (as proposed and as revised) and every round digest."""
    cited: list[tuple[LedgerEvent, tuple[Anchor, ...], str]] = []
    for cand in ledger.candidates.values():
        cited.append((cand.first, cand.first.manifest.evidence, cand.id))
        if cand.revision is not None:
            cited.append((cand.revision, cand.revision.manifest.evidence, cand.id))
    cited += [(r.digested, tuple(a for d in r.digested.digests for a in d.evidence), "")
              for r in ledger.ordered() if r.digested is not None]
    await resolver.prefetch(a.seq for _, evidence, _ in cited for a in evidence)  # every cited message at once
    for event, evidence, candidate in sorted(cited, key=lambda c: ledger.entry_of(c[0]).position):
        entry = ledger.entry_of(event)
        for resolved in await resolver.resolve_all(evidence):
            if resolved.resolved:
                out.anchors += 1
                continue
            a = resolved.anchor
            out.problems.append(Problem("input", f"{entry.label}: evidence anchor {a.seq}:{a.index} "
                                                 f"({a.note or 'no note'}) is unresolved: {resolved.problem}",
                                        entry.position))
            if candidate:
                out.bad_candidates.add(candidate)
