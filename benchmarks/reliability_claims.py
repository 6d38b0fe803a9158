"""Does reliability pay? The paper's claims as paired differences over demo runs of several
worlds and seeds, each against the same PRM without kappa (or at matched tokens).

    python benchmarks/reliability_claims.py --out runs/claims \\
        --worlds default long_chains mod12 --seeds 0 1 [--demo-flags "--quick"] [--json FILE]
    python benchmarks/reliability_claims.py --out runs/claims --sweep p_visible=0,0.25,1 --seeds 0

Each (world, seed) is a `betaprm demo --seed S [--world-config benchmarks/worlds/W.json]` run in
OUT/W/seedS (``--sweep KNOB=V1,V2``: the default world with that WorldConfig field at each
value, in OUT/KNOB=V/seedS), run one after the other. A run whose results.json and
per_problem.json are there is read, not run again, when it was made with the same demo
settings (else the script stops and names the difference: give another --out). What the
runs cost (their own clocks) is printed with the table.

Claims, each a paired difference over the same test problems (held-out steps for the NLL),
pooled over the runs with ``evaluation.frontier.pooled_paired`` (a bootstrap over runs and,
within each, problems), and per world:

- top-1: BetaPRM S_RB against the standard PRM's top-1 mean mu, and against BetaPRM's own
  top-1 mean mu (the same PRM, kappa unused);
- votes: the reliability-weighted vote against the standard PRM's mu-weighted vote, and
  against BetaPRM's own mu-weighted vote;
- ACA: kappa-ACA at its table setting against reward-only ACA (sigma = 0), proxy-sigma ACA,
  Best-of-n with S_RB and Best-of-n decided by the reliability-weighted vote, each at
  kappa-ACA's tokens on its own frontier (``evaluation.frontier``:
  the mix of its two settings around those tokens; no setting chosen on test problems);
- calibration: the held-out NLL of the counts, BetaPRM's Beta-Binomial minus the standard
  PRM's binomial at mu (nats per step; below 0: BetaPRM predicts K better).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from betaprm.evaluation.frontier import hits_at, matched, pooled_paired
from betaprm.evaluation.tables import markdown_table
from betaprm.synth.frontiers import ACA_KNOBS, read_per_problem

HERE = Path(__file__).resolve().parent
WORLDS = {
    "default": None,
    "long_chains": HERE / "worlds" / "long_chains.json",
    "mod12": HERE / "worlds" / "mod12.json",
}


def _last(points):
    """The point with the most tokens: Best-of-N at the whole pool."""
    return max(points, key=lambda p: p.tokens)


def _aca_table_point(pp, name="aca"):
    return next(p for p in pp["aca"][name] if p.knob == ACA_KNOBS[name][2])


def _matched_d(pp, other, name="aca"):
    """``name``'s table point (kappa-ACA by default) minus ``other``'s frontier at its tokens,
    per problem (None: outside the other's range, or a run made before ``name`` existed)."""
    if name not in pp["aca"] or (other not in pp["aca"] and other not in pp["bon"]):
        return None
    pts = pp["aca"][other] if other in pp["aca"] else pp["bon"][other]
    m = matched(_aca_table_point(pp, name), pts)
    return None if m is None else m["d"]


def _table_minus(pp, a, b):
    """``a``'s table point minus ``b``'s, per problem (None: a run made before one existed)."""
    if a not in pp["aca"] or b not in pp["aca"]:
        return None
    return _aca_table_point(pp, a).hits - _aca_table_point(pp, b).hits


def _vote_half_vs_bon16(pp):
    """The adaptive reliability vote's frontier at half of Best-of-N's tokens (the mix of its
    two settings around them, per problem) minus Best-of-N's reliability vote on the whole
    pool (None: a run without the adaptive vote, or a frontier that does not reach half)."""
    if "vote" not in pp["aca"]:
        return None
    full = _last(pp["bon"]["betaprm_reliability_vote"])
    half = hits_at(pp["aca"]["vote"], full.tokens / 2)
    return None if half is None else half - full.hits


def _vote_vs_bon16(pp):
    """The adaptive reliability vote's table point minus Best-of-N's reliability vote on the
    whole pool, per problem (None: a run without the adaptive vote)."""
    if "vote" not in pp["aca"]:
        return None
    return _aca_table_point(pp, "vote").hits - _last(pp["bon"]["betaprm_reliability_vote"]).hits


# name -> (what it isolates, per-problem differences of one run's per_problem.json)
CLAIMS = {
    "S_RB vs standard PRM top-1": (
        "BetaPRM S_RB minus the standard PRM's top-1 mean mu (Best-of-N)",
        lambda pp: _last(pp["bon"]["betaprm_rb"]).hits - _last(pp["bon"]["standard_prm_mean"]).hits,
    ),
    "S_RB vs BetaPRM top-1 mean": (
        "S_RB minus the same BetaPRM's top-1 mean mu: kappa's use at selection",
        lambda pp: _last(pp["bon"]["betaprm_rb"]).hits - _last(pp["bon"]["betaprm_mean"]).hits,
    ),
    "reliability vote vs standard weighted vote": (
        "BetaPRM's reliability-weighted vote minus the standard PRM's mu-weighted vote",
        lambda pp: _last(pp["bon"]["betaprm_reliability_vote"]).hits - _last(pp["bon"]["standard_prm_vote"]).hits,
    ),
    "reliability vote vs BetaPRM weighted vote": (
        "the reliability-weighted vote minus the same BetaPRM's mu-weighted vote: kappa's use in the vote",
        lambda pp: _last(pp["bon"]["betaprm_reliability_vote"]).hits - _last(pp["bon"]["betaprm_vote"]).hits,
    ),
    "kappa-ACA vs reward-only ACA": (
        "kappa-ACA minus reward-only ACA (standard PRM, sigma = 0) at kappa-ACA's tokens",
        lambda pp: _matched_d(pp, "aca_reward_only"),
    ),
    "kappa-ACA vs proxy-sigma ACA": (
        "kappa-ACA minus ACA with sigma = sqrt(mu(1-mu)) (standard PRM) at kappa-ACA's tokens",
        lambda pp: _matched_d(pp, "aca_proxy"),
    ),
    "kappa-ACA vs Best-of-n": (
        "kappa-ACA minus Best-of-n with the same BetaPRM and S_RB at kappa-ACA's tokens",
        lambda pp: _matched_d(pp, "betaprm_rb"),
    ),
    "kappa-ACA vs Best-of-n reliability vote": (
        "kappa-ACA minus Best-of-n decided by the reliability-weighted vote at kappa-ACA's tokens",
        lambda pp: _matched_d(pp, "betaprm_reliability_vote"),
    ),
    "kappa-ACA vs the authors' ACA rules": (
        "kappa-ACA (our rules) minus ACA under the paper authors' rules (same BetaPRM), each at its table setting "
        "(c_stop 0.3), per problem; their frontier spends more tokens than ours at every setting (two draws per "
        "kept sample, no stop while candidates share an answer), so no matched point exists",
        lambda pp: _table_minus(pp, "aca", "aca_authors"),
    ),
    "adaptive vote vs Best-of-N reliability vote": (
        "the adaptive reliability vote (table point) minus Best-of-N's reliability vote on the whole pool",
        _vote_vs_bon16,
    ),
    "adaptive vote at half the tokens vs Best-of-N reliability vote": (
        "the adaptive reliability vote's frontier at half of Best-of-N's tokens minus Best-of-N's reliability vote "
        "on the whole pool",
        _vote_half_vs_bon16,
    ),
    "adaptive vote vs Adaptive-Consistency": (
        "the adaptive reliability vote minus Adaptive-Consistency at the vote's tokens",
        lambda pp: _matched_d(pp, "adaptive_consistency", "vote"),
    ),
    "adaptive vote vs ESC": (
        "the adaptive reliability vote minus Early-Stopping Self-Consistency at the vote's tokens",
        lambda pp: _matched_d(pp, "esc", "vote"),
    ),
    "adaptive vote vs DeepConf-style": (
        "the adaptive reliability vote minus a DeepConf-style run on the standard PRM's mu at the vote's tokens",
        lambda pp: _matched_d(pp, "deepconf", "vote"),
    ),
    "adaptive vote vs its sigma = 0": (
        "the adaptive reliability vote minus the same with sigma = 0 (weights mean mu): what kappa adds",
        lambda pp: _matched_d(pp, "vote_sigma0", "vote"),
    ),
    "adaptive vote vs kappa-ACA": (
        "the adaptive reliability vote minus kappa-ACA (paper's rule) at the vote's tokens",
        lambda pp: _matched_d(pp, "aca", "vote"),
    ),
    "held-out NLL, BetaPRM vs binomial": (
        "nats per held-out step: BetaPRM's Beta-Binomial minus the standard PRM's binomial at mu",
        lambda pp: pp["held_out_nll"]["betaprm"] - pp["held_out_nll"]["standard_prm"],
    ),
}


# Where and how a run ran, not what it computed: left out of the comparison (the world is
# compared by its contents, not its file's path).
NOT_SETTINGS = ("out", "threads", "device", "backbone", "world_config", "reuse_prms")


def _demo_settings(results: dict) -> dict:
    """The settings that make a run's numbers: its config and its world's contents."""
    cfg = {k: v for k, v in results["config"].items() if k not in NOT_SETTINGS}
    return {**cfg, "world": results["world"]}


def run_or_read(name: str, world_config: Path | None, seed: int, args) -> dict:
    """One demo run's results and per-problem outcomes, run when not already in OUT."""
    out = Path(args.out) / name / f"seed{seed}"
    cmd = [sys.executable, "-m", "betaprm", "demo", "--seed", str(seed), "--out", str(out)]
    if world_config is not None:
        cmd += ["--world-config", str(world_config)]
    cmd += shlex.split(args.demo_flags)
    if (out / "results.json").is_file() and (out / "per_problem.json").is_file():
        results = json.loads((out / "results.json").read_text())
        want = _settings_of(cmd, world_config)
        # A setting newer than the run is not in its results: the run ran as its default does.
        have = {**_settings_of(cmd[:4], None), **_demo_settings(results)}
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            raise SystemExit(
                f"{out}: made with other demo settings ("
                + ", ".join(f"{k}: {have.get(k)!r} -> {want.get(k)!r}" for k in diff)
                + "); give another --out"
            )
        return {"results": results, "pp": read_per_problem(out / "per_problem.json"), "cached": True}
    if args.read_only:
        raise SystemExit(f"{out}: no finished demo run there (--read-only)")
    print(f"running {' '.join(cmd[2:])}", flush=True)
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"seed{seed}.log", "w") as log:
        res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd[2:])} failed (exit {res.returncode}); see {out.parent / f'seed{seed}.log'}")
    print(f"  done in {time.time() - t0:.0f}s", flush=True)
    results = json.loads((out / "results.json").read_text())
    return {"results": results, "pp": read_per_problem(out / "per_problem.json"), "cached": False}


