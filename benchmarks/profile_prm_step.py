"""Where a demo PRM's training time goes: cProfile around the demo's own PRM fine-tuning.

    python benchmarks/profile_prm_step.py RUN_DIR [--steps 80] [--objective beta-binomial] [--top 25]

RUN_DIR is the ``--out`` of a finished ``betaprm demo`` (its ``backbone/`` and
``train_counts.jsonl``). Trains one PRM there with the default recipe's settings, one
thread as in the demo, through ``synth.training.train_prm`` (written to ``RUN_DIR/profile_prm``),
after a 5-step warm-up, and prints the wall time and the functions with the most time of
their own. The share of time in the model's forward and backward (``linear``,
``scaled_dot_product_attention``, ``silu``, ``run_backward``) is what no change outside the model
can save.
"""

import argparse
import cProfile
import dataclasses
import pstats
import time
from pathlib import Path

import torch

from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import train_prm

MODEL_OWN = ("run_backward", "torch._C._nn.linear", "scaled_dot_product_attention", "torch._C._nn.silu")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--steps", type=int, default=80, help="profiled optimiser steps (80)")
    ap.add_argument("--objective", default="beta-binomial", choices=["beta-binomial", "soft-ce"])
    ap.add_argument("--top", type=int, default=25, help="functions to print (25)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    eff = DemoConfig().effective()

    def run(steps):
        t0 = time.perf_counter()
        train_prm(dataclasses.replace(eff, prm_steps=steps), a.run_dir, "profile_prm", a.objective, 0, "cpu", print)
        return time.perf_counter() - t0

    run(5)
    prof = cProfile.Profile()
    prof.enable()
    wall = run(a.steps)
    prof.disable()
    stats = pstats.Stats(prof)
    own = sum(v[2] for k, v in stats.stats.items() if any(m in k[2] for m in MODEL_OWN))
    print(f"{a.steps} steps in {wall:.1f}s; the model's forward and backward {own:.1f}s ({own / wall:.0%})")
    stats.sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
