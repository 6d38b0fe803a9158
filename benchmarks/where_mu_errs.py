"""Where a demo run's PRMs miss the Bayes belief: `mu` error by kind of step, calibration
by Bayes mean, AUROC by kind of wrong candidate, and the spread under an exact symmetry.

    python benchmarks/where_mu_errs.py RUN_DIR [--world-config W.json] [--seed S] [--split val] [--pools 300]

Rebuilds a finished `betaprm demo` run's pools (same seed and world) and scores them with
both PRMs. Printed for each PRM, after its within-problem AUROC and `mu` MAE over all steps
(the demo's two targets, here on the chosen split):
- `mu` MAE to the Bayes mean by step: verifiable or recall, on an error-free prefix or
  after a verifiable error, mid-chain or the last op step;
- mean Bayes mean, mean `mu` and MAE in bins of the Bayes mean (a `mu` pulled toward the
  middle at both ends is a fit that has not resolved the belief yet);
- within-problem AUROC of the final-step `mu` on the correct candidates against the wrong
  ones with a verifiable error, and against those whose only errors are in recall steps
  (no check can see those: the Bayes belief is near 0.5 there, below it where correct
  candidates carry cancelled errors);
- how far `mu` moves when the start and every written value are shifted consistently
  (start + s, each `* k` multiplying the shift by k): every offset, `q_t` and Bayes mean
  stays the same, so all of that movement is the PRM reading values, not errors.
The default split is validation, so that a recipe can be compared without the test pools.
"""

import argparse
import collections

import numpy as np


def shifted(problem, trace, shift):
    """(question, steps) of ``trace`` with the start shifted by ``shift`` and every written
    value moved with it; the connectives kept."""
    from betaprm.synth.world import Problem

    M = problem.modulus
    start = (problem.start + shift) % M
    q = Problem(problem.id, start, problem.ops, problem.hidden, problem.level, problem.visible, M)
    sig, vals = shift, []
    for (op, k), v in zip(problem.ops, trace.values):
        sig = sig * k % M if op == "*" else sig
        vals.append((v + sig) % M)
    steps = []
    for s, ((op, k), v) in enumerate(zip(problem.ops, vals)):
        prev = q.start if s == 0 else vals[s - 1]
        conn = trace.steps[s].split(" ", 1)[0]
        steps.append(f"{conn} {prev} {op} {k} = {v}" if op != "?" else f"{conn} {prev} ? = {v}")
    steps.append(f"answer {vals[-1]}")
    return q.question, steps


