"""Where kappa pays, and why: the claims of ``reliability_claims.py`` split by what the PRM
cannot see, and what per-step kappa adds over one overall dispersion.

In the chain-arithmetic world a problem's difficulty level (easy or hard) is written in its
question only with probability ``p_visible``. When it is hidden, a step's Monte Carlo count K
is a mixture over the two levels, spread wider than one rate's binomial: a Beta-Binomial can
say so with a lower kappa, a point estimate cannot. This script reads finished demo runs
(their folders as ``betaprm demo`` leaves them, with the saved BetaPRM) and reports per run,
for the test problems whose level is hidden and those whose level is written:

- the paired claims: the reliability-weighted vote against the standard PRM's weighted vote,
  BetaPRM S_RB against the standard PRM's top-1, kappa-ACA against reward-only ACA at
  kappa-ACA's tokens (``evaluation.frontier.matched``), each a mean paired difference with a
  95% bootstrap interval over those problems;
- per held-out step (``OUT/held_out_counts.jsonl``, one trace of each test problem): the
  BetaPRM's kappa, and the NLL of the counts under the BetaPRM's Beta-Binomial minus three
  others at the same mu or the standard PRM's: the standard PRM's binomial; one constant kappa
  fitted by maximum likelihood on the run's training counts (what a global dispersion gives);
  and the best constant kappa on these very steps (a bound no constant can beat, chosen on
  the held-out steps on purpose: beating it is what per-step kappa alone adds).

    python benchmarks/kappa_mechanism.py RUN [RUN ...] [--fit-records 3000] [--json FILE]

RUN is a demo output folder (``results.json``, ``per_problem.json``, ``held_out_counts.jsonl``,
``train_counts.jsonl``, ``betaprm/``). It scores the held-out traces and ``--fit-records``
training traces with the BetaPRM on CPU, about a minute a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize_scalar

from betaprm.evaluation.calibration import flat_counts, step_nll
from betaprm.evaluation.frontier import pooled_paired
from betaprm.evaluation.tables import markdown_table
from betaprm.model import load_prm
from betaprm.scoring import score_traces
from betaprm.synth.experiment import split_seeds
from betaprm.synth.frontiers import read_per_problem
from betaprm.synth.world import World, WorldConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the claims: one definition, in reliability_claims.py
from reliability_claims import CLAIMS, _last  # noqa: E402

GROUPS = ("hidden", "written")
SPLIT = ("reliability vote vs standard weighted vote", "S_RB vs standard PRM top-1", "kappa-ACA vs reward-only ACA")


def per_problem_claims(pp) -> dict[str, np.ndarray | None]:
    """Per test problem, the paired differences of ``SPLIT`` (None: outside the other
    frontier's range), as ``reliability_claims.py`` defines them."""
    return {claim: CLAIMS[claim][1](pp) for claim in SPLIT}


def test_problems(results: dict):
    """The run's test problems, in its order: drawn again from its world and seed."""
    world = World(WorldConfig.from_dict(results["world"]))
    eff = results["effective_config"]
    return world.sample_problems(eff["n_test_problems"], split_seeds(results["seed"]).test_problems, "test")


def _records(path: Path, limit: int | None = None) -> list[dict]:
    """A demo's own counts file (written by ``betaprm demo``, one JSON record a line)."""
    with open(path) as f:
        return [json.loads(line) for _, line in zip(range(limit or 10**9), f)]


def best_constant_kappa(mu, k, n) -> float:
    """The one kappa that maximises the Beta-Binomial likelihood of these counts at these mu."""

    def nll(log_kappa):
        return float(step_nll(mu, np.full_like(mu, np.exp(log_kappa)), k, n, beta=True).mean())

    return float(np.exp(minimize_scalar(nll, bounds=(np.log(0.05), np.log(1e4)), method="bounded").x))


def analyse(run: Path, fit_records: int) -> dict:
    results = json.loads((run / "results.json").read_text())
    pp = read_per_problem(run / "per_problem.json")
    problems = test_problems(results)
    hidden = np.array([not p.visible for p in problems])
    level = np.array([p.level for p in problems])
    single = _last(pp["bon"]["single_pass"]).hits
    if len(single) != len(problems):
        raise SystemExit(f"{run}: {len(single)} test problems in per_problem.json, {len(problems)} drawn again")
    groups = {"hidden": hidden, "written": ~hidden}
    out = {
        "p_visible": results["world"]["p_visible"],
        "share_hidden": float(hidden.mean()),
        # the drawn problems line up with the run's when the hard ones are the harder ones
        "single_pass_easy_hard": [float(single[level == 0].mean()), float(single[level == 1].mean())],
        "claims": {},
    }
    for claim, d in per_problem_claims(pp).items():
        out["claims"][claim] = {
            g: (None if d is None or not mask.any() else pooled_paired([d[mask]], seed=0))
            for g, mask in {"all": np.ones_like(hidden), **groups}.items()
        }

    # Per held-out step: kappa and the NLL against the alternatives at the same counts.
    prm, _ = load_prm(run / "betaprm", "cpu")
    held = _records(run / "held_out_counts.jsonl")
    with torch.inference_mode():
        scores = score_traces(prm, [(r["question"], r["steps"]) for r in held], batch_size=64)
        train = _records(run / "train_counts.jsonl", fit_records)
        train_scores = score_traces(prm, [(r["question"], r["steps"]) for r in train], batch_size=64)
    mu, kappa, k, n = flat_counts(held, scores)
    step_group = np.concatenate([np.full(len(s.mu), not problems[i].visible) for i, s in enumerate(scores)])
    step_level = np.concatenate([np.full(len(s.mu), problems[i].level) for i, s in enumerate(scores)])
    nll_beta = step_nll(mu, kappa, k, n, beta=True)
    if not np.allclose(nll_beta, pp["held_out_nll"]["betaprm"], atol=1e-4):
        raise SystemExit(f"{run}: the BetaPRM's held-out NLL differs from per_problem.json's")
    tmu, _, tk, tn = flat_counts(train, train_scores)
    kappa_train = best_constant_kappa(tmu, tk, tn)
    kappa_best = best_constant_kappa(mu, k, n)
    against = {
        "binomial (standard PRM)": pp["held_out_nll"]["standard_prm"],
        "constant kappa (training fit)": step_nll(mu, np.full_like(mu, kappa_train), k, n, beta=True),
        "best constant kappa (held-out)": step_nll(mu, np.full_like(mu, kappa_best), k, n, beta=True),
    }
    out["constant_kappa"] = {"training_fit": kappa_train, "best_held_out": kappa_best}
    step_groups = {
        "all": np.ones_like(step_group),
        "hidden": step_group,
        "written": ~step_group,
        # by the true level, which the PRM sees only where it is written
        **{
            f"{g} {lv}": seen & (step_level == z)
            for g, seen in (("hidden", step_group), ("written", ~step_group))
            for z, lv in enumerate(("easy", "hard"))
        },
    }
    out["steps"] = {}
    for g, mask in step_groups.items():
        if not mask.any():
            continue
        out["steps"][g] = {
            "n_steps": int(mask.sum()),
            "kappa_median": float(np.median(kappa[mask])),
            "nll_minus": {name: pooled_paired([(nll_beta - other)[mask]], seed=0) for name, other in against.items()},
        }
    return out


def _cell(p) -> str:
    return "-" if p is None else f"{p['diff']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="demo output folders")
    ap.add_argument("--fit-records", type=int, default=3000, help="training traces the constant kappa is fitted on")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    found = {}
    for run in args.runs:
        found[run] = analyse(Path(run), args.fit_records)
    names = {run: f"{Path(run).parent.name}/{Path(run).name} (p_visible {a['p_visible']})" for run, a in found.items()}

    rows = []
    for run, a in found.items():
        for claim, by in a["claims"].items():
            rows.append([names[run], claim, *(_cell(by[g]) for g in ("all", *GROUPS))])
    print("paired differences on the test problems, by whether the level is written in the question")
    print(markdown_table(rows, ["run", "claim", "all problems", "level hidden", "level written"]))

    rows = []
    for run, a in found.items():
        for g, s in a["steps"].items():
            rows.append(
                [
                    names[run],
                    g,
                    str(s["n_steps"]),
                    f"{s['kappa_median']:.1f}",
                    *(_cell(p) for p in s["nll_minus"].values()),
                ]
            )
    first = next(iter(found.values()))
    print(
        "\nheld-out steps: the BetaPRM's kappa, and its Beta-Binomial NLL minus each alternative's "
        "(nats per step; below 0: per-step kappa predicts K better)"
    )
    print(markdown_table(rows, ["run", "steps", "n", "median kappa", *first["steps"]["all"]["nll_minus"]]))
    for run, a in found.items():
        c = a["constant_kappa"]
        print(
            f"{names[run]}: constant kappa {c['training_fit']:.1f} (training fit), {c['best_held_out']:.1f} "
            f"(best on held-out); single pass easy / hard {a['single_pass_easy_hard'][0]:.3f} / "
            f"{a['single_pass_easy_hard'][1]:.3f}"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
