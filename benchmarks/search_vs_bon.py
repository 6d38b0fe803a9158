"""Best-of-N, ACA, beam search and DVTS at the same candidate budget on the chain-arithmetic
world: accuracy against generated tokens.

The scorer is the exact Bayes belief (an ideal PRM: mu = posterior mean of q_t, kappa = the
moment-matched kappa*), or with ``--prm DIR`` a trained BetaPRM (e.g. ``OUT/betaprm`` of
``betaprm demo``; its world must be the default one or ``--world-config``'s). Fresh problems
(``--seed``), never a demo's test split. Tokens: generated steps' tokens in words (the
synthetic policy's default count), prompt and kept prefix excluded, as ACA counts them.

    python benchmarks/search_vs_bon.py [--problems 300] [--budget 16] [--prm outputs/demo/betaprm]
        [--out benchmarks/results/search_vs_bon/bayes.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from betaprm.aca import ACAConfig, run_aca, summarize
from betaprm.search import SearchConfig, run_search
from betaprm.synth import SynthPolicy, World, WorldConfig, synth_answer, synth_is_correct, synth_tasks
from betaprm.synth.experiment import BayesScorer


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=300)
    ap.add_argument("--budget", type=int, default=16, help="candidates (Best-of-N, ACA) or beams (search)")
    ap.add_argument("--width", type=int, default=4, help="beam width of beam search and DVTS")
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--world-config", default=None)
    ap.add_argument("--prm", default=None, help="a BetaPRM directory to score with instead of the Bayes belief")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    a = ap.parse_args()

    world = World(WorldConfig.from_json(a.world_config) if a.world_config else WorldConfig())
    problems = world.sample_problems(a.problems, a.seed, "search")
    tasks = synth_tasks(problems)
    if a.prm:
        from betaprm import BetaPRM
        from betaprm.scoring import PRMScorer

        scorer, name = PRMScorer(BetaPRM.from_pretrained(a.prm).eval(), 64), f"BetaPRM {a.prm}"
    else:
        scorer, name = BayesScorer(world, problems), "Bayes belief"
    n, w = a.budget, a.width
    runs = {
        f"Best-of-{n} (last mu)": ("aca", ACAConfig.best_of_n(budget=n, final="last", seed=a.seed)),
        f"Best-of-{n} (S_lin)": ("aca", ACAConfig.best_of_n(budget=n, final="lin", seed=a.seed)),
        f"ACA (budget {n}, S_lin)": ("aca", ACAConfig(budget=n, final="lin", seed=a.seed)),
        f"beam search ({n} beams, width {w})": ("search", SearchConfig("beam", n, w, seed=a.seed)),
        "beam search, rank mu + sigma": ("search", SearchConfig("beam", n, w, rank="ucb", seed=a.seed)),
        "beam search, repair wrong-looking steps": (
            "search",
            SearchConfig("beam", n, w, repair=True, c=0.0, p_bad=0.2, seed=a.seed),
        ),
        f"DVTS ({n // w} subtrees x {w})": ("search", SearchConfig("dvts", n, w, seed=a.seed)),
        "DVTS, rank mu + sigma": ("search", SearchConfig("dvts", n, w, rank="ucb", seed=a.seed)),
    }
    single = summarize(
        run_aca(
            tasks,
            SynthPolicy(world, seed=a.seed),
            scorer,
            ACAConfig.best_of_n(budget=1, final="last"),
            synth_answer,
            synth_is_correct,
            progress=False,
        )
    )
    rows = {"single sample": {**single, "seconds": 0.0}}
    for label, (kind, cfg) in runs.items():
        t0 = time.perf_counter()
        policy = SynthPolicy(world, seed=a.seed)
        if kind == "aca":
            recs = run_aca(
                tasks, policy, scorer, cfg, synth_answer, synth_is_correct, write_candidates=False, progress=False
            )
        else:
            recs = run_search(tasks, policy, scorer, cfg, synth_answer, synth_is_correct, progress=False)
        rows[label] = {**summarize(recs), "seconds": round(time.perf_counter() - t0, 1)}
    print(f"{a.problems} problems, scorer: {name}")
    print("| method | accuracy | generated tokens | tokens / single sample |")
    print("|---|---|---|---|")
    for label, r in rows.items():
        print(f"| {label} | {r['acc']:.3f} | {r['tokens']} | {r['tokens'] / single['tokens']:.1f}x |")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"args": vars(a), "scorer": name, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
