"""Compare demo recipes over several seeds (the demo's numbers move a lot from seed to seed).

    python benchmarks/demo_sweep.py --grid GRID.json --seeds 100 101 102 --jobs 4 --out runs/sweep [--device cuda]

GRID.json maps a recipe name to `betaprm demo` settings, e.g.
    {"base": {}, "repeat2": {"marker_repeat": 2}, "boost3": {"error_boost": 3.0}}
Every (recipe, seed) runs `betaprm demo --no-aca` in its own process (``--jobs`` at a time,
each with ``--threads`` torch threads) into OUT/RECIPE/seedS; a finished run is not
run again, so the sweep resumes. It prints and writes OUT/summary.json: per recipe the
mean and standard deviation over seeds of the demo's headline numbers (AUROC, MAE, calibration, selectors).

Recipes are compared on seeds the README never reports (its tables are seeds 0 and 1):
the demo's test split of a sweep seed is a fresh draw of the world, so choosing a recipe
here does not tune anything on the reported test problems.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

METRICS = {
    "auroc_std": lambda r: r["verification"]["standard_prm_auroc"],
    "auroc_beta": lambda r: r["verification"]["betaprm_auroc"],
    "mae_std": lambda r: r["calibration"]["standard_prm"]["mu_mae_bayes"],
    "mae_beta": lambda r: r["calibration"]["betaprm"]["mu_mae_bayes"],
    "spearman_kappa": lambda r: r["calibration"]["betaprm"]["spearman_kappa_bayes"],
    "coverage90": lambda r: r["calibration"]["betaprm"]["coverage90"],
    "width_minus_bayes": lambda r: (
        r["calibration"]["betaprm"]["width90"] - r["calibration"]["betaprm"]["bayes_width90"]
    ),
    "rb_minus_std": lambda r: r["comparisons"]["betaprm_rb_minus_standard_prm_mean"]["diff"],
    "best_minus_majority": lambda r: r["comparisons"]["best_betaprm_minus_majority_vote"]["diff"],
    "seconds": lambda r: r["seconds"],
}


def _flags(settings: dict) -> list[str]:
    out = []
    for k, v in settings.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + k.replace("_", "-"))
        else:
            out += [flag, str(v)]
    return out


def run_one(name, settings, seed, args) -> tuple[str, int, dict | None, str]:
    out = Path(args.out) / name / f"seed{seed}"
    if (out / "results.json").is_file():
        return name, seed, json.loads((out / "results.json").read_text()), "cached"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "betaprm",
        "demo",
        "--no-aca",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        *_flags(settings),
    ]
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        try:
            rc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=args.timeout,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            ).returncode
        except subprocess.TimeoutExpired:
            return name, seed, None, f"timed out after {args.timeout}s"
    if rc != 0 or not (out / "results.json").is_file():
        return name, seed, None, f"exit {rc}, see {out / 'log.txt'}"
    return name, seed, json.loads((out / "results.json").read_text()), f"{time.perf_counter() - t0:.0f}s"


def summarize(results: dict) -> dict:
    summary = {}
    for name, runs in results.items():
        rows = {m: [f(r) for r in runs.values()] for m, f in METRICS.items()}
        summary[name] = {
            "seeds": sorted(runs),
            **{
                m: {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "values": v}
                for m, v in rows.items()
            },
        }
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--grid", required=True, help="JSON file: recipe name -> demo settings")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[100, 101, 102], help="demo seeds (keep clear of the README's 0 and 1)"
    )
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per run")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto, passed to betaprm demo")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run before it is stopped")
    ap.add_argument("--out", default="runs/sweep")
    ap.add_argument("--summary", help="also write the summary here")
    args = ap.parse_args(argv)
    grid = json.loads(Path(args.grid).read_text())
    todo = [(name, settings, seed) for seed in args.seeds for name, settings in grid.items()]
    results: dict = {name: {} for name in grid}
    summary: dict = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for fut in as_completed([pool.submit(run_one, *t, args) for t in todo]):
            name, seed, res, how = fut.result()
            print(f"{name} seed {seed}: {how}", flush=True)
            if res is not None:
                results[name][seed] = res
            # Written after every run, so a sweep stopped early still leaves its numbers.
            summary = summarize({k: v for k, v in results.items() if v})
            for path in [Path(args.out) / "summary.json"] + ([Path(args.summary)] if args.summary else []):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(summary, indent=2) + "\n")
    cols = list(METRICS)
    print("recipe".ljust(16) + "".join(c[:14].rjust(15) for c in cols))
    for name, s in summary.items():
        print(
            f"{name[:15]:16}"
            + "".join(f"{s[c]['mean']:8.3f}±{s[c]['sd']:.3f}".rjust(15) for c in cols)
            + f"   n={len(s['seeds'])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
