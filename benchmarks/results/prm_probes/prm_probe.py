# ruff: noqa: E401, E402, E501, E701, E702, E731, E741, F401, I001
# The probe script as run for benchmarks/RESULTS.md (entry "check replacements from the backbone's own language model"), kept as it was.
# Run: PYTHONPATH=src python prm_probe.py DEMO_RUN_DIR --out DIR [--objective soft-ce] [--set key=json ...] > NAME.json
"""Retrain one PRM from a finished demo run's backbone and train_counts.jsonl with
TrainConfig overrides; score the run's test pools (rebuilt from its seed) and print
within-problem AUROC, odd/even first-error AUROC, mu MAE vs Bayes and clean-prefix bias."""

import argparse, json, sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np, torch

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("--out", required=True)
ap.add_argument("--objective", default="beta-binomial")
ap.add_argument("--set", nargs="*", default=[], help="TrainConfig key=value (json values)")
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()
torch.set_num_threads(a.threads)
from betaprm.train import TrainConfig, train
from betaprm.scoring import score_traces
from betaprm.synth import World, WorldConfig, diagnostics
from betaprm.synth.experiment import split_seeds, sample_pools
from betaprm.synth.policy import SynthPolicy
from betaprm.synth.recipe import DemoConfig

run = Path(a.run)
res = json.loads((run / "results.json").read_text())
eff = res["effective_config"]
seed = res["seed"]
world = World(WorldConfig(**res["world"]))
s = split_seeds(seed)
val_p = world.sample_problems(eff["n_val_problems"], s.val_problems, "val")
test_p = world.sample_problems(eff["n_test_problems"], s.test_problems, "test")
pp = SynthPolicy(world, seed=s.pool_policy)
sample_pools(world, pp, val_p, eff["n_candidates"])  # advance the policy's RNG as the demo does
test_pools = sample_pools(world, pp, test_p, eff["n_candidates"])
kw = dict(
    model=str(run / "backbone"),
    data=str(run / "train_counts.jsonl"),
    output_dir=a.out,
    objective=a.objective,
    learning_rate=eff["prm_lr"],
    weight_decay=eff["prm_weight_decay"],
    lr_scheduler_type=eff["prm_schedule"],
    freeze_layers=eff["prm_freeze_layers"],
    global_batch_size=eff["prm_batch"],
    per_device_train_batch_size=eff["prm_batch"],
    max_steps=eff["prm_steps"],
    logging_steps=5,
    save_steps=10**9,
    save_total_limit=1,
    max_length=512,
    use_cpu=True,
    precision="fp32",
    seed=seed,
    aux_lm_weight=eff["aux_lm_weight"],
    marker_repeat=eff["marker_repeat"],
    head_lr_multiplier=eff["head_lr_multiplier"],
    kappa_detach=eff["kappa_detach"] and a.objective == "beta-binomial",
    group_by_length=eff["group_by_length"],
    step_weights=eff["prm_step_weights"],
    overwrite_output_dir=True,
)
for kv in a.set:
    k, v = kv.split("=", 1)
    kw[k] = json.loads(v)
t0 = time.perf_counter()
prm, trainer, _ = train(TrainConfig(**kw), log=lambda *x: None, quiet=True)
hist = [h for h in trainer.state.log_history if "loss" in h]
t1 = time.perf_counter()
prm.eval()
traces = [(p.problem.question, t.steps) for p in test_pools for t in p.traces]
flat = score_traces(prm, traces, batch_size=64)
k = eff["n_candidates"]
sc = [flat[i * k : (i + 1) * k] for i in range(len(test_pools))]
ver, bias = diagnostics.verification({"m": sc}, test_pools, [p.correct for p in test_pools])
mu = np.concatenate([x.mu for x in flat])
bm = np.concatenate([b.mean for p in test_pools for b in p.bayes])
out = dict(
    set=a.set,
    objective=a.objective,
    auroc=ver["m_auroc"],
    odd=ver.get("m_first_error_auroc_odd"),
    even=ver.get("m_first_error_auroc_even"),
    first=ver.get("m_first_error_auroc"),
    mae=float(np.abs(mu - bm).mean()),
    clean_bias=[round(x, 3) for x in bias["m"]],
    kappa_mean=hist[-1].get("kappa_mean"),
    loss=hist[-1]["loss"],
    train_s=round(t1 - t0),
    losses=[(h["step"], round(h["loss"], 3), round(h.get("kappa_mean", 0), 2)) for h in hist[::40]],
)
print(json.dumps(out))
sys.stdout.flush()
