# ruff: noqa: E401, E402, E501, E701, E702, E731, E741, F401, I001
# The probe script as run for benchmarks/RESULTS.md (entry "check replacements from the backbone's own language model"), kept as it was.
# Run: TOK=<a demo backbone dir> [WORLD=benchmarks/worlds/W.json TAG=x] PYTHONPATH=src python lm_proposal_probe.py SEED gen STEPS
# Known flaw, found after the run: gen_traces reads the proposals in packed-row order (_check_batch packs
# first-fit decreasing), not trace order, so a step got the LM distribution of another step. The demo's
# _lm_proposals maps them back (tested in tests/test_demo_data.py).
# Variant gen2 (added after): the demo's own _lm_proposals and _replaced_trace, order mapped back.
"""check-phase variants on the demo backbone: held-out replaced-result detection AUROC (odd/even offsets)."""

import os, sys, time
from dataclasses import replace
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
from betaprm.evaluation.metrics import auroc
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from betaprm.synth import World
from betaprm.synth.recipe import DemoConfig
from betaprm.synth import training as T
from betaprm.formatting import TraceFormat, encode_traces

seed = int(sys.argv[1])
variant = sys.argv[2]
steps = int(sys.argv[3])
torch.set_num_threads(int(os.environ.get("THREADS", "2")))
TOKDIR = os.environ["TOK"]
tok = PreTrainedTokenizerFast.from_pretrained(TOKDIR)
cfg = DemoConfig(seed=seed).effective()
from betaprm.synth import WorldConfig

WJ = os.environ.get("WORLD")
world = World(WorldConfig.from_json(WJ) if WJ else None)
TAG = os.environ.get("TAG", "")
fmt = TraceFormat(marker="<prm>", marker_repeat=cfg.marker_repeat)
pre = Path(f"/tmp/cb/pre{TAG}_s{seed}")
if not (pre / "config.json").exists():
    m = T.pretrain(replace(cfg, check_steps=0), world, tok, "<prm>", print)
    m.save_pretrained(pre)
model = AutoModelForCausalLM.from_pretrained(pre).train()
model.config.use_cache = False
marker_id = tok.convert_tokens_to_ids("<prm>")
pad = tok.pad_token_id
# held-out set: replaced traces with offsets recorded
erng = np.random.default_rng(999)
eprobs = world.sample_problems(300, 777, "heldout")


def replaced_with_offsets(p, rng, rate):
    values, flags, offs, v = [], [], [], p.start
    for s in range(p.T):
        c, f, o = int(p.apply(s, v)), False, 0
        if p.ops[s][0] != "?" and rng.random() < rate:
            o = int(rng.integers(1, world.M))
            c, f = (c + o) % world.M, True
        values.append(c)
        flags.append(f)
        offs.append(o)
        v = c
    return world.step_texts(p, values, 0, rng), flags, offs, p


ev = [replaced_with_offsets(p, erng, 0.3) for p in eprobs]


def evaluate():
    model.eval()
    ss, oo, vv = [], [], []
    with torch.no_grad():
        for i in range(0, len(ev), 50):
            chunk = ev[i : i + 50]
            ids = encode_traces(tok, marker_id, [(p.question, t) for t, _, _, p in chunk], fmt)
            # offsets (and verifiable-ness) as targets, so they stay aligned with the packed order
            x, pos, _, target = T._check_batch(
                ids,
                [[o + 100 * (p.ops[s][0] != "?") for s, o in enumerate(offs)] for _, _, offs, p in chunk],
                marker_id,
                pad,
                fmt.marker_repeat,
            )
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
        sel = neg | pos_
        out.append(auroc(ss[sel], pos_[sel]))
    return out


num_ids = torch.tensor([tok.convert_tokens_to_ids(str(v)) for v in range(world.M)])
TEMP = float(os.environ.get("TEMP", "1.0"))


