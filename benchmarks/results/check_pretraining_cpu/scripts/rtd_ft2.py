# ruff: noqa: E402, E501, E731
# The probe script as run for benchmarks/RESULTS.md (entry "the step check learned before the PRMs"), kept as it was.
"""Pretrain the demo backbone as synth.training.pretrain does (same steps, batch, lr, tokens,
problems) but on traces whose verifiable results are replaced with probability P by another
number (uniform offset; the chain continues from the written value), with the LM loss off at
replaced results and a replaced-result-detection head (linear, BCE) at each step's marker."""

import math
import os
import sys
import time

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4] / "src"))
import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from betaprm.data.dataset import first_fit_rows
from betaprm.formatting import TraceFormat, encode_traces
from betaprm.synth import World
from betaprm.synth.recipe import DemoConfig

seed = int(sys.argv[1])
out = sys.argv[2]
P = float(sys.argv[3])
STEPS = int(os.environ.get("STEPS", "1500"))
BB = os.environ.get("BB")
W = float(os.environ.get("RTD_W", "1.0"))
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
tok = PreTrainedTokenizerFast.from_pretrained(os.environ["BB"])
cfg = DemoConfig(seed=seed).effective()
world = World()
M = world.M
marker_id = tok.convert_tokens_to_ids("<prm>")
torch.manual_seed(cfg.seed)
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(BB).train()
head = torch.nn.Linear(cfg.hidden_size, 1)
rng = np.random.default_rng(cfg.seed + 101)


def trace(p):
    vals, flags, v = [], [], p.start
    for s in range(p.T):
        c = int(p.apply(s, v))
        f = 0
        if p.ops[s][0] != "?" and rng.random() < P:
            o = int(rng.integers(1, M))
            c = (c + o) % M
            f = 1 + (o % 2 == 0)
        vals.append(c)
        flags.append(f)
        v = c
    return world.step_texts(p, vals, 0, rng), flags


fmt = TraceFormat(marker="<prm>")
pb = world.sample_problems(50, cfg.seed + 7, "x")
per_trace = np.mean([len(x) for x in encode_traces(tok, marker_id, [(p.question, trace(p)[0]) for p in pb], fmt)])
batch = 32
steps = STEPS
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=float(os.environ.get("LR", "1e-3")), weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: min(1.0, (s + 1) / (0.05 * steps)) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
)
problems = world.sample_problems(steps * batch, cfg.seed + 1000, "pre")
t0 = time.perf_counter()
ZS, KS = [], []
for s in range(steps):
    chunk = problems[s * batch : (s + 1) * batch]
    tr = [trace(p) for p in chunk]
    ids = encode_traces(tok, marker_id, [(p.question, t[0]) for p, t in zip(chunk, tr)], fmt)
    lengths = [len(x) for x in ids]
    cap = max(lengths)
    rows = first_fit_rows(lengths)
    X = torch.full((len(rows), cap), tok.pad_token_id)
    POS = torch.zeros_like(X)
    LAB = torch.full_like(X, -100)
    RTD = torch.full(X.shape, -1.0)
    KIND = torch.zeros(X.shape, dtype=torch.long)
    for r, mem in enumerate(rows):
        at = 0
        for i in mem:
            seq = ids[i]
            n = len(seq)
            flags = tr[i][1]
            X[r, at : at + n] = torch.tensor(seq)
            POS[r, at : at + n] = torch.arange(n)
            lab = torch.tensor(seq)
            lab[0] = -100
            marks = [j for j, t in enumerate(seq) if t == marker_id]
            for k, f in enumerate(flags):  # marks[k] ends op step k; the result token is just before it
                RTD[r, at + marks[k]] = float(f > 0)
                KIND[r, at + marks[k]] = f
                if f:
                    lab[marks[k] - 1] = -100
            LAB[r, at : at + n] = lab
            at += n
        POS[r, at:] = torch.arange(cap - at)
    o = model(input_ids=X, position_ids=POS, labels=LAB, output_hidden_states=True)
    h = o.hidden_states[-1]  # pre-norm last layer; use the final norm as the LM head does

    sel = RTD >= 0
    rl = torch.nn.functional.binary_cross_entropy_with_logits(head(h[sel]).squeeze(-1), RTD[sel])
    loss = o.loss + W * rl
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    ZS.append(head(h[sel]).squeeze(-1).detach())
    KS.append(KIND[sel])
    if (s + 1) % 100 == 0 or s + 1 == steps:
        from scipy.stats import mannwhitneyu

        roc_auc_score = lambda y, z: mannwhitneyu(z[y], z[~y]).statistic / (y.sum() * (~y).sum())
        z = torch.cat(ZS[-50:]).numpy()
        k = torch.cat(KS[-50:]).numpy()
        acc = (roc_auc_score(k[k != 2] == 1, z[k != 2]), roc_auc_score(k[k != 1] == 2, z[k != 1]))
        print(
            f"step {s + 1}/{steps} lm {o.loss.item():.3f} rtd {rl.item():.3f} AUROC odd/even (last 50 batches, training data) {acc[0]:.3f}/{acc[1]:.3f} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
model.eval().save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
