"""What a demo run's PRMs pick as top-1, against the exact Bayes belief.

Rebuilds a finished `betaprm demo` run's test pools (same seed and world), scores the first
N of them with both PRMs, and classifies each top-1 pick (by final-step mu, as the demo's
shortcut table; and by the minimum mu over steps) as correct or wrong, with or without a
verifiable error and an error at a recall step (invisible to any step check).

    python benchmarks/top1_picks.py RUN_DIR [--world-config W.json] [--seed S] [--pools 300]
"""

import argparse
import collections

import numpy as np


def kind(pool, j):
    from betaprm.synth.diagnostics import error_kinds

    first, recall = error_kinds(pool.problem, pool.traces[j].values)
    return (
        ("correct" if pool.correct[j] else "wrong")
        + ("/verifiable error" if first is not None else "")
        + ("/recall error" if recall else "")
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a finished demo's --out folder (standard_prm/ and betaprm/ in it)")
    ap.add_argument("--world-config", default=None, help="the run's --world-config")
    ap.add_argument("--seed", type=int, default=0, help="the run's --seed")
    ap.add_argument("--pools", type=int, default=300, help="test pools to score (the first N)")
    args = ap.parse_args()

    from betaprm.model import BetaPRM
    from betaprm.scoring import score_traces
    from betaprm.synth import World, WorldConfig
    from betaprm.synth.experiment import demo_data
    from betaprm.synth.recipe import DemoConfig

    wc = args.world_config
    world = World(WorldConfig.from_json(wc) if wc else WorldConfig())
    pools = demo_data(world, DemoConfig(world_config=wc).effective(), args.seed).test_pools[: args.pools]
    n, k = len(pools), len(pools[0].traces)
    bayes = [int(np.argmax([b.mean[-1] for b in p.bayes])) for p in pools]
    print(f"Bayes belief: top-1 {np.mean([p.correct[j] for p, j in zip(pools, bayes)]):.3f}")
    print("  picks:", dict(collections.Counter(kind(p, j) for p, j in zip(pools, bayes))))
    for name in ("standard_prm", "betaprm"):
        prm = BetaPRM.from_pretrained(f"{args.run}/{name}", device="cpu").eval()
        sc = score_traces(prm, [(p.problem.question, t.steps) for p in pools for t in p.traces], batch_size=64)
        final = [int(np.argmax([s.mu[-1] for s in sc[i * k : (i + 1) * k]])) for i in range(n)]
        low = [int(np.argmax([s.mu.min() for s in sc[i * k : (i + 1) * k]])) for i in range(n)]
        acc = [np.mean([p.correct[j] for p, j in zip(pools, picks)]) for picks in (final, low)]
        print(f"{name}: top-1 by final-step mu {acc[0]:.3f}, by minimum mu {acc[1]:.3f}")
        print("  picks by final-step mu:", dict(collections.Counter(kind(p, j) for p, j in zip(pools, final))))


if __name__ == "__main__":
    main()
