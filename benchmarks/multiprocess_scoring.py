"""`betaprm score` in one process and in several (torchrun), on the same pool file: throughput
of each, and whether the merged output is the single process's.

    python benchmarks/multiprocess_scoring.py --out benchmarks/results/multiprocess_scoring/run.json \\
        [--model DIR] [--pools 96] [--candidates 8] [--nproc 2] [--device cpu | cuda]

Without ``--model`` a small random BetaPRM is built from a config (llama, 256 wide, 4 layers,
a byte-level tokenizer trained on the pools' text; no download): scores are meaningless but
the compute is a real transformer's. The pools are synthetic, of mixed length (1 to 12 steps
of 1 to 40 words), so that dealing them out by line count would not balance the work.

Runs, each a fresh ``betaprm score`` command on the whole file, then on a file of one pool
(the command's fixed cost: start, imports, model load), in this order:

- ``1 process``: torch's default threads (every core);
- ``1 process, 1 thread``: ``OMP_NUM_THREADS=1``, as torchrun gives each of its processes;
- ``N processes``: ``torchrun --nproc_per_node N -m betaprm score`` (one thread each).

Throughput is candidates per second over the wall time less the fixed cost. The N-process
output is compared byte for byte with the one-thread single process's (same forward passes,
same thread count: identical by design) and, in mu and kappa, with the default single
process's (other thread counts may round differently in the last float32 bit).

``--device cuda`` (one GPU per process, ``cuda:LOCAL_RANK``; more processes than GPUs share
them) runs ``1 process`` and ``N processes`` only, and compares the two in mu and kappa.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = "so then we add the two numbers and carry one to get the next digit of the sum".split()


def write_pools(path: Path, n: int, n_cands: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    total = 0
    with open(path, "w") as f:
        for i in range(n):
            cands = []
            for _ in range(n_cands):
                steps = [
                    f"{rng.randint(0, 99)} + {rng.randint(0, 99)} = {rng.randint(0, 198)} "
                    + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
                    for _ in range(rng.randint(1, 12))
                ]
                cands.append({"steps": steps})
            total += len(cands)
            q = f"Problem {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
            f.write(json.dumps({"id": f"p{i}", "question": q, "answer": "7", "candidates": cands}) + "\n")
    return total


def build_model(folder: Path, pools: Path) -> Path:
    from betaprm import BetaPRM
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    texts = [json.loads(line)["question"] for line in open(pools)] + [" ".join(WORDS)] * 20
    tok = train_bytelevel_tokenizer(texts, vocab_size=1000)
    lm = tiny_causal_lm(len(tok), hidden_size=256, num_layers=4, num_heads=4, max_position_embeddings=2048)
    lm.save_pretrained(folder / "lm")
    tok.save_pretrained(folder / "lm")
    BetaPRM.from_backbone(str(folder / "lm")).save_pretrained(folder / "prm")
    return folder / "prm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return wall


def scores(path: Path) -> list[tuple[list[float], list[float]]]:
    return [(c["mu"], c["kappa"]) for line in open(path) for c in json.loads(line)["candidates"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--model", help="a BetaPRM or causal LM folder (default: a small random BetaPRM)")
    ap.add_argument("--pools", type=int, default=96)
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--max-batch-tokens", type=int, default=4096)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        pools = tmp / "pools.jsonl"
        n_cands = write_pools(pools, args.pools, args.candidates)
        one = tmp / "one.jsonl"
        one.write_text(pools.read_text().splitlines(keepends=True)[0])
        model = args.model or str(build_model(tmp, pools))
        base = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}
        base.pop("OMP_NUM_THREADS", None)
        score = ["-m", "betaprm", "score", "--model", model, "--device", args.device]
        score += ["--max-batch-tokens", str(args.max_batch_tokens)]
        runs = {
            "1 process": ([sys.executable], base),
            "1 process, 1 thread": ([sys.executable], {**base, "OMP_NUM_THREADS": "1"}),
            f"{args.nproc} processes": (
                [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc)],
                {**base, "OMP_NUM_THREADS": "1"},
            ),
        }
        if args.device != "cpu":
            runs.pop("1 process, 1 thread")
        results = {}
        for name, (launch, env) in runs.items():
            extra = (
                ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
                if "torch.distributed.run" in launch
                else []
            )
            out = tmp / f"{name.replace(' ', '_').replace(',', '')}.jsonl"
            load = os.getloadavg()[0]  # other work on the machine shows here
            wall = run([*launch, *extra, *score, "--input", str(pools), "--output", str(out)], env)
            if extra:
                extra = ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
            fixed = run(
                [*launch, *extra, *score, "--input", str(one), "--output", str(tmp / f"fixed_{out.name}")], env
            )
            results[name] = {
                "wall_s": round(wall, 2),
                "fixed_s": round(fixed, 2),
                "candidates_per_s": round(n_cands / max(wall - fixed, 1e-9), 1),
                "load_average_at_start": round(load, 2),
                "output": out,
            }
            print(
                f"{name}: {wall:.1f} s ({fixed:.1f} s of it fixed), {results[name]['candidates_per_s']} candidates/s"
            )
        multi = results[f"{args.nproc} processes"]["output"]
        ref = results.get("1 process, 1 thread", results["1 process"])["output"]
        identical = multi.read_bytes() == ref.read_bytes()
        worst = 0.0
        for (mu_a, k_a), (mu_b, k_b) in zip(scores(multi), scores(results["1 process"]["output"])):
            worst = max([worst, *(abs(a - b) for a, b in zip(mu_a + k_a, mu_b + k_b))])
        ids = [json.loads(line)["id"] for line in open(multi)]
        for r in results.values():
            r.pop("output")
    summary = {
        "model": args.model or "random BetaPRM, llama 256 wide x 4 layers",
        "pools": args.pools,
        "candidates": n_cands,
        "max_batch_tokens": args.max_batch_tokens,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "runs": results,
        "merged_in_input_order": ids == [f"p{i}" for i in range(args.pools)],
        "device": args.device,
        # on cpu: against the one-thread single process (same thread count); on cuda: the single process
        "merged_equals_1_process_bytewise": identical,
        "max_abs_diff_mu_kappa_vs_1_process": worst,
        f"speedup_of_{args.nproc}_processes_over": {
            name: round(results[f"{args.nproc} processes"]["candidates_per_s"] / r["candidates_per_s"], 2)
            for name, r in results.items()
            if name != f"{args.nproc} processes"
        },
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
