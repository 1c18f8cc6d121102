"""Planted bugs: small, realistic mutants of hx's invariants, each run against the tests that should notice it.

    python bench/mutants.py                  # every mutant, about 5-10 minutes on two cores
    python bench/mutants.py --list           # the mutants: where, the bug, the tests each runs
    python bench/mutants.py evidence-early-return claim-unconditional   # some of them

Each mutant is one bug a person could write (a check dropped, a comparison off by one, a field
skipped), written as string edits of one source file. The repository's files (tracked, and
untracked ones git does not ignore) are copied to a scratch directory: the working tree is never
edited and nothing carries over from an earlier run. There the tests that all the mutants name
run once unmutated and must pass; then, one mutant at a time, its edits are applied (each text it
replaces must occur exactly once, so a mutant the source moved away from is an error, never a
pass), its tests run (pytest ``-x -m 'not slow'``, the copy first on ``PYTHONPATH``, also for the
``hx`` processes the tests start), and the file is restored.

A mutant is *caught* when a test fails or its tests time out, *not caught* when they all pass.
The script prints one line per mutant with the test that caught it, then the score, and exits 1
when any mutant was not caught (2 when the unmutated tests fail or a mutant does not apply).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.M)
"""A failed test's id in pytest's short summary (a parametrised id may hold spaces)."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: string edits of one file, and the tests that must notice it."""

    name: str
    path: str
    bug: str
    edits: tuple[tuple[str, str], ...]
    """(text, replacement) pairs; each text occurs exactly once in the file."""
    tests: tuple[str, ...]
    """pytest arguments: test files, test ids, or a module (its doctests)."""


