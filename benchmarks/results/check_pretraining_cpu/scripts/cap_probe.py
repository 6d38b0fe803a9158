# ruff: noqa: E401, E402, E501, E702, E741, I001
# Check pretraining on chains cut to at most CAP op steps, measured on full-length held-out traces.
# Run: TOK=<a demo backbone dir> WORLD=benchmarks/worlds/W.json [CAP=6] [PRECAP=6] [PRETOKENS=1550000] [STEPS=1000] [THREADS=1] PYTHONPATH=src python cap_probe.py SEED
"""Held-out replaced-result detection AUROC (odd / even offsets, full-length traces of the world,
30% of verifiable results replaced uniformly) during the demo's check pretraining, with the check's
own traces drawn from problems of at most CAP op steps (CAP=0: the world's own lengths)."""

import os, sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from betaprm.evaluation.metrics import auroc
from betaprm.synth import World, WorldConfig
from betaprm.synth.recipe import DemoConfig
from betaprm.synth import training as T
from betaprm.formatting import TraceFormat, encode_traces

seed = int(sys.argv[1])
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
tok = PreTrainedTokenizerFast.from_pretrained(os.environ["TOK"])
cfg = DemoConfig(seed=seed).effective()
pretokens = int(os.environ.get("PRETOKENS", "0"))  # language-model pretraining budget (0: the recipe's)
if pretokens:
    cfg = replace(cfg, pretrain_tokens=pretokens)
wcfg = WorldConfig.from_json(os.environ["WORLD"])
world = World(wcfg)
cap = int(os.environ.get("CAP", "0"))
steps = int(os.environ.get("STEPS", "1000"))
check_world = World(replace(wcfg, min_ops=min(wcfg.min_ops, cap), max_ops=min(wcfg.max_ops, cap))) if cap else world
fmt = TraceFormat(marker="<prm>", marker_repeat=cfg.marker_repeat)
precap = int(os.environ.get("PRECAP", "0"))  # language-model pretraining on chains of at most PRECAP op steps too
pre = Path(
    f"/tmp/cb/pre_{Path(os.environ['WORLD']).stem}_s{seed}"
    + (f"_cap{precap}" if precap else "")
    + (f"_tok{pretokens}" if pretokens else "")
)
if not (pre / "config.json").exists():
    pre_world = (
        World(replace(wcfg, min_ops=min(wcfg.min_ops, precap), max_ops=min(wcfg.max_ops, precap))) if precap else world
    )
    m = T.pretrain(replace(cfg, check_steps=0), pre_world, tok, "<prm>", print)
    m.save_pretrained(pre)
model = AutoModelForCausalLM.from_pretrained(pre).train()
model.config.use_cache = False
marker_id = tok.convert_tokens_to_ids("<prm>")
pad = tok.pad_token_id
erng = np.random.default_rng(999)


def replaced_with_offsets(p, rng, rate):
    values, offs, v = [], [], p.start
    for s in range(p.T):
        c, o = int(p.apply(s, v)), 0
        if p.ops[s][0] != "?" and rng.random() < rate:
            o = int(rng.integers(1, world.M))
            c = (c + o) % world.M
        values.append(c)
        offs.append(o)
        v = c
    return world.step_texts(p, values, 0, rng), offs, p


ev = [replaced_with_offsets(p, erng, 0.3) for p in world.sample_problems(300, 777, "heldout")]


def evaluate():
    model.eval()
    ss, oo, vv = [], [], []
    with torch.no_grad():
        for i in range(0, len(ev), 50):
            chunk = ev[i : i + 50]
            ids = encode_traces(tok, marker_id, [(p.question, t) for t, _, p in chunk], fmt)
            codes = [[o + 100 * (p.ops[s][0] != "?") for s, o in enumerate(offs)] for _, offs, p in chunk]
            x, pos, _, target = T._check_batch(ids, codes, marker_id, pad, fmt.marker_repeat)
            h = model.model(input_ids=x, position_ids=pos).last_hidden_state
            at = target >= 0
            ss += head(h[at]).squeeze(-1).tolist()
            t = target[at].long()
            oo += (t % 100).tolist()
            vv += (t >= 100).tolist()
    model.train()
    ss, offs, verif = np.array(ss), np.array(oo), np.array(vv)
    neg = (offs == 0) & verif
    out = []
    for par in (1, 0):
        pos_ = (offs > 0) & (offs % 2 == par)
        out.append(auroc(ss[neg | pos_], pos_[neg | pos_]))
    return out


torch.manual_seed(cfg.seed + 2)
head = torch.nn.Linear(model.config.hidden_size, 1)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
sched = T._warmup_cosine(opt, steps)
rng = np.random.default_rng(cfg.seed + 2002)
problems = check_world.sample_problems(steps * 32, cfg.seed + 2000, "check")
t0, tt = time.perf_counter(), 0.0
for s in range(steps):
    t1 = time.perf_counter()
    chunk = problems[s * 32 : (s + 1) * 32]
    props = T._lm_proposals(model, check_world, tok, fmt, chunk, rng)
    traces = [T._replaced_trace(check_world, p, rng, T.CHECK_REPLACE_RATE, q) for p, q in zip(chunk, props)]
    ids = encode_traces(tok, marker_id, [(p.question, t) for p, (t, _) in zip(chunk, traces)], fmt)
    x, pos, labels, target = T._check_batch(ids, [f for _, f in traces], marker_id, pad, fmt.marker_repeat)
    hidden = model.model(input_ids=x, position_ids=pos).last_hidden_state
    lm = F.cross_entropy(model.lm_head(hidden)[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    at = target >= 0
    check = F.binary_cross_entropy_with_logits(head(hidden[at]).squeeze(-1), target[at])
    at_r, tr = T._at_results(target, fmt.marker_repeat)
    check_r = F.binary_cross_entropy_with_logits(head(hidden[at_r]).squeeze(-1), tr)
    loss = lm + check + check_r
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    tt += time.perf_counter() - t1
    if (s + 1) % 100 == 0:
        a = evaluate()
        print(
            f"step {s + 1} lm {lm.item():.3f} check {check.item():.3f}/{check_r.item():.3f} held-out AUROC odd/even {a[0]:.3f}/{a[1]:.3f} (train {tt:.0f}s)",
            flush=True,
        )
model.save_pretrained(f"/tmp/cb/cap{cap}_pre{precap}_tok{pretokens}_{Path(os.environ['WORLD']).stem}_s{seed}_{steps}")