def gen_traces(chunk, rng, rate):
    """ELECTRA's generator: each replaced result drawn from the LM's own prediction at that
    position on the clean trace (the true value excluded), as an offset applied to the chain."""
    clean = [(p, [int(v) for v in p.true_values()]) for p in chunk]
    texts = [world.step_texts(p, vals, 0, rng) for p, vals in clean]
    ids = encode_traces(tok, marker_id, [(p.question, t) for (p, _), t in zip(clean, texts)], fmt)
    flags0 = [[True] * p.T for p in chunk]
    x, pos, _, target = T._check_batch(ids, flags0, marker_id, pad, fmt.marker_repeat)
    with torch.no_grad():
        logits = model(input_ids=x, position_ids=pos).logits
    at = target >= 0  # every step's marker, in trace order
    res = torch.zeros_like(at)
    res[:, : -fmt.marker_repeat - 1] = at[:, fmt.marker_repeat + 1 :]  # the position predicting the result
    lg = logits[res][:, num_ids] / TEMP  # (steps, M), in the same order as the markers
    out, i = [], 0
    for p, vals in clean:
        values, flags, v = [], [], p.start
        for s in range(p.T):
            c, f = int(p.apply(s, v)), False
            if p.ops[s][0] != "?" and rng.random() < rate:
                l = lg[i].clone()
                l[vals[s]] = -float("inf")
                w = torch.softmax(l, -1).double().numpy()
                o = (int(rng.choice(world.M, p=w / w.sum())) - vals[s]) % world.M
                c, f = (c + o) % world.M, True
            values.append(c)
            flags.append(f)
            v = c
            i += 1
        out.append((world.step_texts(p, values, 0, rng), flags))
    assert i == lg.shape[0]
    return out


torch.manual_seed(cfg.seed + 2)
head = torch.nn.Linear(model.config.hidden_size, 1)
params = list(model.parameters()) + list(head.parameters())
lr = float(os.environ.get("LR", "1e-3"))
batch = int(os.environ.get("BATCH", "32"))
rate = float(os.environ.get("RATE", "0.5"))
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
sched = T._warmup_cosine(opt, steps)
rng = np.random.default_rng(cfg.seed + 2002)
problems = world.sample_problems(steps * batch, cfg.seed + 2000, "check")
t0 = time.perf_counter()
for s in range(steps):
    chunk = problems[s * batch : (s + 1) * batch]
    if variant == "gen2":
        props = T._lm_proposals(model, world, tok, fmt, chunk, rng)
        traces = [T._replaced_trace(world, p, rng, rate, q) for p, q in zip(chunk, props)]
    elif variant == "mix":
        props = T._lm_proposals(model, world, tok, fmt, chunk, rng)
        traces = [
            T._replaced_trace(world, p, rng, rate, q if i % 2 else None) for i, (p, q) in enumerate(zip(chunk, props))
        ]
    elif variant == "gen":
        traces = gen_traces(chunk, rng, rate)
    else:
        traces = [T._replaced_trace(world, p, rng, rate) for p in chunk]
    ids = encode_traces(tok, marker_id, [(p.question, t) for p, (t, _) in zip(chunk, traces)], fmt)
    x, pos, labels, target = T._check_batch(ids, [f for _, f in traces], marker_id, pad, fmt.marker_repeat)
    hidden = model.model(input_ids=x, position_ids=pos).last_hidden_state
    logits = model.lm_head(hidden)
    lm = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
    at = target >= 0
    check = F.binary_cross_entropy_with_logits(head(hidden[at]).squeeze(-1), target[at])
    if variant in ("resulttok", "gen", "gen2", "mix"):
        # also at the result token itself (one before the marker)
        rt = torch.zeros_like(at)
        rt[:, :-1] = at[:, 1:]
        tr = torch.full_like(target, -1.0)
        tr[:, :-1] = target[:, 1:]
        check = check + F.binary_cross_entropy_with_logits(head(hidden[rt]).squeeze(-1), tr[rt])
    loss = lm + check
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    if (s + 1) % 100 == 0:
        a = evaluate()
        if variant in ("resulttok", "gen", "gen2", "mix") and (s + 1) == steps:
            model.save_pretrained(f"/tmp/cb/{variant}{TAG}_s{seed}_{steps}")
        print(
            f"step {s + 1} lm {lm.item():.3f} rtd {check.item():.3f} held-out AUROC odd/even {a[0]:.3f}/{a[1]:.3f} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
