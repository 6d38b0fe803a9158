"""A tiny Qwen2.5-VL BetaPRM trained 20 steps in bf16 and in fp32 from the same start, on
one GPU; their scores compared.

    python benchmarks/gpu/vlm_bf16.py OUT [--steps 20] [--device cuda]

OUT/vlm_bf16.json: per precision the training time, losses and finiteness; the bf16 run's
scores against the fp32 run's (both scored in fp32 on the CPU), and the bf16 checkpoint
scored on the GPU (bf16 autocast) against the same checkpoint in fp32 on the CPU.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import compare, score_records, write_json  # noqa: E402


def make_records(out: Path, n=64, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        img = out / "images" / f"img{i}.png"
        img.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((rng.random((36, 48, 3)) * 255).astype("uint8")).save(img)
        a, b = int(rng.integers(0, 10)), int(rng.integers(0, 10))
        wrong = bool(rng.random() < 0.4)
        c = a + b + (1 if wrong else 0)
        steps = [f"{a} + {b} = {c}", f"The answer is {c}"]
        k = [int(rng.integers(0, 3)) if wrong else int(rng.integers(5, 9))] * 2
        recs.append(
            {
                "id": f"v{i}",
                "question": f"What is {a} + {b}?",
                "images": [str(img)],
                "steps": steps,
                "mc_correct": k,
                "mc_total": 8,
            }
        )
    path = out / "vlm_counts.jsonl"
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path, recs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda (the check) or cpu (a dry run: fp32 only)")
    a = ap.parse_args()
    import torch

    from betaprm import BetaPRM
    from betaprm.tiny import save_vlm_dir, tiny_vlm
    from betaprm.train import TrainConfig, train

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model, proc = tiny_vlm("qwen2_5_vl", seed=0)
    save_vlm_dir(model, proc, out / "qwen2_5_vl")
    data, recs = make_records(out)
    report = {"steps": a.steps}
    precisions = ["bf16", "fp32"] if a.device == "cuda" else ["fp32"]
    for p in precisions:
        t0 = time.perf_counter()
        prm, trainer, _ = train(
            TrainConfig(
                model=str(out / "qwen2_5_vl"),
                data=str(data),
                output_dir=str(out / f"run_{p}"),
                max_steps=a.steps,
                save_steps=10**6,
                global_batch_size=8,
                per_device_train_batch_size=8,
                learning_rate=1e-3,
                logging_steps=5,
                precision=p,
                seed=0,
                use_cpu=a.device == "cpu",
            ),
            quiet=True,
        )
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        report[p] = {
            "train_seconds": round(time.perf_counter() - t0, 1),
            "trainer_bf16": trainer.args.bf16,
            "device": str(prm.device),
            "backbone_dtype": str(next(prm.backbone.parameters()).dtype),
            "losses": losses,
            "all_finite": bool(np.all(np.isfinite(losses))),
        }
        del prm, trainer
    cpu = {
        p: score_records(BetaPRM.from_pretrained(out / f"run_{p}", device="cpu", dtype=torch.float32), recs[:16])
        for p in precisions
    }
    init = score_records(BetaPRM.from_backbone(str(out / "qwen2_5_vl")), recs[:16])
    for p in precisions:
        report[p]["trained_vs_untrained"] = compare(cpu[p], init)
    if a.device == "cuda":
        report["bf16_trained_vs_fp32_trained"] = compare(cpu["bf16"], cpu["fp32"])
        gpu = score_records(BetaPRM.from_pretrained(out / "run_bf16", device="cuda"), recs[:16])
        report["bf16_checkpoint_gpu_vs_cpu_fp32"] = compare(gpu, cpu["bf16"])
    write_json(out / "vlm_bf16.json", report)
    import json

    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
