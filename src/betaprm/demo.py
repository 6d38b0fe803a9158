"""``betaprm demo``: the paper's Best-of-N and calibration tables in the chain-arithmetic
world, where the truth is known (docs/design.md section 6), on CPU.

The pipeline uses the same ``BetaPRM``, trainer and scorer as real backbones:

1. problems split into train / validation / test; training traces from the policy (with
   verifiable errors enriched by ``error_boost``), each step labelled with K of ``mc_n``
   real continuations of the (unboosted) policy;
2. a byte-level BPE tokenizer; a small Llama pretrained as a language model on
   error-free traces, saved, and the start of both PRMs;
3. a standard PRM (``soft-ce``) and a BetaPRM (``beta-binomial``) fine-tuned with the
   same budget and seed through ``betaprm.train``;
4. Best-of-``n_candidates`` pools for validation and test problems, scored by both; the
   selectors' hyperparameters tuned on validation only;
5. tables, ``results.json`` (with config, seed and version) and plots.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .errors import BetaPRMInputError


def _f(default, help_text):
    return field(default=default, metadata={"help": help_text})


@dataclass
class DemoConfig:
    out: str = _f("outputs/demo", "folder for data, models, results.json and plots")
    world_config: str | None = _f(None, "JSON file of chain-arithmetic world settings (default: docs/design.md section 6)")
    seed: int = _f(0, "random seed for problems, models and training")
    quick: bool = _f(False, "a small run (about a minute) with the same steps")
    long: bool = _f(False, "the recipe that learns the whole step check (README: 8x96 backbone, 12,000 problems, 30%% off-by-one training errors, 6,600 steps per PRM): over an hour on 2 CPU cores, 5-6 minutes with --device cuda on one H200")
    n_train_problems: int | None = _f(None, "training problems (3000; --quick 500, --long 12000)")
    traces_per_train_problem: int = _f(2, "policy traces per training problem")
    error_boost: float = _f(2.0, "training traces only: multiply the error rates of verifiable steps (+, *) by this: more errors a PRM can see")
    train_near_miss: float | None = _f(None, "training traces only: share of errors that are off by +-1 (the world's near_miss; --long 0.3); lower puts more errors that keep the result's parity into training")
    n_val_problems: int | None = _f(None, "validation problems, for selector tuning (300; --quick 60)")
    n_test_problems: int | None = _f(None, "test problems, the Best-of-N pools (1000; --quick 150)")
    n_candidates: int = _f(16, "candidates per pool")
    hidden_size: int | None = _f(None, "backbone width (128; --quick 96, --long 96)")
    num_layers: int | None = _f(None, "backbone depth (4; --quick 3, --long 8)")
    pretrain_tokens: int | None = _f(None, "language-model pretraining budget in tokens (1000000; --quick 200000)")
    pretrain_lr: float = _f(2e-3, "pretraining learning rate")
    prm_steps: int | None = _f(None, "optimiser steps for each PRM (1100; --quick 120, --long 6600)")
    prm_batch: int = _f(32, "traces per PRM optimiser step")
    prm_lr: float = _f(1e-3, "PRM learning rate")
    head_lr_multiplier: float = _f(1.0, "kappa head learning rate / prm_lr (the paper's 10x, at lr 1e-5 on 8B models, let this tiny model's kappa path swamp the mu path at lr 1e-3)")
    aux_lm_weight: float = _f(1.0, "auxiliary language-model loss during PRM training")
    marker_repeat: int = _f(1, "markers per step, scores read at the last (2 gives the small model an extra position)")
    kappa_detach: bool = _f(True, "BetaPRM: stop the kappa head's gradient at the backbone (the tiny backbone's mu learns faster when only mu shapes it)")
    parallel_prms: bool = _f(True, "train the two PRMs at the same time in two processes: on CPU (2 or more threads) with half the threads each, about 1.2x faster on 2 cores than one after the other (the same PRMs as one after the other with that thread count); on a GPU, sharing it. From Python, call run_demo under if __name__ == '__main__' (the workers are spawned)")
    group_by_length: bool = _f(False, "PRM training batches from traces of similar length (betaprm train --group-by-length): faster steps, but in the README's run it cost AUROC")
    aca: bool = _f(True, "also run Adaptive Computation Allocation and its ablations on the test problems")
    threads: int = _f(0, "torch CPU threads (0: torch's default)")
    device: str = _f("cpu", "cpu, cuda or auto (cuda when a GPU is present). The README's tables come from cpu; on a GPU the same steps run in fp32, much faster, with numbers that differ slightly")
    backbone: str | None = _f(None, "a backbone directory saved by an earlier demo run (its OUT/backbone): skips pretraining")

    def __post_init__(self):
        bad = [f"{k} must be >= 1, got {getattr(self, k)}" for k in ("n_train_problems", "traces_per_train_problem", "n_val_problems", "n_test_problems", "n_candidates", "hidden_size", "num_layers", "pretrain_tokens", "prm_steps", "prm_batch") if getattr(self, k) is not None and getattr(self, k) < 1]
        if self.n_candidates < 2:
            bad.append("n_candidates must be >= 2 for Best-of-N")
        if self.train_near_miss is not None and not 0 <= self.train_near_miss <= 1:
            bad.append(f"train_near_miss must be in [0, 1], got {self.train_near_miss}")
        if self.quick and self.long:
            bad.append("--quick and --long are two different runs: choose one")
        if self.device not in ("cpu", "cuda", "auto"):
            bad.append(f"device must be cpu, cuda or auto, got {self.device!r}")
        if bad:
            raise BetaPRMInputError("bad demo configuration: " + "; ".join(bad))

    def torch_device(self) -> str:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise BetaPRMInputError("--device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)")
        return "cuda" if self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available()) else "cpu"

    def effective(self) -> DemoConfig:
        """The settings of the run: a setting left unset (None) takes the value of ``--quick``
        or ``--long`` if one is on, else the default recipe's; a setting given is kept, even
        when it equals the default recipe's."""
        preset = {**BASE, **(PRESETS["quick"] if self.quick else PRESETS["long"] if self.long else {})}
        return replace(self, **{k: v for k, v in preset.items() if getattr(self, k) is None})


