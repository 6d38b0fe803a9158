"""The demo's targets over worlds and seeds, as one markdown table, from saved runs.

    python benchmarks/demo_table.py benchmarks/results/demo_worlds/*/results.json

One row per ``betaprm demo`` results file, named by its folder: wall time, within-problem AUROC of both PRMs,
first-error AUROC on parity-keeping (even) errors, BetaPRM and standard `mu` MAE to the Bayes
mean, the best BetaPRM selector (chosen on validation) minus majority vote with its paired
interval, S_RB minus the standard PRM, top-1 S_RB against a single pass, and the Bayes
belief's AUROC; then the targets and, per column with a target, how many runs meet it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGETS = {"time": 15.0, "auroc": 0.80, "mae": 0.10, "best": 0.030}


def row(path: Path) -> tuple[list[str], dict]:
    r = json.loads(path.read_text())
    v, cal, cmp_ = r["verification"], r["calibration"], r["comparisons"]
    best = cmp_["best_betaprm_minus_majority_vote"]
    vals = {
        "time": r["seconds"] / 60,
        "auroc": min(v["standard_prm_auroc"], v["betaprm_auroc"]),
        "mae": cal["betaprm"]["mu_mae_bayes"],
        "best": best["diff"],
    }
    cells = [
        path.parent.name,  # the run's folder: world, seed and any recipe change
        f"{vals['time']:.1f} min",
        f"{v['standard_prm_auroc']:.3f} / {v['betaprm_auroc']:.3f}",
        f"{v.get('standard_prm_first_error_auroc_even', float('nan')):.3f} / "
        f"{v.get('betaprm_first_error_auroc_even', float('nan')):.3f}",
        f"{cal['standard_prm']['mu_mae_bayes']:.3f} / {cal['betaprm']['mu_mae_bayes']:.3f}",
        f"{best['diff']:+.3f} [{best['ci'][0]:+.3f}, {best['ci'][1]:+.3f}]",
        f"{cmp_['betaprm_rb_minus_standard_prm_mean']['diff']:+.3f}",
        f"{r['bon']['betaprm_rb']['acc']:.3f} / {r['bon']['single_pass']['acc']:.3f}",
        f"{v['bayes_auroc']:.3f}",
    ]
    return cells, vals


def main(paths: list[str]) -> None:
    head = [
        "run",
        "time",
        "AUROC std / Beta",
        "first-error even std / Beta",
        "MAE std / Beta",
        "best Beta − majority",
        "S_RB − std",
        "top-1 S_RB / single pass",
        "Bayes AUROC",
    ]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    met = {k: 0 for k in TARGETS}
    rows = [row(Path(p)) for p in paths]
    for cells, vals in rows:
        print("| " + " | ".join(cells) + " |")
        met["time"] += vals["time"] <= TARGETS["time"]
        met["auroc"] += vals["auroc"] >= TARGETS["auroc"]
        met["mae"] += vals["mae"] <= TARGETS["mae"]
        met["best"] += vals["best"] >= TARGETS["best"]
    n = len(rows)
    print(
        f"| target (runs meeting it, of {n}) | <= 15 min ({met['time']}) | >= 0.80 both ({met['auroc']}) | - | "
        f"Beta <= 0.10 ({met['mae']}) | >= +0.030 ({met['best']}) | - | - | - |"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