def pair_auroc(scores, pools, wrong_kind):
    from betaprm.evaluation.metrics import auroc

    out = []
    for s, p, kinds in zip(scores, pools, wrong_kind):
        y = np.asarray(p.correct, bool)
        keep = y | kinds
        if y.any() and kinds.any():
            out.append(auroc(np.asarray(s)[keep], y[keep]))
    return float(np.mean(out)), len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a finished demo's --out folder (standard_prm/ and betaprm/ in it)")
    ap.add_argument("--world-config", default=None, help="the run's --world-config")
    ap.add_argument("--seed", type=int, default=0, help="the run's --seed")
    ap.add_argument("--split", choices=("val", "test"), default="val", help="which pools")
    ap.add_argument("--pools", type=int, default=300, help="pools to score (the first N)")
    ap.add_argument("--shifts", type=int, default=4, help="shifted copies per trace, on the first 60 pools")
    args = ap.parse_args()

    from betaprm.evaluation.metrics import within_problem_auroc
    from betaprm.model import BetaPRM
    from betaprm.scoring import score_traces
    from betaprm.synth import World, WorldConfig
    from betaprm.synth.diagnostics import error_kinds
    from betaprm.synth.experiment import demo_data
    from betaprm.synth.recipe import DemoConfig

    wc = args.world_config
    world = World(WorldConfig.from_json(wc) if wc else WorldConfig())
    data = demo_data(world, DemoConfig(world_config=wc).effective(), args.seed)
    pools = (data.val_pools if args.split == "val" else data.test_pools)[: args.pools]
    k = len(pools[0].traces)
    errs = [[error_kinds(p.problem, t.values) for t in p.traces] for p in pools]
    visible = [np.array([not c and e[0] is not None for c, e in zip(p.correct, pe)]) for p, pe in zip(pools, errs)]
    recall_only = [np.array([not c and e[0] is None for c, e in zip(p.correct, pe)]) for p, pe in zip(pools, errs)]
    bayes_final = [[b.mean[-1] for b in p.bayes] for p in pools]
    vis_auc, recall_auc = (pair_auroc(bayes_final, pools, w)[0] for w in (visible, recall_only))
    print(
        f"{len(pools)} {args.split} pools of {k}. Bayes belief: within-problem AUROC "
        f"{within_problem_auroc(bayes_final, [p.correct for p in pools]):.3f}; correct vs verifiably wrong "
        f"{vis_auc:.3f}, vs recall-only wrong {recall_auc:.3f}"
    )
    rng = np.random.default_rng(0)
    sym_pools = pools[:60]
    sym_items = [
        shifted(p.problem, t, 0 if r == 0 else int(rng.integers(1, world.M)))
        for p in sym_pools
        for t in p.traces
        for r in range(args.shifts + 1)
    ]
    for name in ("standard_prm", "betaprm"):
        prm = BetaPRM.from_pretrained(f"{args.run}/{name}", device="cpu").eval()
        sc = score_traces(prm, [(p.problem.question, t.steps) for p in pools for t in p.traces], batch_size=64)
        final = [[x.mu[-1] for x in sc[i * k : (i + 1) * k]] for i in range(len(pools))]
        by_kind, mu_all, bayes_all = collections.defaultdict(list), [], []
        for i, p in enumerate(pools):
            for j, (t, b) in enumerate(zip(p.traces, p.bayes)):
                mu, f = sc[i * k + j].mu, errs[i][j][0]
                mu_all.append(mu)
                bayes_all.append(b.mean)
                for s in range(min(len(mu), p.problem.T)):
                    kind = (
                        ("recall" if p.problem.ops[s][0] == "?" else "verifiable")
                        + (" after an error" if f is not None and s >= f else ", clean prefix")
                        + (", last op" if s == p.problem.T - 1 else "")
                    )
                    by_kind[kind].append(abs(mu[s] - b.mean[s]))
        mu_all, bayes_all = np.concatenate(mu_all), np.concatenate(bayes_all)
        auc, mae = within_problem_auroc(final, [p.correct for p in pools]), np.abs(mu_all - bayes_all).mean()
        print(f"\n{name}: within-problem AUROC {auc:.3f}, mu MAE to the Bayes mean {mae:.3f}")
        for kind, v in sorted(by_kind.items()):
            print(f"  {kind:40s} {np.mean(v):.3f}  ({len(v)} steps)")
        edges = [0.05, 0.2, 0.4, 0.6, 0.8, 0.95]
        bins = np.digitize(bayes_all, edges)
        print("  Bayes-mean bin  mean Bayes  mean mu  MAE    steps")
        for b, lo in enumerate([0.0] + edges):
            m = bins == b
            if m.any():
                hi = ([*edges, 1.0])[b]
                print(
                    f"  [{lo:.2f}, {hi:.2f})   {bayes_all[m].mean():.3f}       {mu_all[m].mean():.3f}    "
                    f"{np.abs(mu_all[m] - bayes_all[m]).mean():.3f}  {int(m.sum())}"
                )
        print(
            f"  final-step AUROC: correct vs verifiably wrong {pair_auroc(final, pools, visible)[0]:.3f}, "
            f"vs recall-only wrong {pair_auroc(final, pools, recall_only)[0]:.3f}"
        )
        ssc = score_traces(prm, sym_items, batch_size=64)
        n = args.shifts + 1
        copies = (np.stack([x.mu for x in ssc[i : i + n]]) for i in range(0, len(ssc), n))
        spread = [np.abs(m - m.mean(0)).mean() for m in copies]
        print(f"  mean |mu - its mean over {n} shifted copies| {np.mean(spread):.3f} ({len(spread)} traces)")


if __name__ == "__main__":
    main()
