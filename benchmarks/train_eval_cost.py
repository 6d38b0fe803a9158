"""What evaluation while training costs: one held-out evaluation of M counts records
(``PRMTrainer.evaluate``: the scoring pass, the metrics, the logging) against scoring the
same records as `betaprm score` does (``scoring.score_traces``: tokenising, batching, the
forward pass), on a tiny random-init Llama.

    python benchmarks/train_eval_cost.py [--records 512] [--hidden 256] [--layers 4] [--repeats 5]

Prints the median seconds of each over ``--repeats`` and their ratio: evaluation / scoring.
A ratio near 1 means the evaluation adds its forward passes and little else (the records are
tokenised once, when training starts, so it can come out below 1). CPU unless a GPU is there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from betaprm.data.records import read_records  # noqa: E402
from betaprm.evaluation.calibration import evaluate_counts, flat_counts  # noqa: E402
from betaprm.scoring import score_token_ids, score_traces  # noqa: E402
from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer  # noqa: E402
from betaprm.train import TrainConfig, train  # noqa: E402

CORPUS = ["add these numbers step by step", "1 + 2 = 3 so 4 + 5 = 9", "the answer is 12 then 7 + 8 = 15"]


def make_counts(path: Path, n: int, seed: int = 0) -> Path:
    import random

    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            steps = [f"{a} + {b} = {a + b}" for a, b in ((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(6))]
            ks = [rng.randint(0, 8) for _ in steps]
            row = {"id": f"r{i}", "question": f"add these {i}", "steps": steps, "mc_correct": ks, "mc_total": 8}
            f.write(json.dumps(row) + "\n")
    return path


def timed(fns: dict, repeats: int) -> dict:
    """Median seconds of each of ``fns``, run in turn ``repeats`` times (interleaved, so a
    busy machine slows them alike), after one warm-up each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = train_bytelevel_tokenizer(CORPUS * 20, vocab_size=400)
        lm = tiny_causal_lm(len(tok), arch="llama", hidden_size=args.hidden, num_layers=args.layers)
        lm.save_pretrained(tmp / "lm")
        tok.save_pretrained(tmp / "lm")
        data = make_counts(tmp / "train.jsonl", 16)
        held = make_counts(tmp / "held.jsonl", args.records, seed=1)
        cfg = TrainConfig(
            model=str(tmp / "lm"),
            data=str(data),
            eval_data=str(held),
            output_dir=str(tmp / "run"),
            global_batch_size=8,
            max_steps=1,
            warmup_ratio=0.0,
            save_steps=1,
            logging_steps=1,
            use_cpu=not torch.cuda.is_available(),
        )
        prm, trainer, _ = train(cfg, quiet=True)
        records = read_records(held).records
        traces = [(r.question, r.steps) for r in records]
        held_ids = trainer.eval_dataset.token_ids
        t = timed(
            {
                "eval": trainer.evaluate,
                "score": lambda: score_traces(prm, traces),
                "forward": lambda: score_token_ids(prm, held_ids),
            },
            args.repeats,
        )
        # The same numbers both ways: the evaluation is that scoring plus the metrics.
        res = evaluate_counts(*flat_counts(records, score_traces(prm, traces)), beta=True)
        nll = trainer.evaluate()["eval_nll"]
        assert abs(nll - res["nll"]["beta_binomial"]) < 1e-4 * max(1.0, abs(nll)), (nll, res["nll"])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    steps = sum(len(r.steps) for r in records)
    print(
        f"{args.records} held-out records ({steps} steps), tiny Llama hidden {args.hidden} x {args.layers} "
        f"layers, {device}"
    )
    print("| | seconds (median of %d) |\n|---|---|" % args.repeats)
    t_eval, t_score, t_forward = t["eval"], t["score"], t["forward"]
    print(f"| evaluation (PRMTrainer.evaluate: scoring pass, metrics, logging) | {t_eval:.3f} |")
    print(f"| scoring the same records (score_traces: tokenising + forward) | {t_score:.3f} |")
    print(f"| the forward passes alone (score_token_ids on the encoded records) | {t_forward:.3f} |")
    print(f"ratio evaluation / scoring: {t_eval / t_score:.2f}; evaluation / forward passes: {t_eval / t_forward:.2f}")


if __name__ == "__main__":
    main()
