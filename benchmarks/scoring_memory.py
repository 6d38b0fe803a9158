"""Scoring memory and speed: token-budget batches against fixed batches, same traces.

    python benchmarks/real_assets.py --out real/          # SmolLM2-135M + 200 CHAMP traces
    python benchmarks/scoring_memory.py --model real/smollm2-135m-instruct \\
        --traces real/champ_fws.jsonl [--max-batch-tokens 16384] [--fixed-batch-size 16]

Each mode scores every trace (VisualProcessBench JSONL: question + response.steps) in
its own process, so peak resident memory (``ru_maxrss``) is the mode's own:

- ``fixed+graph``: batches of ``--fixed-batch-size`` traces sorted by length and padded
  to the longest, the autograd graph kept: what ``betaprm score``/``eval-steps`` did
  before token budgets;
- ``fixed``: the same batches without a graph (inference mode);
- ``tokens``: ``betaprm.scoring`` as it is: batches of at most ``--max-batch-tokens``
  padded tokens, inference mode.

A mode whose resident memory passes ``--mem-limit-gb`` is stopped and reported as such
(the machine is not left to the kernel's OOM killer). Prints one table: load and peak
RSS, traces/s over the scoring alone, and the largest |mu| difference from ``tokens``.
A plain causal LM is wrapped as a zero-shot BetaPRM (Yes/No logits at each marker);
positions past the model's ``max_position_embeddings`` are cut to whole steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, resource, sys, time
import numpy as np, torch
from betaprm import BetaPRM
from betaprm.evaluation.steps import read_visualprocessbench
from betaprm.formatting import encode_traces
from betaprm.model import CONFIG_NAME
from betaprm.batching import length_batches, pad_batch, pad_id, split_by_trace
from betaprm.scoring import fit_traces, score_token_ids
from pathlib import Path

mode, model, traces, budget, fixed, threads, n, out = sys.argv[1:9]
torch.set_num_threads(int(threads))
def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30
prm = BetaPRM.from_pretrained(model) if (Path(model) / CONFIG_NAME).is_file() else BetaPRM.from_backbone(model)
prm.eval()
items = read_visualprocessbench(traces)[: int(n) or None]
ids = encode_traces(
    prm.tokenizer, prm.config.marker_id, [(it.question, it.steps) for it in items], prm.config.trace_format
)
ids, _ = fit_traces(prm, ids, "steps")
load = rss_gb()
t0 = time.perf_counter()
if mode == "tokens":
    res = score_token_ids(prm, ids, max_batch_tokens=int(budget))
else:
    res = [None] * len(ids)
    ctx = torch.inference_mode() if mode == "fixed" else torch.enable_grad()
    with ctx:
        for batch in length_batches([len(t) for t in ids], int(fixed)):
            x, m = pad_batch([ids[i] for i in batch], pad_id(prm.tokenizer))
            o = prm(x, attention_mask=m)
            for i, s in zip(batch, split_by_trace(o, len(batch))):
                res[i] = s
secs = time.perf_counter() - t0
np.save(out, np.concatenate([s.mu for s in res]))
print(json.dumps({"load_gb": load, "seconds": secs, "traces": len(ids), "tokens": sum(map(len, ids)),
                  "attn": prm.backbone.config._attn_implementation}))
"""


def run_mode(mode, args, mu_path):
    """Run one mode in a child process, polling its RSS; returns its result dict."""
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        mode,
        args.model,
        args.traces,
        str(args.max_batch_tokens),
        str(args.fixed_batch_size),
        str(args.threads),
        str(args.n),
        mu_path,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limit_kb = args.mem_limit_gb * 2**20
    stopped = False
    # os.wait4 (not proc.poll) reaps the child, so its peak RSS can be read.
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            rss_kb = 0
        if rss_kb > limit_kb and not stopped:
            proc.kill()
            stopped = True
        time.sleep(0.1)
    out, err = proc.stdout.read(), proc.stderr.read()
    res = {"mode": mode, "peak_gb": usage.ru_maxrss / 2**20}
    if stopped:
        res["stopped"] = f"over {args.mem_limit_gb} GB"
    elif os.waitstatus_to_exitcode(status) != 0:
        res["stopped"] = (
            f"exit {os.waitstatus_to_exitcode(status)}: {err.strip().splitlines()[-1] if err.strip() else ''}"
        )
    else:
        res.update(json.loads(out.strip().splitlines()[-1]))
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", required=True, help="BetaPRM or plain causal-LM directory")
    ap.add_argument("--traces", required=True, help="VisualProcessBench JSONL")
    ap.add_argument("--n", type=int, default=0, help="first N traces only (0: all)")
    ap.add_argument("--max-batch-tokens", type=int, default=16384)
    ap.add_argument("--fixed-batch-size", type=int, default=16)
    ap.add_argument("--modes", default="tokens,fixed,fixed+graph")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mem-limit-gb", type=float, default=20.0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    import numpy as np

    tmp = tempfile.mkdtemp()
    results = []
    for mode in args.modes.split(","):
        print(f"running {mode} ...", file=sys.stderr, flush=True)
        results.append(run_mode(mode, args, os.path.join(tmp, f"{mode}.npy")))
    ref = os.path.join(tmp, "tokens.npy")
    print("| mode | load RSS GB | peak RSS GB | traces/s | max abs mu diff vs tokens |")
    print("|---|---|---|---|---|")
    for r in results:
        if "stopped" in r:
            print(f"| {r['mode']} | - | {r['peak_gb']:.2f} | stopped: {r['stopped']} | - |")
            continue
        mine = os.path.join(tmp, f"{r['mode']}.npy")
        diff = float(np.abs(np.load(mine) - np.load(ref)).max()) if os.path.exists(ref) else float("nan")
        r["max_mu_diff"] = diff
        print(
            f"| {r['mode']} | {r['load_gb']:.2f} | {r['peak_gb']:.2f} | {r['traces'] / r['seconds']:.2f} | "
            f"{diff:.1e} |"
        )
    ok = [r for r in results if "stopped" not in r]
    if ok:
        r = ok[0]
        print(
            f"{r['traces']} traces, {r['tokens']} tokens; attention: {r['attn']}; budget {args.max_batch_tokens} "
            f"tokens, fixed batches of {args.fixed_batch_size}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
