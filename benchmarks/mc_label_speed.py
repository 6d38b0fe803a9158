"""MC labelling of chain-arithmetic traces: the world's own policy's fast path against the
generic path every ``Generator`` takes (``SynthPolicy.generate``: the continuations' texts
written, then parsed), on the same traces, alternating, in one process. The counts must be
identical (the fast path makes the same random draws in the same order).

    python benchmarks/mc_label_speed.py [--problems 300] [--rounds 3] [--mc-n 16]
"""

import argparse
import time

from betaprm.synth import SynthPolicy, World, mc_label


class GenericPath(SynthPolicy):
    """The world's policy through the generic path (mc_label's fast path takes SynthPolicy only)."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=300, help="problems (two error-boosted traces each)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each path, alternating")
    ap.add_argument("--mc-n", type=int, default=16, help="continuations per step")
    a = ap.parse_args(argv)
    w = World()
    traces = [
        t
        for p in w.sample_problems(a.problems, 1, "b")
        for t in SynthPolicy(w, 2, error_boost=2.0).sample_traces(p, 2)
    ]
    times = {"generic": [], "fast": []}
    counts = {}
    for _ in range(a.rounds):
        for name, cls in (("generic", GenericPath), ("fast", SynthPolicy)):
            policy = cls(w, seed=3)
            t0 = time.perf_counter()
            counts[name] = [mc_label(w, policy, t, a.mc_n) for t in traces]
            times[name].append(time.perf_counter() - t0)
    assert counts["generic"] == counts["fast"], "the two paths gave different counts"
    steps = sum(len(t.steps) for t in traces)
    best = {k: min(v) for k, v in times.items()}
    for k, v in best.items():
        print(f"{k:8s} {steps / v:9.0f} labelled steps/s  (best of {a.rounds}: {v:.2f}s for {steps} steps)")
    print(f"fast / generic: {best['generic'] / best['fast']:.2f}x, counts identical")


if __name__ == "__main__":
    main()
