"""Does a PRM learn to check a step beyond parity? A one-PRM probe of the demo's recipe.

Builds the demo's training data and backbone (or reuses one), fine-tunes one PRM with the
demo's recipe (any ``betaprm demo`` option below changes it), and reports on fresh problems
what the README's "Where mu goes wrong" section is about:

- the backbone's own check, before any fine-tuning: first-error AUROC of its surprise at each
  verifiable step's written result, ``-log p(result | prefix)``, on odd and on even error
  offsets (the backbone predicts every result of error-free traces, so this is what it knows);
- the PRM's first-error AUROC on odd and even offsets (the drop in logit ``mu``, as in the
  demo) and its within-problem AUROC, with the Bayes belief and the parity-check observer
  beside.

    python benchmarks/step_check_probe.py --out /tmp/probe [--backbone outputs/demo/backbone]
        [--objective soft-ce] [--prm-steps 1100] [--num-layers 4] [--train-near-miss 0.3] ...

One PRM takes about half the time of ``betaprm demo --no-aca`` (CPU, default sizes: 4-5 min).
The summary is also written to ``OUT/probe.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from betaprm.evaluation.metrics import within_problem_auroc
from betaprm.scoring import score_traces
from betaprm.synth import SynthPolicy, World, WorldConfig
from betaprm.synth.diagnostics import clean_prefix_steps, parity_split_auroc, step_diagnostics
from betaprm.synth.experiment import label_records, sample_pools, split_seeds, training_traces
from betaprm.synth.recipe import DemoConfig
from betaprm.synth.training import build_backbone, train_prm


def backbone_surprise(backbone, tokenizer, pools, marker_repeat=1):
    """Per pool, per trace: the backbone's ``-log p`` of each step's written result token
    (the token after " ="), NaN for steps without one (the answer step)."""
    import torch

    from betaprm.batching import pad_batch
    from betaprm.formatting import TraceFormat, encode_traces

    marker = tokenizer.convert_tokens_to_ids("<prm>")
    vocab = tokenizer.get_vocab()
    eq = vocab["="] if "=" in vocab else vocab["\u0120="]  # word-level demo tokenizer, or byte-level BPE
    out = []
    backbone.eval()
    for pool in pools:
        ids = encode_traces(
            tokenizer,
            marker,
            [(pool.problem.question, t.steps) for t in pool.traces],
            TraceFormat(marker_repeat=marker_repeat),
        )
        x, mask = pad_batch(ids, tokenizer.pad_token_id)  # right padding: real tokens keep their positions
        with torch.no_grad():
            logp = torch.log_softmax(backbone(input_ids=x, attention_mask=mask).logits, -1)
        per = []
        for row, (seq, tr) in enumerate(zip(ids, pool.traces)):
            marks = [i for i, t in enumerate(seq) if t == marker][marker_repeat - 1 :: marker_repeat]
            s = np.full(len(tr.steps), np.nan)
            start = 0
            for k, m in enumerate(marks):
                eqs = [i for i in range(start, m) if seq[i] == eq]
                if eqs:  # " =" at i predicts the result token at i + 1
                    s[k] = -float(logp[row, eqs[-1], seq[eqs[-1] + 1]])
                start = m + 1
            per.append(s)
        out.append(per)
    return out


def first_error_split(pools, scores):
    """First-error AUROC of a per-step "error" score (higher = more suspect) on odd and even
    offsets, at verifiable steps whose prefix is error-free (all of them, unlike the demo's
    drop in mu, which needs step k - 1), with the number of errors of each kind."""
    s_, off = [], []
    for pool, sc in zip(pools, scores):
        for tr, s in zip(pool.traces, sc):
            for k, o, verifiable in clean_prefix_steps(pool.problem, tr.values):
                if verifiable:
                    s_.append(s[k])
                    off.append(o)
    off = np.array(off)
    res = parity_split_auroc(s_, off)
    res.update(n_odd=int((off % 2 == 1).sum()), n_even=int(((off % 2 == 0) & (off > 0)).sum()))
    return res


def eval_every_callback(every, metrics, res, out, t0):
    """A TrainerCallback measuring the PRM every ``every`` steps into ``res["curve"]`` and
    rewriting ``out/probe.json`` (``"finished": false`` until the run ends). Scoring runs
    without gradients in eval mode and draws no random numbers, so training is unchanged."""
    from transformers import TrainerCallback

    class EvalEvery(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every or state.global_step >= state.max_steps:
                return
            model.eval()
            point = {"step": state.global_step, "seconds": round(time.perf_counter() - t0, 1), **metrics(model)}
            model.train()
            res["curve"].append(point)
            (out / "probe.json").write_text(json.dumps({**res, "finished": False}, indent=2) + "\n")
            print(
                f"  step {point['step']}: within AUROC {point['within_problem_auroc']:.3f}, first-error odd "
                f"{point.get('first_error_auroc_odd', float('nan')):.3f}, "
                f"even {point.get('first_error_auroc_even', float('nan')):.3f}, mu MAE {point['mu_mae_bayes']:.3f} "
                f"({point['seconds']:.0f}s)",
                flush=True,
            )

    return EvalEvery()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the data, backbone, PRM and probe.json")
    ap.add_argument("--objective", default="soft-ce", choices=["soft-ce", "beta-binomial"], help="which PRM to train")
    ap.add_argument("--eval-problems", type=int, default=300, help="fresh evaluation problems")
    ap.add_argument("--eval-traces", type=int, default=8, help="policy traces per evaluation problem")
    ap.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help=(
            "also measure the PRM every this many optimiser steps (the curve in probe.json, rewritten at each point, "
            "so a run cut short keeps it; 0: only at the end)"
        ),
    )
    skip = {
        "out",
        "quick",
        "long",
        "aca",
        "parallel_prms",
        "n_val_problems",
        "n_test_problems",
        "n_candidates",
    }
    for f in fields(DemoConfig):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        typ = float if f.type in ("float", "float | None") else int if f.type in ("int", "int | None") else str
        if f.type == "bool":
            ap.add_argument(
                flag,
                type=lambda v: v.lower() in ("1", "true", "yes"),
                default=f.default,
                help=f.metadata["help"] + " (true/false)",
            )
        else:
            ap.add_argument(flag, type=typ, default=f.default, help=f.metadata["help"])
    a = ap.parse_args(argv)
    cfg = DemoConfig(
        out=a.out, aca=False, **{f.name: getattr(a, f.name) for f in fields(DemoConfig) if f.name not in skip}
    ).effective()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    world = World(WorldConfig.from_json(cfg.world_config) if cfg.world_config else None)
    t_all = time.perf_counter()

    # the demo's training data (same seeds), then backbone and one PRM
    seeds = split_seeds(cfg.seed)
    train_p = world.sample_problems(cfg.n_train_problems, seeds.train_problems, "train")
    traces = training_traces(
        world, train_p, seeds.train_policy, cfg.error_boost, cfg.traces_per_train_problem, cfg.train_near_miss
    )
    records = label_records(world, SynthPolicy(world, seed=seeds.label_policy), traces, world.cfg.mc_n, "train")
    with open(out / "train_counts.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    backbone, tokenizer, eff = build_backbone(cfg, cfg, world, traces, out, print, cfg.torch_device())
    s = cfg.seed * 7919  # the probe's own problems: seeds apart from every split's
    eval_p = world.sample_problems(a.eval_problems, s + 4242, "probe")
    pools = sample_pools(world, SynthPolicy(world, seed=s + 4243), eval_p, a.eval_traces)
    res = {
        "config": asdict(cfg),
        "objective": a.objective,
        "eval_problems": a.eval_problems,
        "eval_traces": a.eval_traces,
    }
    res["backbone_surprise_first_error_auroc"] = first_error_split(
        pools, backbone_surprise(backbone, tokenizer, pools, cfg.marker_repeat)
    )
    k = a.eval_traces
    labels = [p.correct for p in pools]
    eval_traces = [(p.problem.question, t.steps) for p in pools for t in p.traces]

    def prm_metrics(prm):
        scores = score_traces(prm, eval_traces, batch_size=64)
        mu = [[sc.mu for sc in scores[i * k : (i + 1) * k]] for i in range(len(pools))]
        return {
            "within_problem_auroc": within_problem_auroc([[m[-1] for m in pm] for pm in mu], labels),
            **{k2: v for k2, v in step_diagnostics(pools, mu).items() if k2.startswith("first_error")},
            "mu_mae_bayes": float(
                np.mean(
                    np.abs(
                        np.concatenate([m for pm in mu for m in pm])
                        - np.concatenate([b.mean for p in pools for b in p.bayes])
                    )
                )
            ),
        }

    for obs, get in (
        ("bayes", lambda p: [b.mean for b in p.bayes]),
        ("parity_check", lambda p: [m.mean for m in p.parity]),
    ):
        beliefs = [get(p) for p in pools]
        res[obs] = {
            "within_problem_auroc": within_problem_auroc([[b[-1] for b in bp] for bp in beliefs], labels),
            **{k2: v for k2, v in step_diagnostics(pools, beliefs).items() if k2.startswith("first_error")},
        }
    res["curve"] = []
    callbacks = [eval_every_callback(a.eval_every, prm_metrics, res, out, t_all)] if a.eval_every else None
    prm, _ = train_prm(eff, out, "prm", a.objective, cfg.seed, cfg.torch_device(), print, callbacks=callbacks)
    res["prm"] = prm_metrics(prm)
    res["seconds"] = round(time.perf_counter() - t_all, 1)
    res["finished"] = True
    (out / "probe.json").write_text(json.dumps(res, indent=2) + "\n")
    b = res["backbone_surprise_first_error_auroc"]
    print(
        f"backbone surprise, first-error AUROC: odd {b.get('odd', float('nan')):.3f} (n={b['n_odd']}), even "
        f"{b.get('even', float('nan')):.3f} (n={b['n_even']})"
    )
    for who in ("prm", "bayes", "parity_check"):
        r = res[who]
        print(
            f"{who:>12}: within-problem AUROC {r['within_problem_auroc']:.3f}, first-error AUROC odd "
            f"{r.get('first_error_auroc_odd', float('nan')):.3f}, "
            f"even {r.get('first_error_auroc_even', float('nan')):.3f}"
            + (f", mu MAE vs Bayes {r['mu_mae_bayes']:.3f}" if "mu_mae_bayes" in r else "")
        )
    print(f"({res['seconds']:.0f}s)")
    return res


if __name__ == "__main__":
    main()
