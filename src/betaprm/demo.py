"""``betaprm demo``: a small end-to-end run on the bundled counts file.

A byte-level tokenizer and a tiny random-init Llama are built here, wrapped as a
BetaPRM, trained for a few dozen steps with the Beta-Binomial objective, and used to
score held-out traces. It exercises the real model, loss and scorer on CPU in seconds.
(The training loop is deliberately minimal; ``betaprm train`` is the full trainer.)
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from .beta import beta_binomial_nll, evidence_regularizer
from .errors import BetaPRMInputError
from .formatting import encode_traces
from .model import BetaPRM, _version
from .scoring import _pad_id, pad_batch
from .tiny import tiny_causal_lm, train_bytelevel_tokenizer


@dataclass
class DemoConfig:
    out: str = field(default="outputs/demo", metadata={"help": "folder for the trained BetaPRM, scores.jsonl and results.json"})
    data: str | None = field(default=None, metadata={"help": "counts JSONL to train on (default: the bundled sample)"})
    steps: int = field(default=80, metadata={"help": "optimiser steps"})
    batch_size: int = field(default=16, metadata={"help": "traces per step"})
    lr: float = field(default=2e-3, metadata={"help": "backbone learning rate (the kappa head gets 10x); high because the tiny model starts from random weights"})
    lambda_reg: float = field(default=0.05, metadata={"help": "weight of the evidence regulariser"})
    holdout: int = field(default=16, metadata={"help": "records held out for scoring"})
    seed: int = field(default=0, metadata={"help": "random seed"})
    quick: bool = field(default=False, metadata={"help": "a 20-step smoke run"})

    def __post_init__(self):
        problems = [f"{k} must be >= 1, got {getattr(self, k)}" for k in ("steps", "batch_size", "holdout") if getattr(self, k) < 1]
        if not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr}")
        if problems:
            raise BetaPRMInputError("; ".join(problems))


def _load(path: str | None) -> tuple[str, list[dict]]:
    if path is None:
        src = resources.files("betaprm") / "resources" / "sample_counts.jsonl"
        name, text = "bundled sample_counts.jsonl", src.read_text()
    else:
        p = Path(path)
        if not p.is_file():
            raise BetaPRMInputError(f"--data {path}: no such file")
        name, text = path, p.read_text()
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            steps, k, n = r["steps"], r["mc_correct"], r["mc_total"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BetaPRMInputError(f"{name} line {i}: not a counts record ({e}); need question, steps, mc_correct, mc_total") from None
        n = [n] * len(steps) if isinstance(n, int) else n
        if len(k) != len(steps) or len(n) != len(steps) or any(not 0 <= a <= b for a, b in zip(k, n)):
            raise BetaPRMInputError(f"{name} line {i}: field mc_correct/mc_total: need one 0 <= K <= N per step")
        records.append({**r, "mc_total": n})
    if not records:
        raise BetaPRMInputError(f"{name}: no records")
    return name, records


def _batch(prm, records):
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [(r["question"], r["steps"]) for r in records], prm.config.trace_format)
    x, mask = pad_batch(ids, _pad_id(prm.tokenizer))
    k = torch.tensor([v for r in records for v in r["mc_correct"]], dtype=torch.float32)
    n = torch.tensor([v for r in records for v in r["mc_total"]], dtype=torch.float32)
    return x, mask, k, n


def _heldout_nll(prm, records) -> float:
    prm.eval()
    with torch.no_grad():
        x, mask, k, n = _batch(prm, records)
        out = prm(x, attention_mask=mask)
        return beta_binomial_nll(out.mu, out.kappa, k, n).mean().item()


def run_demo(cfg: DemoConfig, log=print) -> dict:
    steps = 20 if cfg.quick else cfg.steps
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    name, records = _load(cfg.data)
    if len(records) <= cfg.holdout:
        raise BetaPRMInputError(f"{name}: {len(records)} records, need more than --holdout {cfg.holdout}")
    train, test = records[: -cfg.holdout], records[-cfg.holdout :]
    log(f"betaprm {_version()} demo: {len(train)} training and {len(test)} held-out traces from {name}")

    texts = [r["question"] + "\n" + " ".join(r["steps"]) for r in train]
    tokenizer = train_bytelevel_tokenizer(texts * 4, vocab_size=320)
    backbone = tiny_causal_lm(len(tokenizer), hidden_size=64, num_layers=2, seed=cfg.seed)
    prm = BetaPRM.from_backbone(backbone, tokenizer)
    n_params = sum(p.numel() for p in prm.parameters())
    log(f"model: random-init Llama, {n_params / 1e6:.2f}M parameters, byte-level BPE vocabulary of {len(tokenizer)}")

    head = list(prm.kappa_head.parameters())
    head_ids = {id(p) for p in head}
    body = [p for p in prm.parameters() if id(p) not in head_ids]
    opt = torch.optim.AdamW([{"params": body, "lr": cfg.lr}, {"params": head, "lr": 10 * cfg.lr, "weight_decay": 0.0}], weight_decay=0.05)
    nll_before = _heldout_nll(prm, test)
    rng = random.Random(cfg.seed)
    t0 = time.perf_counter()
    history = []
    for step in range(1, steps + 1):
        prm.train()
        x, mask, k, n = _batch(prm, rng.sample(train, min(cfg.batch_size, len(train))))
        out = prm(x, attention_mask=mask)
        nll = beta_binomial_nll(out.mu, out.kappa, k, n).mean()
        reg = evidence_regularizer(out.mu, out.kappa, k, n).mean()
        loss = nll + cfg.lambda_reg * reg
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({"step": step, "loss": loss.item(), "nll": nll.item(), "kappa_mean": out.kappa.mean().item()})
        if step % 10 == 0 or step == steps:
            h = history[-1]
            log(f"  step {step:4d}  loss {h['loss']:.3f}  nll {h['nll']:.3f}  kappa mean {h['kappa_mean']:.2f}")
    nll_after = _heldout_nll(prm, test)
    log(f"trained {steps} steps in {time.perf_counter() - t0:.1f}s; held-out Beta-Binomial NLL {nll_before:.3f} -> {nll_after:.3f}")

    out_dir = Path(cfg.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-shard tiny model needs no "Writing shards" bar
    prm.save_pretrained(out_dir / "model")
    scores = [prm.score(r["question"], [r["steps"]])[0] for r in test]
    with open(out_dir / "scores.jsonl", "w") as f:
        for r, s in zip(test, scores):
            f.write(json.dumps({"id": r.get("id"), "question": r["question"], "steps": r["steps"], "mc_correct": r["mc_correct"], "mc_total": r["mc_total"], **s.to_dict()}) + "\n")
    log("\nheld-out scores (K/N is the Monte Carlo label; sigma is the Beta std):")
    for r, s in list(zip(test, scores))[:3]:
        log(f"  {r['question']}")
        for step, kk, nn, m, kap, sig in zip(r["steps"], r["mc_correct"], r["mc_total"], s.mu, s.kappa, s.sigma):
            log(f"    {step:<14} K/N {kk}/{nn}  mu {m:.3f}  kappa {kap:6.2f}  sigma {sig:.3f}")
    result = {
        "config": asdict(cfg),
        "seed": cfg.seed,
        "version": _version(),
        "heldout_nll_before": nll_before,
        "heldout_nll_after": nll_after,
        "history": history,
    }
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    log(f"\nwrote {out_dir / 'model'}, {out_dir / 'scores.jsonl'} and {out_dir / 'results.json'}")
    return result