GATE_TESTS = ("tests/test_aegis_gate.py::test_a_task_lost_on_the_paired_seeds_but_passing_a_retry_does_not_regress",
              "tests/test_aegis_gate.py::test_losses_on_paired_seeds_may_not_outnumber_gains",
              "tests/test_aegis_gate.py::test_a_fork_serves_only_clusters_that_gain_clearly_and_regress_nothing",
              "tests/test_aegis_gate.py::test_a_fork_needs_a_margin_over_its_losses_in_the_cluster",
              "hx/gate/rule.py")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("redaction-url-check", "streams/redaction.py",
           "the log's byte check (needs_scrub) no longer looks for URL credentials: only a registered secret "
           "makes it scrub a body",
           (("_URL_USERINFO_BYTES.search(body) is not None", "False"),),
           ("tests/test_hardening_secrets.py",)),
    Mutant("redaction-registered-secrets", "streams/redaction.py",
           "scrub masks URL credentials and the values passed to it, not the registered or environment secrets",
           (("for secret in (*extra, *secrets()):", "for secret in extra:"),),
           ("tests/test_hardening_secrets.py", "streams/redaction.py")),
    Mutant("compare-ignores-first-field", "hx/replay/compare.py",
           "replay compares event bodies without their first field (processor.triggered's processor, a hook "
           "record's stage, model.response's role, attempt.started's run_id)",
           (("if record is not None and event is not None and record.event == event:",
             "if record is not None and event is not None and "
             "msgspec.structs.astuple(record.event)[1:] == msgspec.structs.astuple(event)[1:]:"),),
           ("tests/test_replay_compare.py", "hx/replay/compare.py")),
    Mutant("compare-path-skips-first-field", "hx/replay/compare.py",
           "the divergence report walks a body's fields from the second on: a first field that differs is "
           "reported as the whole body",
           (("for name in logged.__struct_fields__:", "for name in logged.__struct_fields__[1:]:"),),
           ("tests/test_replay_compare.py", "hx/replay/compare.py")),
    Mutant("chain-aggregate-prev", "hx/aegis/ledger.py",
           "EvolutionLedger.fold checks that a loaded event is chained, not that it chains to the head",
           (("        if record.prev != self.head:\n", "        if self.head and not record.prev:\n"),),
           ("tests/test_ledger_fold.py",)),
    Mutant("chain-fold-prev", "projections/ledger.py",
           "RunLedger.fold checks that an event is chained, not that it chains to the event before",
           (("        if event.prev != self.head:\n", "        if self.head and not event.prev:\n"),),
           ("tests/test_ledger_fold.py",)),
    Mutant("fold-after-finished", "projections/ledger.py",
           "the fold refuses only a second evolution_finished after the run's end, not any other event",
           (("        if self.finished is not None:\n",
             "        if self.finished is not None and isinstance(event, EvolutionFinished):\n"),),
           ("tests/test_ledger_fold.py",)),
    Mutant("fold-unknown-candidate", "projections/ledger.py",
           "a gate verdict on a candidate never proposed is taken into its round, no fault",
           (("                cand = self.candidates.get(ev.candidate)\n"
             "                if cand is None:\n"
             "                    return _unknown(ev.candidate)\n"
             "                if ev.variant != cand.proposal.variant:\n",
             "                cand = self.candidates.get(ev.candidate)\n"
             "                if cand is None:\n"
             "                    self.round(ev.round).gates[ev.candidate] = ev\n"
             "                    return \"\"\n"
             "                if ev.variant != cand.proposal.variant:\n"),),
           ("tests/test_ledger_fold.py",)),
    Mutant("fold-duplicate-position", "projections/ledger.py",
           "off by one: a position written again is taken as the next event, not refused as a duplicate",
           (("        if position <= self.last_position:\n", "        if position < self.last_position:\n"),),
           ("tests/test_ledger_fold.py",)),
    Mutant("signature-verify-always-ok", "streams/signing.py",
           "verify says every signature is the run's key's",
           (("    key = _public(public_key)\n    if key is None:\n",
             "    return \"\"\n    key = _public(public_key)\n    if key is None:\n"),),
           ("tests/test_ledger_fold.py", "streams/signing.py")),
    Mutant("gate-disagreement-empty", "hx/gate/rule.py",
           "disagreement finds every recorded verdict consistent with its own checks",
           (("    names = [c.name for c in judged.checks]\n",
             "    return \"\"\n    names = [c.name for c in judged.checks]\n"),),
           ("tests/test_gate_rule.py",)),
    Mutant("gate-seesaw-regressed", "hx/gate/rule.py",
           "the seesaw holds when gains cover the losses, even with a solved task that failed every retry",
           (("    holds = not regressed and len(won) >= len(lost)\n", "    holds = len(won) >= len(lost)\n"),),
           GATE_TESTS),
    Mutant("audit-ship-ignores-verdict", "hx/replay/ledger_checks.py",
           "the audit checks that a ship's candidates were judged, not that the gate passed them for that ship",
           (("        if not gate.passed:\n", "        if False:\n"),
            ("        elif gate.outcome != kind:\n", "        elif False:\n")),
           ("tests/test_audit.py::test_a_ship_or_fork_the_gate_did_not_pass_for_is_named",)),
    Mutant("audit-chain-first-event", "hx/replay/ledger_checks.py",
           "the audit's chain check skips the first event (a ledger whose start was dropped)",
           (('if e.event.prev != (digests[i - 1] if i else "")]', "if i and e.event.prev != digests[i - 1]]"),),
           ("tests/test_audit.py::test_a_dropped_event_is_named",)),
    Mutant("trace-purpose-check", "hx/replay/trace_checks.py",
           "a cited trace round is checked for its round, candidate and variant, not for its purpose",
           (("            if said != purpose or (stage is not None", "            if (stage is not None"),),
           ("tests/test_audit.py::test_a_trace_round_cited_for_what_it_was_not_is_named",)),
    Mutant("evidence-early-return", "hx/aegis/evidence.py",
           "Evidence returns early when every asked round's role is cached, before checking it is adaptation",
           (("        if missing:\n            self._roles = await round_roles(self.log, self.run_id)\n",
             "        if not missing:\n            return\n"
             "        self._roles = await round_roles(self.log, self.run_id)\n"),),
           ("tests/test_aegis_loop.py::test_evidence_refuses_a_heldout_round_whose_role_it_has_already_read",)),
    Mutant("claim-unconditional", "hx/aegis/session.py",
           "hx evolve claims its run on the trace without the conditional append (expected_last_seq=0)",
           ((",\n                              expected_last_seq=0)", ")"),),
           ("tests/test_hardening_claims.py::"
            "test_two_evolvers_with_one_run_id_at_once_one_wins_and_the_other_writes_nothing",)),
    Mutant("export-force-any-folder", "hx/cli/export.py",
           "hx export --force replaces any non-empty directory, marker or not",
           (("        return False\n    marker = target / MARKER\n",
             "        return False\n    if force:\n        return True\n    marker = target / MARKER\n"),),
           ("tests/test_export_target.py",)),
    Mutant("export-data-dir-parent", "hx/cli/export.py",
           "hx export refuses the data dir itself, not a folder that contains it",
           (("        if real == data or real in data.parents:\n", "        if real == data:\n"),),
           ("tests/test_export_target.py",)),
)


