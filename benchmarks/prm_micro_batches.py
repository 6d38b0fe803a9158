"""The demo's PRM training step with its batch of 32 traces in one forward pass against the
same random batches dealt into several length-sorted micro-batches (``betaprm train
--batch-rebalance``, the demo's ``--prm-micro-batches``), and against batches grouped by
length across the data (``--group-by-length``, which changes what a batch holds).

    python benchmarks/prm_micro_batches.py [--world-config benchmarks/worlds/long_chains.json]
        [--steps 60] [--rounds 2] [--json OUT.json]

Builds the demo's training data for the world (``--problems`` problems, two traces each),
its word-level tokenizer and a backbone of the default recipe's size with random weights
(the time of a step does not depend on them), then trains the default recipe's PRM
(BetaPRM, 4 of 8 layers frozen, one thread, as each of the demo's two PRM workers) for
``--steps`` optimiser steps per variant, the variants alternating over ``--rounds``. Prints
milliseconds per optimiser step after a 5-step warm-up (medians over rounds) and each
variant's ratio to the one-pass step, all from this one run.
"""

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from betaprm.synth import World, WorldConfig
from betaprm.synth.experiment import demo_data
from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import demo_tokenizer, new_backbone, train_prm

VARIANTS = {
    "one pass of 32": dict(prm_micro_batches=1),
    "2 sorted micro-batches": dict(prm_micro_batches=2),
    "4 sorted micro-batches": dict(prm_micro_batches=4),
    "8 sorted micro-batches": dict(prm_micro_batches=8),
    "grouped by length (other batches)": dict(prm_micro_batches=1, group_by_length=True),
}
WARMUP = 5


class StepClock(TrainerCallback):
    """Wall time from the end of optimiser step ``WARMUP`` to the end of training."""

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == WARMUP:
            self.t0 = time.perf_counter()
        self.t1 = time.perf_counter()


def build(run: Path, world: World, problems: int, seed: int):
    cfg = DemoConfig(n_train_problems=problems, n_val_problems=2, n_test_problems=2, seed=seed)
    eff = cfg.effective()
    data = demo_data(world, eff, seed)
    with open(run / "train_counts.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in data.train_records)
    tok = demo_tokenizer(world, [(r["question"], r["steps"]) for r in data.train_records[:2000]])
    model = new_backbone(eff, len(tok))
    model.save_pretrained(run / "backbone")
    tok.save_pretrained(run / "backbone")
    return eff


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-config", help="a world JSON (default: the default world)")
    ap.add_argument("--problems", type=int, default=3000, help="training problems (3000; two traces each)")
    ap.add_argument("--steps", type=int, default=60, help="optimiser steps per variant and round (60)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the variants (2)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument("--json", help="write the timings here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    world = World(WorldConfig.from_json(a.world_config) if a.world_config else WorldConfig())
    names = a.variants.split(",")
    times = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        eff = build(run, world, a.problems, 0)
        for r in range(a.rounds):
            for n in names:
                clock = StepClock()
                cfg = dataclasses.replace(eff, prm_steps=WARMUP + a.steps, **VARIANTS[n])
                train_prm(cfg, run, "prm", "beta-binomial", 0, "cpu", lambda *_: None, callbacks=[clock])
                times[n].append((clock.t1 - clock.t0) / a.steps)
                print(f"round {r + 1}  {n}: {1000 * times[n][-1]:.1f} ms/step", flush=True)
    base = statistics.median(times[names[0]])
    print(f"\nmedian ms per optimiser step, and speed against '{names[0]}' (same run)")
    for n in names:
        m = statistics.median(times[n])
        print(f"  {n:36s} {1000 * m:7.1f}   {base / m:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps({"world": a.world_config, "steps": a.steps, "times": times}, indent=2))


if __name__ == "__main__":
    main()
