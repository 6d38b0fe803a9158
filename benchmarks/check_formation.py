"""When does check pretraining's step check form? The demo's backbone stage alone (its data,
word-level tokenizer, language-model pretraining and check pretraining), as ``betaprm demo``
runs it, for one world, seed and check-pretraining setting: the demo's log lines up to the
backbone, among them the step the check formed at (or that it had not formed).

    python benchmarks/check_formation.py --seed 0 --check-lr 5e-4 [--world-config W.json]
        [--check-steps 2000] [--out DIR]

The formation step is the largest variable term in the demo's time (every 100 check steps
cost 20-25 s on 2 cores), so this is how a check-pretraining setting is probed without
training PRMs. With the default settings the log equals the first lines of
``betaprm demo --seed S`` to the bit.
"""

import argparse
import tempfile
import time
from pathlib import Path

from betaprm.synth import World, WorldConfig
from betaprm.synth.experiment import demo_data
from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import build_backbone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world-config", default=None, help="JSON world settings (default: the default world)")
    ap.add_argument("--check-lr", type=float, default=DemoConfig.check_lr)
    ap.add_argument("--check-batch", type=int, default=DemoConfig.check_batch)
    ap.add_argument("--check-steps", type=int, default=None, help="the cap (default: the recipe's)")
    ap.add_argument("--out", default=None, help="where the backbone is saved (default: a temporary folder)")
    args = ap.parse_args()
    cfg = DemoConfig(
        seed=args.seed,
        world_config=args.world_config,
        check_lr=args.check_lr,
        check_steps=args.check_steps,
        check_batch=args.check_batch,
    )
    eff = cfg.effective()
    world = World(WorldConfig.from_json(args.world_config) if args.world_config else WorldConfig())
    t0 = time.perf_counter()

    def log(line):
        print(f"{time.perf_counter() - t0:6.0f}s {line}", flush=True)

    data = demo_data(world, eff, args.seed)
    log(f"data ({time.perf_counter() - t0:.0f}s)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        build_backbone(cfg, eff, world, data.train_traces, out, log)


if __name__ == "__main__":
    main()