def _settings_of(cmd, world_config) -> dict:
    """The demo settings ``cmd`` would run with (its DemoConfig, as results.json's config)."""
    from dataclasses import asdict

    from betaprm.cli import build_parser
    from betaprm.cli.flags import config_from_args
    from betaprm.synth.recipe import DemoConfig
    from betaprm.synth.world import WorldConfig

    args = build_parser().parse_args(cmd[3:])
    cfg = {k: v for k, v in asdict(config_from_args(DemoConfig, args)).items() if k not in NOT_SETTINGS}
    world = WorldConfig.from_json(world_config) if world_config else WorldConfig()
    return json.loads(json.dumps({**cfg, "world": world.to_dict()}))


def sweep_world(knob: str, value: str, out: Path) -> Path:
    """A world config file: the default world with ``knob`` set to ``value``."""
    from betaprm.synth.world import WorldConfig

    v = json.loads(value)
    WorldConfig(**{knob: v})  # checked now, by the world's own rules
    path = out / f"{knob}={value}" / "world.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({knob: v}) + "\n")
    return path


def claims_table(runs: list[dict], seed: int = 0) -> tuple[list[list[str]], dict]:
    """Rows of the claims table (pooled, then per group) and the numbers behind them."""
    groups = sorted({r["group"] for r in runs}, key=[r["group"] for r in runs].index)
    rows, numbers = [], {}
    for claim, (what, diff) in CLAIMS.items():
        per_run = [(r["group"], diff(r["pp"])) for r in runs]
        missing = [g for g, d in per_run if d is None]
        have = [d for _, d in per_run if d is not None]
        pooled = pooled_paired(have, seed=seed) if have else None  # None: no run has what it compares
        by_group = {
            g: pooled_paired([d for gg, d in per_run if gg == g and d is not None], seed=seed)
            if any(gg == g and d is not None for gg, d in per_run)
            else None
            for g in groups
        }
        numbers[claim] = {"what": what, "pooled": pooled, "by_group": by_group, "outside_range": missing}
        cell = lambda p: "-" if p is None else f"{p['diff']:+.3f} [{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"  # noqa: E731
        rows.append([claim, cell(pooled), *(cell(by_group[g]) for g in groups)])
    return rows, numbers


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder of the demo runs (OUT/WORLD/seedS), read or written")
    ap.add_argument("--worlds", nargs="+", default=list(WORLDS), help=f"worlds among {', '.join(WORLDS)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="demo seeds of every world")
    ap.add_argument(
        "--sweep", default=None, help="KNOB=V1,V2,...: the default world at each value of a WorldConfig field"
    )
    ap.add_argument("--demo-flags", default="", help='more betaprm demo flags for every run, e.g. "--quick"')
    ap.add_argument("--read-only", action="store_true", help="only read finished runs; run none")
    ap.add_argument("--json", default=None, help="write the table's numbers here")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    if args.sweep:
        knob, values = args.sweep.split("=", 1)
        plan = [(f"{knob}={v}", sweep_world(knob, v, out)) for v in values.split(",")]
    else:
        unknown = [w for w in args.worlds if w not in WORLDS]
        if unknown:
            raise SystemExit(f"unknown worlds {unknown}; choose among {', '.join(WORLDS)}")
        plan = [(w, WORLDS[w]) for w in args.worlds]
    runs = []
    for name, world_config in plan:
        for seed in args.seeds:
            r = run_or_read(name, world_config, seed, args)
            runs.append({"group": name, "seed": seed, **r})
    rows, numbers = claims_table(runs)
    groups = list(dict.fromkeys(r["group"] for r in runs))
    print(
        f"\n{len(runs)} demo runs ("
        + ", ".join(f"{r['group']} seed {r['seed']}" for r in runs)
        + "); paired differences, mean [95% bootstrap interval over runs and problems]"
    )
    print(markdown_table(rows, ["claim", "pooled", *groups]))
    # What kappa learned, per group (mean over its seeds): the mechanism a gain would come from.
    diag = {
        "Spearman(kappa, kappa*)": lambda r: r["calibration"]["betaprm"]["spearman_kappa_bayes"],
        "BetaPRM mu MAE vs Bayes mean": lambda r: r["calibration"]["betaprm"]["mu_mae_bayes"],
        "AUROC standard / BetaPRM": lambda r: (
            r["verification"]["standard_prm_auroc"],
            r["verification"]["betaprm_auroc"],
        ),
    }
    rows = []
    for label, get in diag.items():
        cells = []
        for g in groups:
            vals = np.array([get(r["results"]) for r in runs if r["group"] == g], dtype=float)
            m = vals.mean(0)
            cells.append(" / ".join(f"{x:.3f}" for x in np.atleast_1d(m)))
        rows.append([label, *cells])
    print("\nwhat the PRMs learned (mean over seeds)")
    print(markdown_table(rows, ["", *groups]))
    cost = sum(r["results"]["seconds"] for r in runs)
    fresh = sum(not r["cached"] for r in runs)
    print(f"cost: {cost / 60:.1f} min of demo runs ({fresh} run now, {len(runs) - fresh} read back)")
    aca = [r for r in runs if "aca_frontier" in r["results"]]
    for r in aca:
        c = r["results"]["frontier_comparisons"]
        print(
            f"{r['group']} seed {r['seed']}: higher frontier, kappa-ACA vs reward-only "
            f"{c['aca_vs_aca_reward_only']['verdict']}, vs proxy {c['aca_vs_aca_proxy']['verdict']}, "
            f"vs Best-of-n {c['aca_vs_bon_betaprm_rb']['verdict']} (a: kappa-ACA higher, b: the other)"
        )
    if args.json:
        summary = {
            "runs": [
                {"group": r["group"], "seed": r["seed"], "seconds": r["results"]["seconds"], "cached": r["cached"]}
                | (
                    {"frontier_comparisons": r["results"]["frontier_comparisons"]}
                    if "frontier_comparisons" in r["results"]
                    else {}
                )
                for r in runs
            ],
            "claims": numbers,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=1, default=_json_default) + "\n")


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(type(x))


if __name__ == "__main__":
    main()