# The default recipe's values of the settings that the presets change (README: about 13 minutes on 2 cores).
BASE = dict(n_train_problems=3000, n_val_problems=300, n_test_problems=1000, pretrain_tokens=1_000_000, prm_steps=1100, hidden_size=128, num_layers=4)
PRESETS = {
    "quick": dict(n_train_problems=500, n_val_problems=60, n_test_problems=150, pretrain_tokens=200_000, prm_steps=120, hidden_size=96, num_layers=3),
    # Found with benchmarks/probe_sweep.sh on a GPU (README): the smallest budget seen to learn
    # the mod-5 half of the step check, not only parity.
    "long": dict(n_train_problems=12_000, train_near_miss=0.3, prm_steps=6600, hidden_size=96, num_layers=8),
}


# ---------------------------------------------------------------------------- data
@dataclass
class Pool:
    problem: object
    traces: list
    answers: list
    correct: np.ndarray
    q_true: list = field(default_factory=list)
    bayes: list = field(default_factory=list)  # per trace: (mean, var, lo, hi)
    parity: list = field(default_factory=list)  # per trace: (mean, var) of q for an observer who checks only parity


def _pools(world, policy, problems, n):
    pools = []
    for p in problems:
        traces = policy.sample_traces(p, n)
        table = world.q_table(p)
        parity = [world.bayes_belief(p, t.values, table, check_mod=2) for t in traces] if world.M % 2 == 0 else []
        pools.append(Pool(p, traces, [t.final for t in traces], np.array([t.correct for t in traces]),
                          [world.true_q(p, t.values, table) for t in traces], [world.bayes_summary(p, t.values, 0.9, table) for t in traces], parity))
    return pools


def _train_traces(world, problems, eff, seed):
    """The PRMs' training traces: the policy with verifiable errors enriched by
    ``error_boost`` and, with ``train_near_miss``, another mix of error offsets. Their labels
    always come from the world's own policy (``_records``), so K of N stays the truth."""
    from .synth import SynthPolicy, World

    train_world = world if eff.train_near_miss is None else World(replace(world.cfg, near_miss=eff.train_near_miss))
    boosted = SynthPolicy(train_world, seed=seed, error_boost=eff.error_boost)
    return [t for p in problems for t in boosted.sample_traces(p, eff.traces_per_train_problem)]


def _records(world, label_policy, traces, mc_n, prefix):
    from .synth import mc_label

    return [{"id": f"{prefix}{i}", "question": t.problem.question, "steps": t.steps, "mc_correct": mc_label(world, label_policy, t, mc_n), "mc_total": mc_n}
            for i, t in enumerate(traces)]


def demo_data(world, eff, seed):
    """The demo's data for ``seed``: ``(train_traces, train_records, val_pools, test_pools,
    held_records)``. Deterministic, so a later script can rebuild a run's test split."""
    from .synth import SynthPolicy

    s = seed * 7919
    train_p = world.sample_problems(eff.n_train_problems, s + 1, "train")
    val_p = world.sample_problems(eff.n_val_problems, s + 2, "val")
    test_p = world.sample_problems(eff.n_test_problems, s + 3, "test")
    label_policy = SynthPolicy(world, seed=s + 11)
    train_traces = _train_traces(world, train_p, eff, s + 12)
    train_records = _records(world, label_policy, train_traces, world.cfg.mc_n, "train")
    pool_policy = SynthPolicy(world, seed=s + 13)
    val_pools = _pools(world, pool_policy, val_p, eff.n_candidates)
    test_pools = _pools(world, pool_policy, test_p, eff.n_candidates)
    held_records = _records(world, label_policy, [p.traces[0] for p in test_pools], world.cfg.mc_n, "held")
    return train_traces, train_records, val_pools, test_pools, held_records


