"""How much a parity-only step check costs in the chain-arithmetic world, without any model.

Compares the exact Bayes belief with the parity-check observer (the Bayes filter that sees each
verifiable step's error only modulo 2, ``World.bayes_belief(..., check_mod=2)``) on fresh
problems: within-problem AUROC of the final belief, mean absolute difference of the two means,
and the drift of the observer below the Bayes mean on error-free prefixes, step by step.

    python benchmarks/parity_observer.py [--problems 300] [--traces 8] [--seed 4242]
"""

import argparse

import numpy as np

from betaprm.evaluation.metrics import within_problem_auroc
from betaprm.synth import SynthPolicy, World


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=300, help="fresh problems")
    ap.add_argument("--traces", type=int, default=8, help="policy traces per problem")
    ap.add_argument("--seed", type=int, default=4242, help="problem seed (the policy uses seed + 1)")
    a = ap.parse_args(argv)
    w = World()
    policy = SynthPolicy(w, seed=a.seed + 1)
    final = {"bayes": [], "parity": []}
    labels, diffs, drift = [], [], {}
    for p in w.sample_problems(a.problems, a.seed, "parity"):
        truth = p.true_values()
        traces = policy.sample_traces(p, a.traces)
        table = w.q_table(p)
        bm = [w.bayes_belief(p, t.values, table)[0] for t in traces]
        pm = [w.bayes_belief(p, t.values, table, check_mod=2)[0] for t in traces]
        final["bayes"].append([m[-1] for m in bm])
        final["parity"].append([m[-1] for m in pm])
        labels.append(np.array([t.correct for t in traces]))
        for t, b, q in zip(traces, bm, pm):
            diffs.append(np.abs(q - b))
            for k in range(p.T):
                if t.values[k] != truth[k]:
                    break
                drift.setdefault(k + 1, []).append(q[k] - b[k])
    print(f"{a.problems} problems x {a.traces} traces")
    print(f"within-problem AUROC: Bayes belief {within_problem_auroc(final['bayes'], labels):.3f}, parity-check observer {within_problem_auroc(final['parity'], labels):.3f}")
    print(f"mean |parity-check observer mean - Bayes mean|: {np.concatenate(diffs).mean():.3f}")
    print("parity-check observer - Bayes mean on error-free prefixes, by step: " + " ".join(f"{np.mean(drift[k]):+.3f}" for k in sorted(drift)))


if __name__ == "__main__":
    main()
