"""A run's directory (the layout of the HarnessX paper, appendix E.1), rendered from its edit ledger alone.

``render(records)`` folds a run's ledger events (``RunFold``) and returns every file of
the directory as bytes by relative path: ``INDEX.md``, ``journal.md``, ``curves.json``,
``scoreboard.json``, ``audit.jsonl``, ``data/``, one ``R<n>/`` folder per round
(``hx.report.export_rounds``) and the marker ``.hx-export`` (``ExportMarker``: which run, which
hx; ``hx export --force`` replaces only a directory that carries one). Nothing comes from
memory or the clock: the same ledger gives the same bytes. Trajectories are read from the
trace by the command (``hx export --trajectories``); ``render`` only links the files it was
told exist.

>>> from hx.harness.config import HarnessConfig
>>> from schemas.ledger import LedgerOpened
>>> h = HarnessConfig()
>>> files = render([LedgerOpened(run_id="r", strategy="global", harness=h.spec(), digest=h.digest)])
>>> sorted(files)[:4]
['.hx-export', 'INDEX.md', 'audit.jsonl', 'curves.json']
>>> ExportMarker.read(files[MARKER]).run_id
'r'
>>> files["INDEX.md"].splitlines()[0]
b'# Evolution run `r`'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

import msgspec

from hx.aegis import levers
from hx.harness.edits import describe
from hx.report.export_fold import RunFold, json_text, link, rate, ratio, rule_ops, table
from hx.report.export_journal import journal
from hx.report.export_rounds import (
    applied_path,
    candidate_path,
    round_files,
    verdict_path,
)
from hx.report.export_tokens import curve_tokens, token_rows
from projections.ledger_records import RoundRecords, Ship
from schemas.edits import BUCKETS
from schemas.job import nested_job
from schemas.ledger import HarnessShipped, LedgerEvent, ledger_digest
from schemas.rules import sentence, support_phrase

TrajectoryFiles = Mapping[int, Mapping[str, Sequence[str]]]
"""Round -> task -> the names of its trajectory files in ``R<n>/trajectories/``."""
_VALUE_WIDTH = 100
_LIST_SHOWN = 4
MARKER = ".hx-export"
"""The file every export directory carries (``ExportMarker``): a directory without it is no export."""


ExportKind = Literal["hx export", "hx export --inspect"]
"""A run's directory, or its evaluations as Inspect AI eval logs (``hx.report.inspect_export``)."""


