"""The seesaw rules' per-task error rates, exact: the table "What the gate guarantees" in docs/aegis.md.

For a solved task whose variant passes at rate ``p``, the chance the rule calls it regressed (the
candidate is turned down) when the candidate passes at ``p`` (unchanged), ``p - 0.25``, ``p - 0.5``
or 0. ``sequential`` is ``hx.gate.sequential.operating_characteristic`` (the rule the gate and the
audit decide with); ``retry`` is ``(1 - candidate rate)^(3k)`` (fails the ``k`` paired attempts
and the ``2k`` retries). Then the worst false-alarm rate of an unchanged task over pass rates
0.01 .. 1.00, for ``k`` 2 and 3. Pure arithmetic: a second or two.

    python bench/gate_oc.py              # the defaults: k = 2, drop 0.25, alpha 0.05, 3 waves
    python bench/gate_oc.py --k 3
"""

from __future__ import annotations

import argparse

from hx.gate.sequential import SequentialRule, operating_characteristic

RATES = (1.0, 0.75, 0.5, 0.3)
FALLS = (0.0, 0.25, 0.5, None)
"""Falls in pass rate (None: to 0)."""


def retry(k: int, pc: float) -> float:
    """The ``retry`` rule's chance of calling a solved task regressed: every paired attempt and retry fails."""
    return (1 - pc) ** (3 * k)


def cell(value: float | None) -> str:
    """A percentage as the table shows it (an em dash where the fall is past 0)."""
    return "—" if value is None else f"{100 * value:.0f} %"


def table(rule: SequentialRule, k: int) -> list[str]:
    """The docs table's lines."""
    lines = ["| variant's pass rate | rule | unchanged | falls by 0.25 | falls by 0.5 | falls to 0 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for pb in RATES:
        # a fall that reaches 0 is the "falls to 0" column: shown there only
        targets = [0.0 if fall is None else None if pb - fall < 1e-9 else pb - fall for fall in FALLS]
        seq = [None if pc is None else operating_characteristic(rule, k, pb, pc) for pc in targets]
        ret = [None if pc is None else retry(k, pc) for pc in targets]
        lines.append(f"| {pb:.2f} | sequential | " + " | ".join(cell(v) for v in seq) + " |")
        lines.append(f"| {pb:.2f} | retry | " + " | ".join(cell(v) for v in ret) + " |")
    return lines


def worst_unchanged(rule: SequentialRule, k: int) -> tuple[float, float]:
    """The highest chance an unchanged task is called regressed, over pass rates 0.01 .. 1.00, and where."""
    return max((operating_characteristic(rule, k, p / 100, p / 100), p / 100) for p in range(1, 101))


def main() -> None:
    """Print the table for ``--k`` and the worst unchanged rate for k 2 and 3."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=2, help="attempts per side per wave (the run's k)")
    args = parser.parse_args()
    rule = SequentialRule()
    print(f"sequential rule: drop {rule.drop}, alpha {rule.alpha}, waves {rule.waves}; k = {args.k}")
    print("\n".join(table(rule, args.k)))
    for k in (2, 3):
        rate, at = worst_unchanged(rule, k)
        print(f"worst unchanged, k = {k}: {100 * rate:.1f} % at a pass rate of {at:.2f}")


if __name__ == "__main__":
    main()