# ---------------------------------------------------------------------------- backbone
def _pretrain(cfg, world, tokenizer, marker, log, device="cpu"):
    """A small Llama trained as a language model on error-free traces, in the PRM's format."""
    import torch

    from .formatting import TraceFormat, encode_traces
    from .scoring import pad_batch
    from .synth import SynthPolicy
    from .tiny import tiny_causal_lm

    torch.manual_seed(cfg.seed)
    model = tiny_causal_lm(len(tokenizer), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=4, max_position_embeddings=512, seed=cfg.seed).to(device).train()
    clean = SynthPolicy(world, seed=cfg.seed + 101, error_boost=0.0)
    marker_id = tokenizer.convert_tokens_to_ids(marker)
    fmt = TraceFormat(marker=marker, marker_repeat=cfg.marker_repeat)  # the PRM's layout
    probe = encode_traces(tokenizer, marker_id, [(t.problem.question, t.steps) for p in world.sample_problems(50, cfg.seed + 7, "x") for t in clean.sample_traces(p, 1)], fmt)
    per_trace = np.mean([len(x) for x in probe])
    batch = 32
    steps = max(1, int(cfg.pretrain_tokens / (per_trace * batch)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (0.05 * steps)) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    problems = world.sample_problems(steps * batch, cfg.seed + 1000, "pre")
    t0 = time.perf_counter()
    for s in range(steps):
        chunk = problems[s * batch : (s + 1) * batch]
        ids = encode_traces(tokenizer, marker_id, [(p.question, clean.sample_traces(p, 1)[0].steps) for p in chunk], fmt)
        x, mask = pad_batch(ids, tokenizer.pad_token_id)
        x, mask = x.to(device), mask.to(device)
        labels = x.masked_fill(mask == 0, -100)
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (s + 1) % max(1, steps // 5) == 0 or s + 1 == steps:
            log(f"  pretraining step {s + 1}/{steps}  loss {loss.item():.3f}  ({time.perf_counter() - t0:.0f}s)")
    return model.cpu().eval()


def _backbone(cfg, eff, world, train_traces, out, log, device="cpu"):
    """The byte-level tokenizer and the pretrained backbone (or ``cfg.backbone`` reused),
    both saved to ``out/backbone``; returns ``(backbone, tokenizer, eff)`` with ``eff``'s
    sizes set to the backbone's."""
    from tokenizers import AddedToken

    from .formatting import format_trace
    from .tiny import train_bytelevel_tokenizer

    t0 = time.perf_counter()
    marker = "<prm>"
    if cfg.backbone:
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

        if not (Path(cfg.backbone) / "config.json").is_file():
            raise BetaPRMInputError(f"--backbone {cfg.backbone}: not a saved backbone (config.json missing)")
        backbone = AutoModelForCausalLM.from_pretrained(cfg.backbone)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(cfg.backbone)
        eff = replace(eff, hidden_size=backbone.config.hidden_size, num_layers=backbone.config.num_hidden_layers)
        log(f"backbone: reusing {cfg.backbone}")
    else:
        # Trained on traces as the PRM sees them, so "Question:" and "Process:" are tokens too.
        texts = [format_trace(t.problem.question, t.steps).replace(marker, " ") for t in train_traces[:2000]]
        tokenizer = train_bytelevel_tokenizer(texts, vocab_size=300)
        tokenizer.add_tokens([AddedToken(marker, special=True, normalized=False)], special_tokens=True)
        backbone = _pretrain(eff, world, tokenizer, marker, log, device)
    backbone.save_pretrained(out / "backbone")
    tokenizer.save_pretrained(out / "backbone")
    n_params = sum(p.numel() for p in backbone.parameters())
    how = f"from {cfg.backbone}" if cfg.backbone else f"pretrained on {eff.pretrain_tokens / 1e6:.2f}M tokens of error-free traces"
    log(f"backbone: Llama {eff.hidden_size}x{eff.num_layers} ({n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}) {how} ({time.perf_counter() - t0:.0f}s)")
    return backbone, tokenizer, eff


def _train_prm(eff, out, name, objective, seed, device, log, callbacks=None):
    """One PRM fine-tuned from ``out/backbone`` on ``out/train_counts.jsonl`` through
    ``betaprm.train``; returns ``(prm, log_history)``."""
    from .train import TrainConfig, train

    t0 = time.perf_counter()
    tc = TrainConfig(model=str(out / "backbone"), data=str(out / "train_counts.jsonl"), output_dir=str(out / name), objective=objective,
                     learning_rate=eff.prm_lr, global_batch_size=eff.prm_batch, per_device_batch_size=eff.prm_batch, max_steps=eff.prm_steps,
                     logging_steps=max(1, eff.prm_steps // 40), save_steps=10**9, save_total_limit=1, max_length=512, use_cpu=device == "cpu", precision="fp32",
                     seed=seed, aux_lm_weight=eff.aux_lm_weight, marker_repeat=eff.marker_repeat, head_lr_multiplier=eff.head_lr_multiplier,
                     kappa_detach=eff.kappa_detach and objective == "beta-binomial", group_by_length=eff.group_by_length,
                     overwrite_output_dir=True)  # the demo rewrites everything under --out
    prm, trainer, _ = train(tc, log=lambda *a: None, quiet=True, callbacks=callbacks)
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    log(f"{name} ({objective}): {eff.prm_steps} steps, final loss {last['loss']:.3f}, kappa mean {last['kappa_mean']:.2f} ({time.perf_counter() - t0:.0f}s)")
    return prm.eval(), trainer.state.log_history


PRM_JOBS = (("standard_prm", "soft-ce"), ("betaprm", "beta-binomial"))


def _train_and_score(eff, out, name, objective, seed, device, traces, log):
    """``_train_prm``, then the PRM's scores of ``traces`` (``(question, steps)`` pairs):
    ``(prm, log_history, scores, seconds spent scoring)``."""
    from .scoring import score_traces

    prm, history = _train_prm(eff, out, name, objective, seed, device, log)
    t0 = time.perf_counter()
    scores = score_traces(prm, traces, batch_size=64)
    return prm, history, scores, time.perf_counter() - t0


def _train_and_score_job(eff, out, name, objective, seed, device, traces, threads):
    """``_train_and_score`` in a worker process with ``threads`` torch threads; the PRM
    itself stays in ``out/name`` (not sent back): ``(log line, log_history, scores, seconds)``."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    lines = []
    _, history, scores, seconds = _train_and_score(eff, Path(out), name, objective, seed, device, traces, lines.append)
    return lines[-1], history, scores, seconds


def _train_prms(eff, out, seed, device, log, traces):
    """Both PRMs, same budget and seed, each scoring ``traces``: ``({name: prm}, {name:
    log_history}, {name: scores})``. With ``parallel_prms`` the two train and score at the
    same time in two processes: on CPU with half the threads each (a model this small keeps
    one thread busier than two: faster on 2 cores, README), on a GPU sharing it (its small
    kernels leave it mostly idle)."""
    import torch

    threads = torch.get_num_threads()
    models, histories, scores = {}, {}, {}
    if not (eff.parallel_prms and (device == "cuda" or threads >= 2)):
        seconds = 0.0
        for name, objective in PRM_JOBS:
            models[name], histories[name], scores[name], sec = _train_and_score(eff, out, name, objective, seed, device, traces, log)
            seconds += sec
        log(f"scored {2 * len(traces)} candidates ({seconds:.0f}s)")
        return models, histories, scores

    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    from .model import BetaPRM

    t0 = time.perf_counter()
    split = [max(1, (threads + 1) // 2), max(1, threads // 2)]  # an odd thread count: one more for the first
    with ProcessPoolExecutor(len(PRM_JOBS), mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = [ex.submit(_train_and_score_job, eff, str(out), name, objective, seed, device, traces, n) for (name, objective), n in zip(PRM_JOBS, split)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for (name, _), f in zip(PRM_JOBS, futures):
            if f.done() and f.exception() is not None:
                # Do not wait for the other PRM's training (an hour with --long) to see this.
                for proc in list((getattr(ex, "_processes", None) or {}).values()):
                    proc.terminate()
                raise RuntimeError(f"training the {name} PRM failed in its worker process ({type(f.exception()).__name__}: {f.exception()}); "
                                   "--no-parallel-prms trains in this process, with the full traceback") from f.exception()
        done = [f.result() for f in futures]
    for (name, _), (line, history, sc, _) in zip(PRM_JOBS, done):
        log(line)
        models[name], histories[name], scores[name] = BetaPRM.from_pretrained(out / name, device=device).eval(), history, sc
    each = "on one GPU" if device == "cuda" else f"{split[0]}{'' if split[0] == split[1] else ' and ' + str(split[1])} thread{'s' * (split[0] > 1)} each"
    log(f"scored {2 * len(traces)} candidates ({max(d[3] for d in done):.0f}s; the two PRMs trained and scored at the same time, {each}: {time.perf_counter() - t0:.0f}s in all)")
    return models, histories, scores


# ---------------------------------------------------------------------------- evaluation
def _bon(pools, beta_scores, std_scores, tuned, n=None):
    """Per-problem hits (0/1) of every selector on pools cut to their first n candidates."""
    from .selection import candidate_scores, majority_vote, select, weighted_vote

    out = {k: [] for k in ("single_pass", "majority_vote", "standard_prm_mean", "betaprm_mean", "betaprm_rb", "betaprm_lin",
                           "standard_prm_vote", "betaprm_vote", "betaprm_reliability_vote", "bayes_top1", "bayes_vote", "oracle")}
    for pool, bs, ss in zip(pools, beta_scores, std_scores):
        k = n or len(pool.traces)
        ans, cor, bs, ss = pool.answers[:k], pool.correct[:k], bs[:k], ss[:k]
        bayes_final = np.array([b[0][-1] for b in pool.bayes[:k]])

        def hit(i, cor=cor):
            return float(i is not None and cor[i])

        out["single_pass"].append(hit(0))
        out["majority_vote"].append(hit(majority_vote(ans)))
        out["standard_prm_mean"].append(hit(select(ss, "mean")))
        out["betaprm_mean"].append(hit(select(bs, "mean")))
        out["betaprm_rb"].append(hit(select(bs, "rb", tuned["rb"].lam, tuned["rb"].tau)))
        out["betaprm_lin"].append(hit(select(bs, "lin", tuned["lin"].lam)))
        out["standard_prm_vote"].append(hit(weighted_vote(ans, candidate_scores(ss, "mean"))))
        out["betaprm_vote"].append(hit(weighted_vote(ans, candidate_scores(bs, "mean"))))
        rel = np.clip(candidate_scores(bs, "lin", tuned["rel_vote_lam"]), 0, None)
        out["betaprm_reliability_vote"].append(hit(weighted_vote(ans, rel)))
        out["bayes_top1"].append(hit(int(np.argmax(bayes_final))))
        out["bayes_vote"].append(hit(weighted_vote(ans, bayes_final)))
        out["oracle"].append(float(cor.any()))
    return {k: np.array(v) for k, v in out.items()}


def _tune(val_pools, val_beta):
    from .selection import PAPER_LAMBDAS, candidate_scores, tune, weighted_vote

    correct = [p.correct for p in val_pools]
    tuned = {"rb": tune(val_beta, correct, "rb"), "lin": tune(val_beta, correct, "lin")}
    best = None
    for lam in (0.0,) + PAPER_LAMBDAS:
        acc = np.mean([bool(i is not None and p.correct[i]) for p, bs in zip(val_pools, val_beta)
                       for i in [weighted_vote(p.answers, np.clip(candidate_scores(bs, "lin", lam), 0, None))]])
        if best is None or acc > best[1]:
            best = (lam, acc)
    tuned["rel_vote_lam"] = best[0]
    return tuned


def _calibration(pools, scores, held_records, held_scores, beta: bool):
    from scipy.stats import beta as beta_dist
    from scipy.stats import binom

    from .beta import beta_binomial_nll
    from .evaluation.metrics import spearman

    mu = np.concatenate([s.mu for sc in scores for s in sc])
    kappa = np.concatenate([s.kappa for sc in scores for s in sc])
    sigma = np.concatenate([s.sigma for sc in scores for s in sc])
    q = np.concatenate([qq for p in pools for qq in p.q_true])
    bm = np.concatenate([b[0] for p in pools for b in p.bayes])
    bv = np.concatenate([b[1] for p in pools for b in p.bayes])
    blo = np.concatenate([b[2] for p in pools for b in p.bayes])
    bhi = np.concatenate([b[3] for p in pools for b in p.bayes])
    k = np.concatenate([r["mc_correct"] for r in held_records]).astype(float)
    n = np.concatenate([[r["mc_total"]] * len(r["steps"]) for r in held_records]).astype(float)
    hmu = np.concatenate([s.mu for s in held_scores])
    hkappa = np.concatenate([s.kappa for s in held_scores])
    res = {"mu_mae_bayes": float(np.abs(mu - bm).mean()), "mu_mae_true": float(np.abs(mu - q).mean())}
    if pools[0].parity:  # against the best belief of an observer whose step check sees only parity
        pm = np.concatenate([m[0] for p in pools for m in p.parity])
        pv = np.concatenate([m[1] for p in pools for m in p.parity])
        res["mu_mae_parity_check"] = float(np.abs(mu - pm).mean())
    if beta:
        import torch

        res["bb_nll"] = float(beta_binomial_nll(torch.tensor(hmu, dtype=torch.float64), torch.tensor(hkappa, dtype=torch.float64), torch.tensor(k), torch.tensor(n)).mean())
        unsettled = bv > 1e-12  # settled: the Bayes belief is certain, kappa* infinite
        kappa_star = np.where(unsettled, bm * (1 - bm) / np.maximum(bv, 1e-12) - 1, 1e6)
        res["spearman_kappa_bayes"] = spearman(kappa, kappa_star)
        # Settled steps have counts all 0 or all N, which favour a *small* kappa unless mu is
        # exactly 0 or 1: the same rank correlation without them, and their share (README, "--long").
        res["spearman_kappa_bayes_unsettled"] = spearman(kappa[unsettled], kappa_star[unsettled])
        res["share_settled"] = float(1 - unsettled.mean())
        res["spearman_sigma_bayes_std"] = spearman(sigma, np.sqrt(bv))
        if pools[0].parity:
            res["spearman_kappa_parity_check"] = spearman(kappa, np.where(pv > 1e-12, pm * (1 - pm) / np.maximum(pv, 1e-12) - 1, 1e6))
        # kappa is fitted to how far the counts fall from this model's own mu, so it should
        # track the model's own error, which includes its bias against the Bayes mean.
        res["spearman_sigma_own_error"] = spearman(sigma, np.abs(mu - q))
        a, b = mu * kappa + 1e-6, (1 - mu) * kappa + 1e-6
        lo, hi = beta_dist.ppf(0.05, a, b), beta_dist.ppf(0.95, a, b)
        tol = 1e-6  # q is exactly 0 or 1 once the outcome is settled; a Beta puts no mass there
        res["coverage90"] = float(np.mean((q >= lo - tol) & (q <= hi + tol)))
        res["width90"] = float(np.mean(hi - lo))
        res["bayes_coverage90"] = float(np.mean((q >= blo - tol) & (q <= bhi + tol)))
        res["bayes_width90"] = float(np.mean(bhi - blo))
        # The best any Beta can do: the Beta with the Bayes belief's own mean and variance
        # (kappa*; a point at the mean where the belief is certain). The belief over q is
        # discrete, a Beta is not, so a perfect BetaPRM's interval is this one, not Bayes's.
        sa, sb = np.maximum(bm * kappa_star, 1e-6), np.maximum((1 - bm) * kappa_star, 1e-6)
        slo = np.where(unsettled, beta_dist.ppf(0.05, sa, sb), bm)
        shi = np.where(unsettled, beta_dist.ppf(0.95, sa, sb), bm)
        res["bayes_beta_coverage90"] = float(np.mean((q >= slo - tol) & (q <= shi + tol)))
        res["bayes_beta_width90"] = float(np.mean(shi - slo))
        res["kappa_median"] = float(np.median(kappa))
    else:
        # A point estimate claims q = mu exactly: its likelihood of the counts is binomial.
        res["bb_nll"] = float(-binom.logpmf(k, n, np.clip(hmu, 1e-6, 1 - 1e-6)).mean())
    return res, (mu, q, kappa, bm, bv)


def _step_diagnostics(pools, scores):
    """Where a PRM's mu goes wrong, from the truth of each step.

    ``first_error_auroc``: at verifiable steps k >= 1 whose prefix is error-free, the AUROC
    of the drop in logit mu from step k-1 to k for erroneous against correct steps (does the
    step score catch the first error; the Bayes belief catches nearly all).
    ``first_error_auroc_odd`` / ``_even`` (even modulus only): the same, erroneous steps
    split by the parity of their error offset against all correct steps. An odd offset
    changes the parity of the result, an even one keeps it: a PRM that checks only the
    parity (the mod-2 half of arithmetic mod 10) catches the first and misses the second.
    ``clean_bias_by_step``: mean of mu - Bayes mean at step k on error-free prefixes, per k
    (a PRM that checks each step but trusts long traces less than it should drifts down).
    ``scores`` is per pool a list of per-trace mu arrays."""
    from .evaluation.metrics import auroc

    drops, offs, bias = [], [], {}
    for pool, sc in zip(pools, scores):
        for tr, mu, bayes in zip(pool.traces, sc, pool.bayes):
            logit = np.log(np.clip(mu, 1e-6, 1 - 1e-6)) - np.log(np.clip(1 - mu, 1e-6, 1 - 1e-6))
            for k, off, verifiable in clean_prefix_steps(pool.problem, tr.values):
                if verifiable and k >= 1:
                    drops.append(logit[k - 1] - logit[k])
                    offs.append(off)
                if off == 0:
                    bias.setdefault(k + 1, []).append(mu[k] - bayes[0][k])
    out = {"first_error_auroc": auroc(drops, np.array(offs) > 0), "clean_bias_by_step": [float(np.mean(bias[k])) for k in sorted(bias)]}
    # Parity splits arithmetic mod an even modulus only; each kind is reported where it occurred.
    if pools and pools[0].problem.modulus % 2 == 0:
        out.update({f"first_error_auroc_{k}": v for k, v in parity_split_auroc(drops, offs).items()})
    return out


def clean_prefix_steps(problem, values):
    """``(k, offset, verifiable)`` for each step of a trace's written ``values`` up to and
    including its first error (offset != 0); the offset is the written result minus the
    correct result of the step applied to the written value before it."""
    prev = problem.start
    for k in range(problem.T):
        off = (values[k] - problem.apply(k, prev)) % problem.modulus
        yield k, off, problem.ops[k][0] != "?"
        if off:
            return  # the prefix is no longer error-free
        prev = values[k]


def parity_split_auroc(scores, offsets) -> dict:
    """AUROC of ``scores`` (higher = more suspect) for erroneous against correct steps, with
    the erroneous ones split by the parity of their offset: ``{"odd": .., "even": ..}``, each
    only where that kind of error and correct steps both occur."""
    from .evaluation.metrics import auroc

    scores, offs = np.asarray(scores, dtype=float), np.asarray(offsets)
    out = {}
    for name, keep in (("odd", offs % 2 == 1), ("even", (offs % 2 == 0) & (offs > 0))):
        sel = keep | (offs == 0)
        if keep.any() and (offs == 0).any():
            out[name] = auroc(scores[sel], offs[sel] > 0)
    return out


def _table(rows, headers):
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def _aca(world, test_p, test_pools, hits, models, tuned, tokenizer, seed, n_candidates):
    """The paper's tables 4-5 on the test problems: vanilla Best-of-N (the scored test
    pools, S_RB) against ACA and its ablations, each with accuracy, CI and tokens."""
    from .aca import ACAConfig, run_aca, summarize
    from .evaluation.metrics import bootstrap_ci
    from .scoring import PRMScorer
    from .selection import candidate_scores
    from .synth import SynthPolicy, synth_answer, synth_is_correct, synth_tasks

    def count(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    tasks = synth_tasks(test_p)
    rb = dict(final="rb", final_lam=tuned["rb"].lam, final_tau=tuned["rb"].tau, seed=seed)
    # BetaPRM's ACA with S_RB as the final choice (the paper's main table); the standard
    # PRM's variants rank with S_lin of their own sigma (the paper's ablation).
    variants = {
        "aca": ("betaprm", ACAConfig(**rb)),
        "aca_no_early_stop": ("betaprm", ACAConfig(early_stop=False, **rb)),
        "aca_reward_only": ("standard_prm", ACAConfig(uncertainty="none", final="lin", seed=seed)),
        "aca_proxy": ("standard_prm", ACAConfig(uncertainty="proxy", final="lin", seed=seed)),
    }
    pool_tokens = [[sum(count(st) for st in t.steps) for t in p.traces] for p in test_pools]
    vanilla = hits["betaprm_rb"]
    table = {"vanilla_bon": {"acc": float(vanilla.mean()), "ci": list(bootstrap_ci(vanilla, seed=seed)), "tokens": int(sum(map(sum, pool_tokens)))}}
    points = {}
    for name, (model, acfg) in variants.items():
        policy = SynthPolicy(world, seed=seed * 7919 + 21, count_tokens=count)
        recs = run_aca(tasks, policy, PRMScorer(models[model], 64), acfg, synth_answer, synth_is_correct, progress=False)
        hit = np.array([float(r["correct"]) for r in recs])
        summ = summarize(recs)
        tokens = summ["tokens"]
        table[name] = {"acc": summ["acc"], "ci": list(bootstrap_ci(hit, seed=seed)), "tokens": tokens,
                       "token_reduction": 1 - tokens / table["vanilla_bon"]["tokens"], "mean_pool_size": summ["mean_pool_size"],
                       "stop_reasons": summ["stop_reasons"]}
        if name == "aca":  # the same pools, final choice by S_lin (the ablation's shared rule)
            lin = [float(bool(r["candidates"][int(np.argmax(candidate_scores([_scores(c) for c in r["candidates"]], "lin", 0.5)))]["correct"])) for r in recs]
            table["aca_lin"] = {"acc": float(np.mean(lin)), "ci": list(bootstrap_ci(np.array(lin), seed=seed)), "tokens": tokens, "token_reduction": table[name]["token_reduction"]}
        points[name.replace("_", " ")] = (tokens, table[name]["acc"])
    table["bon_curve"] = {"n": list(range(1, n_candidates + 1)), "tokens": [int(sum(sum(t[:n]) for t in pool_tokens)) for n in range(1, n_candidates + 1)]}
    return table, points


def _scores(c):
    from .scoring import StepScores

    return StepScores(c["mu"], c["kappa"], c["sigma"])


def run_demo(cfg: DemoConfig, log=print) -> dict:
    """Run the demo (module docstring) and return its results (also in ``OUT/results.json``).
    With ``parallel_prms`` (the default) the PRMs train in spawned worker processes, so a
    script that calls this must do so under ``if __name__ == "__main__":``."""
    import torch

    from .evaluation import plots
    from .evaluation.metrics import bootstrap_ci, paired_bootstrap, within_problem_auroc
    from .model import _version
    from .scoring import score_traces
    from .synth import World, WorldConfig

    t_start = time.perf_counter()
    eff = cfg.effective()
    device = cfg.torch_device()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    world_cfg = WorldConfig.from_json(cfg.world_config) if cfg.world_config else WorldConfig()
    world = World(world_cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    log(f"betaprm {_version()} demo ({'quick' if cfg.quick else 'long' if cfg.long else 'default'} run, seed {cfg.seed}, {device}) -> {out}")

    # 1. data
    t0 = time.perf_counter()
    train_traces, train_records, val_pools, test_pools, held_records = demo_data(world, eff, cfg.seed)
    test_p = [p.problem for p in test_pools]
    with open(out / "train_counts.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in train_records)
    n_steps = sum(len(r["steps"]) for r in train_records)
    log(f"data: {len(train_records)} training traces ({n_steps} labelled steps, K of {world_cfg.mc_n}), "
        f"{len(val_pools)} validation and {len(test_pools)} test pools of {eff.n_candidates} ({time.perf_counter() - t0:.0f}s)")

    # 2. tokenizer and pretrained backbone
    backbone, tokenizer, eff = _backbone(cfg, eff, world, train_traces, out, log, device)

    # 3. the two PRMs, same budget and seed, and 4. their scores of the validation and test pools
    pooled = val_pools + test_pools
    models, histories, flat = _train_prms(eff, out, cfg.seed, device, log, [(p.problem.question, t.steps) for p in pooled for t in p.traces])
    k, nv = eff.n_candidates, len(val_pools)
    sc = {name: {"val": [f[i * k : (i + 1) * k] for i in range(nv)], "test": [f[i * k : (i + 1) * k] for i in range(nv, len(pooled))]} for name, f in flat.items()}
    held = {name: score_traces(m, [(r["question"], r["steps"]) for r in held_records], batch_size=64) for name, m in models.items()}

    # 5. evaluation: tune on validation, report on test
    tuned = _tune(val_pools, sc["betaprm"]["val"])
    hits = _bon(test_pools, sc["betaprm"]["test"], sc["standard_prm"]["test"], tuned)
    bon = {k: {"acc": float(v.mean()), "ci": list(bootstrap_ci(v, seed=cfg.seed))} for k, v in hits.items()}
    beta_sel = ("betaprm_mean", "betaprm_rb", "betaprm_lin", "betaprm_vote", "betaprm_reliability_vote")
    # "The best BetaPRM selector" is chosen on validation, never on test.
    val_hits = _bon(val_pools, sc["betaprm"]["val"], sc["standard_prm"]["val"], tuned)
    best_beta = max(beta_sel, key=lambda k: val_hits[k].mean())
    comparisons = {
        "betaprm_rb_minus_standard_prm_mean": paired_bootstrap(hits["betaprm_rb"], hits["standard_prm_mean"], seed=cfg.seed),
        "best_betaprm_minus_majority_vote": {"selector": best_beta, **paired_bootstrap(hits[best_beta], hits["majority_vote"], seed=cfg.seed)},
    }
    curves = {}
    for n in range(1, eff.n_candidates + 1):
        h = _bon(test_pools, sc["betaprm"]["test"], sc["standard_prm"]["test"], tuned, n=n)
        for k, v in h.items():
            curves.setdefault(k, []).append(float(v.mean()))
    labels = [p.correct for p in test_pools]
    verification = {
        f"{name}_auroc": within_problem_auroc([[s.mu[-1] for s in pool] for pool in sc[name]["test"]], labels) for name in models
    }
    verification["bayes_auroc"] = within_problem_auroc([[b[0][-1] for b in p.bayes] for p in test_pools], labels)
    steps = {name: _step_diagnostics(test_pools, [[s.mu for s in pool] for pool in sc[name]["test"]]) for name in models}
    steps["bayes"] = _step_diagnostics(test_pools, [[b[0] for b in p.bayes] for p in test_pools])
    if test_pools[0].parity:
        steps["parity_check"] = _step_diagnostics(test_pools, [[m[0] for m in p.parity] for p in test_pools])
    for name, d in steps.items():
        for k, v in d.items():
            if k.startswith("first_error_auroc"):
                verification[f"{name}_{k}"] = v
    if test_pools[0].parity:
        # The ceiling of a parity-only step check: the best belief of an observer who sees
        # each verifiable step's error only modulo 2 (README, "Where mu goes wrong").
        verification["parity_check_auroc"] = within_problem_auroc([[m[0][-1] for m in p.parity] for p in test_pools], labels)
        verification["parity_check_mu_mae_bayes"] = float(np.abs(np.concatenate([m[0] for p in test_pools for m in p.parity])
                                                                - np.concatenate([b[0] for p in test_pools for b in p.bayes])).mean())
    calibration, arrays = {}, {}
    for name in models:
        calibration[name], arrays[name] = _calibration(test_pools, sc[name]["test"], held_records, held[name], beta=name == "betaprm")

    results = {
        "config": asdict(cfg), "effective_config": asdict(eff), "world": world_cfg.to_dict(), "seed": cfg.seed, "version": _version(),
        "bon": bon, "comparisons": comparisons, "best_of_n_curve": {"n": list(range(1, eff.n_candidates + 1)), **curves},
        "tuned": {"rb": {"lambda": tuned["rb"].lam, "q": tuned["rb"].q, "tau": tuned["rb"].tau, "val_acc": tuned["rb"].val_accuracy},
                  "lin": {"lambda": tuned["lin"].lam, "val_acc": tuned["lin"].val_accuracy}, "reliability_vote_lambda": tuned["rel_vote_lam"]},
        "verification": verification, "calibration": calibration,
        "clean_bias_by_step": {name: d["clean_bias_by_step"] for name, d in steps.items() if name in models},
    }
    if eff.aca:
        t0 = time.perf_counter()
        results["aca"], aca_points = _aca(world, test_p, test_pools, hits, models, tuned, tokenizer, cfg.seed, eff.n_candidates)
        log(f"ACA: 4 variants on {len(test_p)} test problems ({time.perf_counter() - t0:.0f}s)")
    results["seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")

    # plots
    plots.kappa_dynamics(histories["betaprm"], out / "kappa_dynamics.png", "BetaPRM kappa during training")
    plots.reliability_diagram({"standard PRM": (arrays["standard_prm"][0], arrays["standard_prm"][1]), "BetaPRM": (arrays["betaprm"][0], arrays["betaprm"][1]),
                               "Bayes belief": (arrays["betaprm"][3], arrays["betaprm"][1])}, out / "reliability.png")
    bm, bv = arrays["betaprm"][3], arrays["betaprm"][4]
    plots.kappa_vs_bayes(arrays["betaprm"][2], np.where(bv > 1e-12, bm * (1 - bm) / np.maximum(bv, 1e-12) - 1, 1e3), out / "kappa_vs_bayes.png")
    ns = list(range(1, eff.n_candidates + 1))
    plots.best_of_n_curves({k: (ns, curves[k]) for k in ("majority_vote", "standard_prm_mean", "betaprm_rb", "betaprm_vote", "bayes_vote", "oracle")}, out / "best_of_n.png")
    if eff.aca:
        plots.best_of_n_curves({"Best-of-n, BetaPRM S_RB": (results["aca"]["bon_curve"]["tokens"], curves["betaprm_rb"])}, out / "aca_tokens.png",
                               points=aca_points, xlabel="generated tokens (all test problems)")

    log("\n" + format_results(results))
    log(f"\nwrote {out / 'results.json'} and plots (kappa_dynamics, reliability, kappa_vs_bayes, best_of_n{', aca_tokens' if eff.aca else ''} .png) in {results['seconds']:.0f}s")
    return results


NAMES = {
    "single_pass": "single pass", "majority_vote": "majority vote", "standard_prm_mean": "standard PRM, top-1 mean mu",
    "betaprm_mean": "BetaPRM, top-1 mean mu", "betaprm_rb": "BetaPRM, top-1 S_RB", "betaprm_lin": "BetaPRM, top-1 S_lin",
    "standard_prm_vote": "standard PRM, weighted vote", "betaprm_vote": "BetaPRM, weighted vote",
    "betaprm_reliability_vote": "BetaPRM, reliability-weighted vote", "bayes_top1": "Bayes belief, top-1",
    "bayes_vote": "Bayes belief, weighted vote", "oracle": "oracle pass@n",
}


def format_results(r: dict) -> str:
    n = r["effective_config"]["n_candidates"]
    rows = [[NAMES.get(k, k), f"{v['acc']:.3f}", f"[{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"] for k, v in r["bon"].items()]
    parts = [f"Best-of-{n}, {r['effective_config']['n_test_problems']} test problems (95% bootstrap intervals)", _table(rows, ["selector", "accuracy", "95% CI"])]
    c = r["comparisons"]
    a, b = c["betaprm_rb_minus_standard_prm_mean"], c["best_betaprm_minus_majority_vote"]
    parts.append(f"BetaPRM S_RB - standard PRM: {a['diff']:+.3f} [{a['ci'][0]:+.3f}, {a['ci'][1]:+.3f}] (paired bootstrap)")
    parts.append(f"best BetaPRM selector on validation ({NAMES[b['selector']]}) - majority vote: {b['diff']:+.3f} [{b['ci'][0]:+.3f}, {b['ci'][1]:+.3f}]")
    t = r["tuned"]
    parts.append(f"tuned on validation: S_RB lambda {t['rb']['lambda']}, q {t['rb']['q']} (tau {t['rb']['tau']:.3f}); S_lin lambda {t['lin']['lambda']}; reliability vote lambda {t['reliability_vote_lambda']}")
    v = r["verification"]
    parts.append("\nVerification: within-problem AUROC of the final-step mu (0.5 = no verification)")
    split = all(f"{k}_first_error_auroc_{x}" in v for k in ("standard_prm", "betaprm", "bayes") for x in ("odd", "even"))
    names = [("standard PRM", "standard_prm"), ("BetaPRM", "betaprm"), ("Bayes belief", "bayes")]
    if "parity_check_auroc" in v:
        names.append(("parity-check observer", "parity_check"))
    rows = [[m, f"{v[k + '_auroc']:.3f}", f"{v[k + '_first_error_auroc']:.3f}"] + ([f"{v[k + '_first_error_auroc_odd']:.3f}", f"{v[k + '_first_error_auroc_even']:.3f}"] if split else [])
            for m, k in names]
    parts.append(_table(rows, ["model", "AUROC", "first-error AUROC"] + (["odd offset", "even offset"] if split else [])))
    parts.append("first-error AUROC: the drop in logit mu at a verifiable step after an error-free prefix, erroneous vs correct steps;"
                 " odd / even: errors whose offset changes / keeps the parity of the result")
    if "parity_check_auroc" in v:
        parts.append(f"parity-check observer: the best belief given only the parity of each step's error (mu MAE vs Bayes mean {v['parity_check_mu_mae_bayes']:.3f})")
    for name, label in (("standard_prm", "standard PRM"), ("betaprm", "BetaPRM")):
        parts.append(f"mu - Bayes mean on error-free prefixes, steps 1..{len(r['clean_bias_by_step'][name])}, {label}: "
                     + " ".join(f"{x:+.2f}" for x in r["clean_bias_by_step"][name]))
    cs, cb = r["calibration"]["standard_prm"], r["calibration"]["betaprm"]
    parts.append("\nCalibration against the truth (test pools; NLL on held-out MC counts)")
    rows = [
        ["mu MAE vs Bayes mean", f"{cs['mu_mae_bayes']:.3f}", f"{cb['mu_mae_bayes']:.3f}"],
        ["mu MAE vs true q", f"{cs['mu_mae_true']:.3f}", f"{cb['mu_mae_true']:.3f}"],
        ["NLL of counts (standard: binomial at mu)", f"{cs['bb_nll']:.3f}", f"{cb['bb_nll']:.3f}"],
        ["Spearman(kappa, kappa*)", "-", f"{cb['spearman_kappa_bayes']:.3f}"],
        ["same, unsettled steps only (share settled)", "-", f"{cb['spearman_kappa_bayes_unsettled']:.3f} ({cb['share_settled']:.2f})"],
        *([["mu MAE vs parity-check observer's mean", f"{cs['mu_mae_parity_check']:.3f}", f"{cb['mu_mae_parity_check']:.3f}"],
           ["Spearman(kappa, parity-check observer's kappa*)", "-", f"{cb['spearman_kappa_parity_check']:.3f}"]] if "mu_mae_parity_check" in cb else []),
        ["Spearman(sigma, Bayes std)", "-", f"{cb['spearman_sigma_bayes_std']:.3f}"],
        ["Spearman(sigma, |mu - q|), its own error", "-", f"{cb['spearman_sigma_own_error']:.3f}"],
        ["90% interval coverage of q (Bayes)", "-", f"{cb['coverage90']:.3f} ({cb['bayes_coverage90']:.3f})"],
        ["90% interval mean width (Bayes)", "-", f"{cb['width90']:.3f} ({cb['bayes_width90']:.3f})"],
        ["Beta at Bayes mean and kappa*: coverage, width", "-", f"{cb['bayes_beta_coverage90']:.3f}, {cb['bayes_beta_width90']:.3f}"],
    ]
    parts.append(_table(rows, ["metric", "standard PRM", "BetaPRM"]))
    if "aca" in r:
        a = r["aca"]
        names = {"vanilla_bon": f"vanilla Best-of-{n} (BetaPRM S_RB)", "aca": "ACA (BetaPRM, S_RB)", "aca_lin": "ACA (BetaPRM, final S_lin)",
                 "aca_no_early_stop": "ACA w/o early stop (BetaPRM, S_RB)", "aca_reward_only": "ACA reward-only (standard PRM, sigma = 0)",
                 "aca_proxy": "ACA proxy sigma (standard PRM, sqrt(mu(1-mu)))"}
        base = a["vanilla_bon"]["tokens"]
        rows = [[names[k], f"{a[k]['acc']:.3f}", f"[{a[k]['ci'][0]:.3f}, {a[k]['ci'][1]:.3f}]", f"{a[k]['tokens']}",
                 "-" if k == "vanilla_bon" else f"{1 - a[k]['tokens'] / base:+.1%}".replace("+", "-", 1) if a[k]["tokens"] <= base else f"+{a[k]['tokens'] / base - 1:.1%}",
                 "-" if k == "vanilla_bon" else f"{a[k]['mean_pool_size']:.1f}" if "mean_pool_size" in a[k] else ""]
                for k in names if k in a]
        parts.append(f"\nAdaptive Computation Allocation, budget {n}, {r['effective_config']['n_test_problems']} test problems (tokens: generated, all problems)")
        parts.append(_table(rows, ["method", "accuracy", "95% CI", "tokens", "vs vanilla", "mean pool"]))
    return "\n".join(parts)
