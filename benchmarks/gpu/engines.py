"""``betaprm train`` on one GPU under each accelerate engine (plain, FSDP2, DeepSpeed ZeRO-3
with the shipped configs), with a resume from the half-way checkpoint.

    python benchmarks/gpu/engines.py OUT [--engines plain,fsdp,zero3] [--steps 20]

For each engine: 1) train STEPS steps (bf16) from a 4x256 Llama on chain-arithmetic count
records and score 48 records with the model in memory; 2) a second run resumes from the
first run's step STEPS/2 checkpoint with ``accelerate launch ... -m betaprm train
--resume-from-checkpoint last``; 3) every saved model is loaded on the CPU (fp32) and
scores the same records. OUT/engines.json: the comparisons (in-memory vs saved, resumed vs
uninterrupted, each engine vs plain, trained vs untrained), times and errors.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from common import compare, read_jsonl, score_records, write_json  # noqa: E402

CONFIGS = {"fsdp": ROOT / "configs/accelerate/fsdp.yaml", "zero3": ROOT / "configs/accelerate/deepspeed_zero3.yaml"}


def build_inputs(out: Path):
    from betaprm.cli import main
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    counts = out / "counts.jsonl"
    if not counts.exists():
        assert (
            main(
                [
                    "label",
                    "--backend",
                    "synth",
                    "--n-problems",
                    "200",
                    "--traces-per-problem",
                    "4",
                    "--out",
                    str(counts),
                    "--seed",
                    "0",
                ]
            )
            == 0
        )
    lm = out / "lm"
    if not lm.exists():
        recs = read_jsonl(counts)
        tok = train_bytelevel_tokenizer([r["question"] + " " + " ".join(r["steps"]) for r in recs], vocab_size=512)
        model = tiny_causal_lm(len(tok), hidden_size=256, num_layers=4, num_heads=4, max_position_embeddings=1024)
        model.save_pretrained(lm)
        tok.save_pretrained(lm)
    return counts, lm


def one_gpu_config(engine: str, out: Path) -> Path:
    cfg = yaml.safe_load(CONFIGS[engine].read_text())
    cfg["num_processes"] = 1
    path = out / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(cmd, log: Path, env=None):
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=300).returncode
    return rc, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--engines", default="plain,fsdp,zero3")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--precision", default="bf16", help="bf16 (the configs' mixed precision) or fp32 (for a CPU dry run)"
    )
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    counts, lm = build_inputs(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    half = a.steps // 2
    common = dict(
        model=str(lm),
        data=str(counts),
        max_steps=a.steps,
        save_steps=half,
        global_batch_size=16,
        per_device_train_batch_size=8,
        learning_rate=1e-4,
        logging_steps=5,
        precision=a.precision,
        seed=0,
        max_length=512,
    )
    flags = [
        "--model",
        str(lm),
        "--data",
        str(counts),
        "--max-steps",
        str(a.steps),
        "--save-steps",
        str(half),
        "--global-batch-size",
        "16",
        "--per-device-train-batch-size",
        "8",
        "--learning-rate",
        "1e-4",
        "--logging-steps",
        "5",
        "--precision",
        a.precision,
        "--seed",
        "0",
        "--max-length",
        "512",
    ]
    report = {"steps": a.steps, "engines": {}}
    for engine in a.engines.split(","):
        r = report["engines"][engine] = {}
        full, resumed = out / f"run_{engine}", out / f"run_{engine}_resumed"
        for d in (full, resumed):
            shutil.rmtree(d, ignore_errors=True)
        kw = out / f"{engine}_kwargs.json"
        kw.write_text(json.dumps({**common, "output_dir": str(full)}))
        launch = (
            [sys.executable]
            if engine == "plain"
            else [
                sys.executable,
                "-m",
                "accelerate.commands.launch",
                "--config_file",
                str(one_gpu_config(engine, out)),
            ]
        )
        rc, secs = run(
            launch + [str(HERE / "train_score.py"), str(kw), str(counts), str(out / f"{engine}_in_memory.json")],
            out / f"{engine}_train.log",
            env,
        )
        r.update(train_rc=rc, train_wall_seconds=round(secs, 1))
        if rc != 0:
            continue
        # The resumed run starts from a copy of the half-way checkpoint, through the CLI.
        shutil.copytree(full / f"checkpoint-{half}", resumed / f"checkpoint-{half}")
        cli = [sys.executable, "-m"] if engine == "plain" else launch + ["-m"]
        rc, secs = run(
            cli + ["betaprm", "train", *flags, "--output-dir", str(resumed), "--resume-from-checkpoint", "last"],
            out / f"{engine}_resume.log",
            env,
        )
        r.update(resume_rc=rc, resume_wall_seconds=round(secs, 1))

    from betaprm import BetaPRM

    records = read_jsonl(counts, 48)
    cpu = {}
    init = score_records(BetaPRM.from_backbone(str(lm)), records)
    for engine, r in report["engines"].items():
        mem = (
            json.loads((out / f"{engine}_in_memory.json").read_text())
            if (out / f"{engine}_in_memory.json").exists()
            else {}
        )
        r.update({k: v for k, v in mem.items() if k != "scores"})
        for name, d in (("full", out / f"run_{engine}"), ("resumed", out / f"run_{engine}_resumed")):
            try:
                cpu[engine, name] = score_records(
                    BetaPRM.from_pretrained(d, device="cpu", dtype=torch.float32), records
                )
            except Exception as e:
                r[f"{name}_load_error"] = f"{type(e).__name__}: {e}"
        if (engine, "full") in cpu:
            r["saved_vs_untrained"] = compare(cpu[engine, "full"], init)
            if "scores" in mem:
                r["saved_on_cpu_vs_in_memory"] = compare(cpu[engine, "full"], mem["scores"])
            if (engine, "resumed") in cpu:
                r["resumed_vs_uninterrupted"] = compare(cpu[engine, "resumed"], cpu[engine, "full"])
            if engine != "plain" and ("plain", "full") in cpu:
                r["vs_plain"] = compare(cpu[engine, "full"], cpu["plain", "full"])
    write_json(out / "engines.json", report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