class ExportMarker(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``.hx-export`` holds: that ``hx export`` wrote the directory (which kind of export), which run, which hx."""

    kind: ExportKind = "hx export"
    run_id: str
    hx_version: str

    def encode(self) -> str:
        """The marker file's text (one JSON line)."""
        return msgspec.json.encode(self).decode() + "\n"

    @classmethod
    def read(cls, data: bytes) -> ExportMarker:
        """The marker in a file's bytes; ``msgspec.DecodeError`` when they are not one."""
        return msgspec.json.decode(data, type=cls)


def hx_version() -> str:
    """The installed hx's version (``unknown`` when run from a tree that is not installed)."""
    try:
        return version("hx-foundry")
    except PackageNotFoundError:
        return "unknown"


class AuditLine(msgspec.Struct, frozen=True):
    """One ledger event as ``audit.jsonl`` holds it: its place, its chain links, its body."""

    position: int
    type: str
    version: int
    prev: str
    digest: str
    event: Any


def render(records: Sequence[LedgerEvent], trajectories: TrajectoryFiles | None = None) -> dict[str, bytes]:
    """Every file of a run's directory, by relative path, from the run's ledger records."""
    fold = RunFold.of(records)
    trajectories = trajectories or {}
    files: dict[str, str] = {
        "journal.md": journal(fold), "curves.json": json_text(curves(fold)),
        "scoreboard.json": json_text(scoreboard(fold)), "audit.jsonl": audit(fold.records),
        "data/task_history.jsonl": _jsonl(task_history(fold)),
        "data/ship_outcomes.json": json_text([ship_outcome(fold, s) for s in fold.state.ships]),
        "data/rejected_candidates.jsonl": _jsonl(rejected(fold)),
        "data/rules.jsonl": _jsonl([r.as_dict() for r in fold.rules()]),
        "data/tokens.jsonl": _jsonl([row for rnd in fold.ordered() for row in token_rows(
            rnd.round, rnd.decided.metrics.tokens if rnd.decided else None)])}
    for rnd in fold.ordered():
        files |= round_files(fold, rnd, trajectories.get(rnd.round, {}))
    files["INDEX.md"] = index(fold, files, trajectories)
    files[MARKER] = ExportMarker(run_id=fold.opened.run_id, hx_version=hx_version()).encode()
    return {path: text.encode() for path, text in sorted(files.items())}


def _jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(msgspec.json.encode(row).decode() + "\n" for row in rows)


def audit(records: Sequence[LedgerEvent]) -> str:
    """Every ledger event in order, one JSON line each, with the digest the next one chains to."""
    lines = (AuditLine(i, type(r).TYPE, type(r).VERSION, r.prev, ledger_digest(r), r) for i, r in enumerate(records, 1))
    return "".join(msgspec.json.encode(line).decode() + "\n" for line in lines)


def task_history(fold: RunFold) -> list[dict[str, Any]]:
    """One row per (round, task): where it ran and how it fared."""
    return [{"round": r, "task": d.task, "cluster": d.cluster, "variant": d.variant, "attempts": d.attempts,
             "passes": d.passes, "solved": d.solved, "category": d.category, "continuity": d.continuity,
             "implicated": list(d.implicated)} for r in sorted(fold.state.digests) for d in fold.state.digests[r]]


def ship_outcome(fold: RunFold, ship: Ship) -> dict[str, Any]:
    """One ship (or fork) of a candidate: what it predicted, what the next round showed, and attribution."""
    nxt = {d.task: d for d in fold.state.digests.get(ship.round + 1, ())}
    tested = [t for t in ship.manifest.predicted_flips if t in nxt]
    realised = [t for t in tested if nxt[t].solved]
    attributed = [t for t in realised if ship.manifest.attribution in nxt[t].implicated]
    forked = any(s.kind == "fork" and ship.candidate in s.candidates for s in fold.ships)
    return {"round": ship.round, "kind": "fork" if forked else "ship", "variant": ship.variant,
            "candidate": ship.candidate, "levers": list(ship.levers), "buckets": list(ship.buckets),
            "predicted_flips": list(ship.manifest.predicted_flips),
            "next_round": ship.round + 1 if nxt else None, "predicted": len(tested), "realised": len(realised),
            "realised_tasks": realised, "missed_tasks": [t for t in tested if t not in realised],
            "hit_rate": ratio(len(realised), len(tested)), "attribution": ship.manifest.attribution,
            "attributed": len(attributed), "attribution_rate": ratio(len(attributed), len(realised)),
            "rules": rule_ops(fold.final(ship.candidate).operations)}


def rejection(fold: RunFold, cid: str) -> tuple[str, str, str]:
    """(stage, reason, detail) of a candidate that did not ship: the gate's first failure or the critic's reason."""
    cand = fold.state.candidates[cid]
    rnd = fold.round(cand.proposal.round)
    gate = cand.gate
    if gate is not None and not gate.passed:
        check = next((c for c in gate.checks if c.name == gate.first_failure), None)
        return "gate", gate.first_failure, check.detail if check else ""
    if gate is not None:
        if gate.outcome == "fork":
            return "gate", "fork not made", "it passed as a fork; the round forked another or the strategy is global"
        if cand.approval is False:
            given = fold.answers.get(cid)
            return "approval", "rejected by a human", given.note if given else ""
        if cand.waiting:
            return "approval", "waiting for approval", ""
        return "ship", "passed the gate, not shipped", "its variant changed or a candidate in its bucket shipped"
    critic = rnd.critic
    concerns = "; ".join(x for c in (critic.concerns if critic else ()) if c.candidate == cid for x in c.concerns)
    if critic is None:
        return "critic", "not judged", rnd.decided.reason if rnd.decided else "the run stopped before the critic"
    if critic.no_op or cid not in critic.ranking:
        return "critic", "no-op" if critic.no_op else "left out of the ranking", concerns
    first = [s for s in rnd.ships if cand.proposal.variant in (s.variant, s.on)]
    return "gate", "not gated", (f"ranked, but {'+'.join(first[0].candidates)} shipped or forked from its variant "
                                 "first" if first else "ranked, but its variant or bucket was taken")


def rejected(fold: RunFold) -> list[dict[str, Any]]:
    """Every candidate not shipped (nor forked), with why."""
    out = []
    shipped = fold.shipped()
    for cid, cand in fold.state.candidates.items():
        if cid in shipped:
            continue
        stage, reason, detail = rejection(fold, cid)
        p = cand.proposal
        out.append({"round": p.round, "candidate": cid, "variant": p.variant, "evolver": p.evolver,
                    "operations": [describe(op) for op in p.operations], "levers": list(cand.levers),
                    "buckets": list(p.buckets), "risk": p.risk, "predicted_flips": list(p.manifest.predicted_flips),
                    "stage": stage, "reason": reason, "detail": detail, "build_error": p.build_error,
                    "rules": rule_ops(p.operations)})
    return out


def curves(fold: RunFold) -> dict[str, Any]:
    """Per round: adaptation pass@k, tasks, passes, rollouts, tokens; held-out figures by round (-1: before the
    first)."""
    rows = []
    for rnd in fold.ordered():
        digests = rnd.digested.digests if rnd.digested else ()
        m = rnd.decided.metrics if rnd.decided else None
        passes = sum(d.solved for d in digests)
        rows.append({"round": rnd.round, "outcome": rnd.decided.outcome if rnd.decided else None,
                     "tasks": m.tasks if m else len(digests), "passes": m.passes if m else passes,
                     "pass_at_k": m.pass_at_k if m else ratio(passes, len(digests)),
                     "rollouts": m.rollouts if m else None, "regressions": m.regressions if m else None,
                     "predicted": m.predicted if m else None, "realised": m.realised if m else None,
                     "attribution": m.attribution if m else None,
                     "actionability": rnd.digested.actionability if rnd.digested else None,
                     "variants": sorted({d.variant for d in digests}),
                     "shipped": list(rnd.decided.shipped) if rnd.decided else [],
                     "tokens": curve_tokens(m.tokens if m else None)})
    held = [{"round": h.round, "trace_round": h.trace_round, "tasks": h.tasks, "pass_at_1": h.pass_at_1,
             "pass_at_2": h.pass_at_2, "games": msgspec.to_builtins(h.games)} for h in fold.heldout]
    return {"run": fold.opened.run_id, "rounds": rows, "heldout": held}


def scoreboard(fold: RunFold) -> dict[str, Any]:
    """Ships and forks, and each bucket's and lever's record: proposed, shipped, predicted, realised, hit rate."""
    state = fold.state
    ships = []
    for record in fold.ships:
        s = record.event
        cands = [state.candidates[c] for c in record.candidates if c in state.candidates]
        entry: dict[str, Any] = {"round": s.round, "kind": record.kind,
                                 "variant": s.variant, "candidates": list(record.candidates),
                                 "levers": list(dict.fromkeys(v for c in cands for v in c.levers)),
                                 "buckets": list(dict.fromkeys(b for c in cands for b in c.proposal.buckets))}
        if isinstance(s, HarnessShipped):
            entry |= {"digest_before": s.digest_before, "digest_after": s.digest_after}
        else:
            entry |= {"parent": s.parent, "digest_after": s.digest, "clusters": list(s.clusters)}
        ships.append(entry)
    outcomes = [(s, levers.ship_outcome(state, s)) for s in state.ships]
    buckets = {}
    for b in BUCKETS:
        mine = [o for s, o in outcomes if b in s.buckets]
        predicted, realised = sum(p for p, _ in mine), sum(r for _, r in mine)
        buckets[b] = {"proposed": sum(b in c.proposal.buckets for c in state.candidates.values()),
                      "shipped": len(mine), "predicted": predicted, "realised": realised,
                      "hit_rate": ratio(realised, predicted)}
    names = sorted({v for c in state.candidates.values() for v in c.levers})
    banned = state.ban_in_force(state.next_round)
    lever_rows = {v.name: {"bucket": v.bucket, "dimension": v.dimension, "proposed": v.proposed,
                           "shipped": v.shipped, "predicted": v.predicted, "realised": v.realised,
                           "hit_rate": ratio(v.realised, v.predicted), "banned": v.banned}
                  for v in levers.records(state, names, banned)}
    return {"run": fold.opened.run_id, "ships": ships, "buckets": buckets, "levers": lever_rows}


def _value(value: Any) -> str:
    if isinstance(value, list | tuple) and len(value) > _LIST_SHOWN:
        shown = ", ".join(str(v) if not isinstance(v, dict) else "{...}" for v in value[:_LIST_SHOWN])
        return f"{len(value)} items: {shown}, ..."
    text = msgspec.json.encode(value).decode() if not isinstance(value, str) else value
    return text if len(text) <= _VALUE_WIDTH else text[:_VALUE_WIDTH] + "..."


def _settings(settings: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            rows += _settings(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", _value(value)))
    return rows


def _round_links(rnd: RoundRecords, files: Mapping[str, str], trajectories: Mapping[str, Sequence[str]]) -> str:
    n, d = rnd.round, rnd.decided
    head = f"### Round {n}: {d.outcome if d else 'undecided'} (pass@k {rate(d.metrics.pass_at_k if d else None)})\n\n"
    pages = [link(name, f"R{n}/{name}.md") for name in ("decision", "landscape", "regressions")
             if f"R{n}/{name}.md" in files]
    lines = [", ".join(pages)]
    for first in rnd.proposed:
        cid = first.candidate
        parts = [link(label, path) for label, path in (("card", candidate_path(n, cid)),
                                                       ("config", applied_path(n, cid)),
                                                       ("verdict", verdict_path(n, cid))) if path in files]
        lines.append(f"{cid}: {', '.join(parts)}")
    digests = len({d.task for d in rnd.digested.digests}) if rnd.digested else 0  # one page per task (round_files)
    folders = [link(f"digests ({digests})", f"R{n}/digests/")] if digests else []
    traj = sum(len(v) for v in trajectories.values())
    folders += [link(f"trajectories ({traj})", f"R{n}/trajectories/")] if traj else []
    return head + "".join(f"- {line}\n" for line in [*lines, ", ".join(folders)] if line) + "\n"


def rules_section(fold: RunFold) -> str:
    """``## Rules shipped``: per variant, each rule a ship or fork put into its harness, as a sentence with its
    support, the round and candidate, and whether the variant still holds it ("" when the run shipped none)."""
    records = fold.rules()
    if not records:
        return ""
    parts = ["## Rules shipped\n\n"]
    for variant in dict.fromkeys(r.variant for r in records):
        rows = [[r.round, sentence(r.rule), support_phrase(r.support) if r.support else "-", r.candidate or "-",
                 f"`{r.lever}`", r.status] for r in records if r.variant == variant]
        parts.append(f"Variant `{variant}`:\n\n" + table(["round", "rule", "support", "candidate", "lever",
                                                            "status"], rows) + "\n")
    return "".join(parts)


def index(fold: RunFold, files: Mapping[str, str], trajectories: TrajectoryFiles) -> str:
    """What the run is, and a link to every file of the directory."""
    o, state, f = fold.opened, fold.state, fold.finished
    status = f"{f.status} after {f.rounds} round(s): {f.reason}" if f else "not finished (no evolution.finished)"
    variants = table(["variant", "parent", "born in round", "retired", "harness"],
                     [[v.name, v.parent or "-", v.born if v.born >= 0 else "-", "yes" if v.retired else "no",
                       v.harness.digest] for v in state.variants.values()])
    ledger = fold.ledger
    routing = table(["cluster", "variant"], [*([c, ledger.route(c)] for c in ledger.clusters()),
                                             ["(a cluster not run yet)", ledger.unserved()]])
    held = table(["after round", "tasks", "pass@1", "pass@2"],
                 [["before" if h.round < 0 else h.round, h.tasks, rate(h.pass_at_1), rate(h.pass_at_2)]
                  for h in fold.heldout])
    top = [("journal.md", "one entry per round: what it did and why"),
           ("curves.json", "per round pass@k, tasks, passes, rollouts, tokens; held-out figures"),
           ("scoreboard.json", "ships, and each bucket's and lever's record"),
           ("audit.jsonl", "every ledger event in order, with its hash-chain links"),
           ("data/task_history.jsonl", "one line per (round, task)"),
           ("data/ship_outcomes.json", "each ship's predictions and what happened"),
           ("data/rejected_candidates.jsonl", "every candidate not shipped, and why"),
           ("data/rules.jsonl", "every rule shipped to a variant: its sentence, support, lever, round and fate"),
           ("data/tokens.jsonl", "tokens per round: per meta-model stage, the task agent's total and per task")]
    rounds = "".join(_round_links(rnd, files, trajectories.get(rnd.round, {})) for rnd in fold.ordered())
    return (f"# Evolution run `{o.run_id}`\n\nStrategy `{o.strategy}`; status: {status}. "
            f"{len(state.decisions)} round(s) decided; {len(fold.records)} ledger events, head "
            f"{ledger_digest(fold.records[-1])}.\n\nInitial harness (`{o.variant}`): {o.digest}.\n\n"
            f"## Held-out (frozen split, aggregates only)\n\n{held}\n## Variants\n\n{variants}\n"
            f"## Routing (cluster -> variant)\n\n{routing}\n{rules_section(fold)}## Files\n\n"
            + "".join(f"- {link(p, p)}: {what}\n" for p, what in top)
            + f"\n## Rounds\n\n{rounds or '(none yet)'}\n"
            f"## Settings (from ledger.opened)\n\n{table(['setting', 'value'], _settings(nested_job(o.settings)))}")