@dataclass(frozen=True)
class Outcome:
    """What a mutant's tests did."""

    status: str
    """``caught``, ``not caught``, ``timeout`` (counted as caught) or ``error``."""
    by: str
    """The first test that failed (or why the run is an error)."""
    seconds: float


def copy_tree(dest: Path) -> None:
    """The repository's files as git sees them (tracked, and untracked unless ignored) copied under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=False)
    if listed.returncode != 0:  # not a git checkout: everything but caches
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache"))
        return
    for rel in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / rel
        if source.is_file():  # a tracked file deleted in the working tree is left out, as a commit would
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)


def run_tests(tree: Path, tests: Sequence[str], timeout: float) -> Outcome:
    """pytest on ``tests`` in ``tree``, stopping at the first failure."""
    env = {k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", "-rfE",
               *dict.fromkeys(tests)]
    began = time.monotonic()
    proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the test run we started and the servers and hx processes it started
        proc.communicate()
        return Outcome("timeout", f"no result in {timeout:.0f} s", time.monotonic() - began)
    seconds = time.monotonic() - began
    failed = FAILED.search(out)
    if proc.returncode == 0:
        return Outcome("not caught", "", seconds)
    if proc.returncode == 1:
        return Outcome("caught", failed[1] if failed else "(a test failed)", seconds)
    tail = " / ".join(line for line in out.strip().splitlines()[-3:])
    return Outcome("error", f"pytest exit {proc.returncode}: {tail}", seconds)


class Stale(Exception):
    """A mutant whose text is not (or not once) in today's source."""


def plant(tree: Path, mutant: Mutant) -> str:
    """Apply the mutant's edits in ``tree``; return the file's original text."""
    path = tree / mutant.path
    original = path.read_text()
    text = original
    for old, new in mutant.edits:
        count = text.count(old)
        if count != 1:
            raise Stale(f"error: mutant {mutant.name}: the text it replaces occurs {count} times in {mutant.path}, "
                        f"not once: update the mutant to the source\n  {old!r}")
        text = text.replace(old, new)
    path.write_text(text)
    return original


def main(argv: Sequence[str] | None = None) -> int:
    """Run the mutants named (all by default) and print the table and the score."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for one mutant's tests (default 600)")
    args = parser.parse_args(argv)
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"no mutant {', '.join(unknown)}; the mutants: {', '.join(known)}")
    chosen = [known[n] for n in args.names] if args.names else list(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name}  ({m.path})\n  bug:   {m.bug}\n  tests: {' '.join(m.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="hx-mutants-") as scratch:
        tree = Path(scratch)
        copy_tree(tree)
        try:  # every mutant applies to today's source, before minutes of tests say so
            for m in chosen:
                (tree / m.path).write_text(plant(tree, m))
        except Stale as exc:
            print(exc)
            return 2
        every = [t for m in chosen for t in m.tests]
        print(f"unmutated: {len(dict.fromkeys(every))} test selections of {len(chosen)} mutants ...", flush=True)
        base = run_tests(tree, every, args.timeout)
        if base.status != "not caught":
            print(f"error: the tests fail without any mutant ({base.status}: {base.by}); fix them first")
            return 2
        print(f"unmutated: pass ({base.seconds:.0f} s)\n")
        width = max(len(m.name) for m in chosen)
        print(f"{'mutant':<{width}}  {'module':<27}  {'result':<10}  {'s':>4}  caught by")
        results: list[tuple[Mutant, Outcome]] = []
        for m in chosen:
            original = plant(tree, m)
            try:
                outcome = run_tests(tree, m.tests, args.timeout)
            finally:
                (tree / m.path).write_text(original)
            results.append((m, outcome))
            print(f"{m.name:<{width}}  {m.path:<27}  {outcome.status:<10}  {outcome.seconds:>4.0f}  "
                  f"{outcome.by or '-'}", flush=True)
    caught = sum(o.status in ("caught", "timeout") for _, o in results)
    print(f"\nscore: {caught} of {len(results)} mutants caught ({100 * caught / len(results):.0f} %)")
    missed = [(m, o) for m, o in results if o.status not in ("caught", "timeout")]
    for m, o in missed:
        print(f"  {o.status}: {m.name} ({m.path}): {m.bug}" + (f" [{o.by}]" if o.status == "error" else ""))
    if any(o.status == "error" for _, o in missed):
        return 2
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
