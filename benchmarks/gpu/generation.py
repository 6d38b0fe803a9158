"""``betaprm label`` and ``betaprm aca`` with a policy and a PRM on the GPU.

    python benchmarks/gpu/generation.py OUT [--prm DIR] [--device cuda]

1. label: 50 chain-arithmetic traces (as text records) labelled through --backend
   transformers with a random 4x128 Llama policy on the GPU, twice with the same seed
   (the counts and token totals must repeat); a random policy never reaches the answer,
   so this checks the path (batching, token counting, resume files), not the counts.
2. aca: 100 chain-arithmetic problems through --backend openai against a real local HTTP
   server with the chain-arithmetic policy behind it (tests/synth_server.py), the PRM
   scoring on the GPU; ACA and the Best-of-16 baseline.
3. aca through --backend transformers (the random policy on the GPU) on 20 of them.
OUT/generation.json: times, token totals, accuracies and the repeat check.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]
from common import read_jsonl, write_json  # noqa: E402


def cli(args, log):
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(
            [sys.executable, "-m", "betaprm", *args], stdout=f, stderr=subprocess.STDOUT, timeout=300
        ).returncode
    return rc, round(time.perf_counter() - t0, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument(
        "--prm", default="", help="a trained BetaPRM directory (default: an untrained one on the policy's backbone)"
    )
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from betaprm import BetaPRM
    from betaprm.cli import main as betaprm
    from betaprm.synth import World
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    synth = out / "synth.jsonl"
    if not synth.exists():
        assert (
            betaprm(
                [
                    "label",
                    "--backend",
                    "synth",
                    "--n-problems",
                    "25",
                    "--traces-per-problem",
                    "2",
                    "--out",
                    str(synth),
                    "--seed",
                    "1",
                ]
            )
            == 0
        )
    recs = read_jsonl(synth)
    traces = out / "traces.jsonl"
    traces.write_text(
        "".join(
            json.dumps({"id": r["id"], "question": r["question"], "answer": str(r["answer"]), "steps": r["steps"]})
            + "\n"
            for r in recs
        )
    )
    policy = out / "policy"
    if not policy.exists():
        tok = train_bytelevel_tokenizer([r["question"] + " " + " ".join(r["steps"]) for r in recs] * 4, vocab_size=400)
        tiny_causal_lm(
            len(tok), hidden_size=128, num_layers=4, num_heads=4, max_position_embeddings=2048
        ).save_pretrained(policy)
        tok.save_pretrained(policy)
    prm = a.prm
    if not prm:
        prm = str(out / "prm_untrained")
        BetaPRM.from_backbone(str(policy)).save_pretrained(prm)

    gen = [
        "--backend",
        "transformers",
        "--policy",
        str(policy),
        "--max-new-tokens",
        "48",
        "--gen-batch-size",
        "64",
        "--temperature",
        "1.0",
    ]
    runs = []
    for k in (1, 2):
        dest = out / f"labels{k}.jsonl"
        dest.unlink(missing_ok=True)
        rc, secs = cli(
            ["label", *gen, "--input", str(traces), "--out", str(dest), "--n", "4", "--seed", "0"],
            out / f"label{k}.log",
        )
        rows = read_jsonl(dest) if rc == 0 else []
        runs.append(
            {
                "rc": rc,
                "seconds": secs,
                "records": len(rows),
                "counts": [(r["id"], r["mc_correct"], r["mc_total"]) for r in rows],
            }
        )
    report["label"] = {
        "runs": [{k: v for k, v in r.items() if k != "counts"} for r in runs],
        "repeat_equal": runs[0]["counts"] == runs[1]["counts"],
        "log_tail": (out / "label1.log").read_text().strip().splitlines()[-1:],
    }

    from tests.synth_server import SynthServer

    problems = World().sample_problems(100, 7, "g")
    probs = out / "problems.jsonl"
    probs.write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, "answer": str(p.answer)}) + "\n" for p in problems)
    )
    srv = SynthServer(problems)
    try:
        for variant in ("aca", "best-of-n"):
            dest = out / f"aca_{variant}.jsonl"
            dest.unlink(missing_ok=True)
            rc, secs = cli(
                [
                    "aca",
                    "--backend",
                    "openai",
                    "--base-url",
                    srv.url,
                    "--policy",
                    "synth-policy",
                    "--problems",
                    str(probs),
                    "--model",
                    prm,
                    "--device",
                    a.device,
                    "--variant",
                    variant,
                    "--out",
                    str(dest),
                    "--concurrency",
                    "16",
                ],
                out / f"aca_{variant}.log",
            )
            rows = read_jsonl(dest) if rc == 0 else []
            report[f"aca_openai_{variant}"] = {
                "rc": rc,
                "seconds": secs,
                "problems": len(rows),
                "accuracy": sum(r["correct"] for r in rows) / max(1, len(rows)),
                "tokens_per_problem": sum(r["tokens"] for r in rows) / max(1, len(rows)),
            }
    finally:
        srv.close()

    dest = out / "aca_transformers.jsonl"
    dest.unlink(missing_ok=True)
    # A local policy runs ACA one problem at a time (the openai backend runs them concurrently):
    # 20 problems keep this part short.
    probs20 = out / "problems20.jsonl"
    probs20.write_text("".join(probs.read_text().splitlines(keepends=True)[:20]))
    rc, secs = cli(
        ["aca", *gen, "--problems", str(probs20), "--model", prm, "--device", a.device, "--out", str(dest)],
        out / "aca_transformers.log",
    )
    rows = read_jsonl(dest) if rc == 0 else []
    report["aca_transformers"] = {
        "rc": rc,
        "seconds": secs,
        "problems": len(rows),
        "tokens_per_problem": sum(r["tokens"] for r in rows) / max(1, len(rows)),
        "log_tail": (out / "aca_transformers.log").read_text().strip().splitlines()[-2:],
    }
    write_json(out / "generation.json", report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
