"""bench/gate_fidelity.py: its pure counting and seed sizing, and a tiny run of the bench end to end."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hx.gate.sequential import Tries

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _counts() -> ModuleType:
    loaded = importlib.util.spec_from_file_location("bench_fidelity_counts", BENCH / "fidelity_counts.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module  # its dataclasses look their module up there
    loaded.loader.exec_module(module)
    return module


def test_a_pair_regresses_only_on_a_fall_of_at_least_the_drop_whose_bound_is_below_zero() -> None:
    f = _counts()
    assert f.judge(Tries(20, 20), Tries(20, 10)).regressed  # a fall of 0.5, far outside the noise
    assert not f.judge(Tries(20, 20), Tries(20, 17)).regressed  # significant at 20 a side, but under the drop
    assert not f.judge(Tries(4, 4), Tries(4, 2)).regressed  # the drop, but 4 attempts cannot show it
    assert not f.judge(Tries(20, 10), Tries(20, 14)).regressed  # a gain
    shown = f.judge(Tries(20, 20), Tries(20, 10)).difference
    assert shown.confidence == pytest.approx(0.90) and shown.estimate == pytest.approx(-0.5)


def test_the_rates_count_regressed_pairs_and_rejects_with_no_pair_regressed() -> None:
    f = _counts()
    bad, good = f.judge(Tries(20, 20), Tries(20, 5)), f.judge(Tries(20, 20), Tries(20, 20))
    shipped = f.shipped_regression_rate([bad, good, good, good])
    assert (shipped.count, shipped.total) == (1, 4)
    assert shipped.interval is not None and shipped.interval.low < 0.25 < shipped.interval.high
    fine = f.fine_rate([[good, good], [good, bad], [good]])
    assert (fine.count, fine.total) == (2, 3)
    assert str(f.fine_rate([])) == "0/0 (nothing to count)"


@pytest.mark.parametrize("p_base", [1.0, 0.75, 0.5, 0.3])
def test_the_seeds_are_the_fewest_with_the_power_and_the_smallest_drop_is_its_inverse(p_base: float) -> None:
    f = _counts()
    n = f.seeds_for_power(p_base, 0.25)
    assert f.power_at(p_base, 0.25, n) >= 0.80 > f.power_at(p_base, 0.25, n - 1)
    smallest = f.smallest_drop(p_base, n)
    assert smallest is not None and smallest <= 0.25 + 1e-9
    assert f.power_at(p_base, smallest - 0.01, n) < 0.80
    # the pair's rule also asks the observed fall to reach the drop: a true fall of exactly the drop is called
    # about half the time, so it needs a larger fall for the same power
    assert f.power_at(p_base, 0.25, n, counted=0.25) == pytest.approx(0.5, abs=0.01)
    counted = f.smallest_drop(p_base, n, counted=0.25)
    assert counted is None or counted > 0.25


def test_the_sizing_takes_the_worst_base_rate_seen_and_never_fewer_than_twenty() -> None:
    f = _counts()
    # normal approximation, one-sided alpha 0.05, power 0.8: (1.645 sqrt(2 pq) + 0.842 sqrt(p1q1 + p2q2))^2 / 0.25^2
    assert (f.seeds_for_power(1.0, 0.25), f.seeds_for_power(0.5, 0.25)) == (21, 46)
    assert f.choose_seeds([1.0, 0.5], 0.25) == 46
    assert f.choose_seeds([1.0], 0.5) == 20  # the floor
    assert f.choose_seeds([0.1], 0.25) == 20  # a fall of 0.25 from 0.1 cannot happen: not sized for
    assert f.smallest_drop(0.5, 4) is None  # 4 seeds a side cannot see even a fall to 0


def test_the_bench_plays_both_gates_and_prints_their_figures(tmp_path: Path) -> None:
    # smaller than --quick (about 30 s here, against a couple of minutes): one round on 3 tasks a game
    env = {k: v for k, v in os.environ.items() if k not in ("HX_NATS_URL", "HX_DATA_DIR")}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, str(BENCH / "gate_fidelity.py"), "--seeds", "3", "--rounds", "1",
                           "--tasks", "3", "--heldout-tasks", "2", "--per-side", "3"],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for gate in ("retry", "sequential"):
        assert re.search(rf"{gate} +seed 3: hx evolve .* ship\(s\) with \d+ pair\(s\), .* 3 seeds a side re-run", out)
        assert f"== gate {gate}: 1 run(s)" in out
    assert out.count("shipped regression rate: ") == 2 and out.count("would have been fine: ") == 2
    assert out.count("held-out pass@2 (train split): before") == 2 and "sequential/retry wall time: " in out
    assert not list(tmp_path.glob("hx-bench-fidelity-*"))  # its data directories are gone
