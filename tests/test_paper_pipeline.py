"""The README's "Reproduce the paper on GPUs" commands, run here on tiny models up to the
point where only a GPU is missing: VisualPRM raw annotations -> records -> a
vision-language BetaPRM (CPU instead of accelerate + DeepSpeed/FSDP + bf16) ->
VisualProcessBench evaluation -> scored Best-of-N pools -> eval-bon -> ACA against an
OpenAI-compatible server (here a real local HTTP server with the chain-arithmetic policy
behind it instead of vLLM)."""

import json
import shutil
from pathlib import Path

import numpy as np

from betaprm.cli import main
from betaprm.synth import World
from betaprm.tiny import save_vlm_dir, tiny_vlm

from .synth_server import SynthServer

DATA = Path(__file__).parent / "data"


def _image(path: Path, seed: int):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((36, 48, 3)) * 255).astype("uint8")).save(path)


def test_paper_pipeline_on_tiny_models(tmp_path):
    # 1. raw VisualPRM400K-v1.1 annotations -> betaprm records (counts kept)
    root = tmp_path / "images"
    # The fixture's third record lacks its counts on purpose (a converter test): keep the good two.
    raw = [json.loads(line) for line in (DATA / "visualprm_raw.jsonl").read_text().splitlines()][:2]
    for i, r in enumerate(raw):
        _image(root / r["image"], i)
    big = tmp_path / "raw.jsonl"
    big.write_text("".join(json.dumps(r) + "\n" for _ in range(6) for r in raw))
    counts = tmp_path / "counts.jsonl"
    assert (
        main(
            [
                "convert",
                "--from",
                "visualprm-raw",
                "--input",
                str(big),
                "--output",
                str(counts),
                "--image-root",
                str(root),
            ]
        )
        == 0
    )
    assert main(["validate", str(counts)]) == 0

    # 2. train (the README runs this under accelerate launch with DeepSpeed ZeRO-3 / FSDP in bf16)
    for kind in ("internvl", "qwen2_5_vl"):
        model, proc = tiny_vlm(kind)
        save_vlm_dir(model, proc, tmp_path / kind)
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--model",
                str(tmp_path / "qwen2_5_vl"),
                "--data",
                str(counts),
                "--output-dir",
                str(run),
                "--max-steps",
                "2",
                "--global-batch-size",
                "4",
                "--per-device-train-batch-size",
                "2",
                "--learning-rate",
                "1e-3",
                "--use-cpu",
                "--plots",
                str(tmp_path / "plots"),
            ]
        )
        == 0
    )

    # 3. VisualProcessBench step-level evaluation (trained, and the untrained base row)
    vpb = tmp_path / "vpb" / "test.jsonl"
    _image(vpb.parent / "q.png", 9)
    vpb.write_text(
        "".join(
            json.dumps(
                {
                    "image": "q.png" if i % 2 else None,
                    "question": f"question {i}",
                    "answer": "1",
                    "data_source": ["MathVerse", "DynaMath"][i % 2],
                    "response": {
                        "steps": ["step one", "step two"],
                        "process_correctness": [1, -1 if i % 3 == 0 else 1],
                    },
                }
            )
            + "\n"
            for i in range(24)
        )
    )
    for model_dir in (run, tmp_path / "internvl"):
        assert (
            main(
                [
                    "eval-steps",
                    "--model",
                    str(model_dir),
                    "--data",
                    str(vpb),
                    "--out",
                    str(tmp_path / "vpb.json"),
                    "--plots",
                    str(tmp_path / "plots"),
                ]
            )
            == 0
        )

    # 4. Best-of-N pools with images: score, then every selector
    pools = tmp_path / "pools" / "mathvista.jsonl"
    _image(pools.parent / "p.png", 3)
    pools.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"m{i}",
                    "question": f"What is {i} + 1?",
                    "answer": str(i + 1),
                    "images": ["p.png"],
                    "candidates": [
                        {"steps": [f"{i} + 1 = {i + 1 + d}", f"The answer is \\boxed{{{i + 1 + d}}}"]}
                        for d in (0, 1, 0, 2)
                    ],
                }
            )
            + "\n"
            for i in range(20)
        )
    )
    scored = tmp_path / "pools" / "mathvista.scored.jsonl"
    assert main(["score", "--model", str(run), "--input", str(pools), "--output", str(scored)]) == 0
    assert main(["eval-bon", "--pools", str(scored), "--out", str(tmp_path / "bon.json")]) == 0
    bon = json.loads((tmp_path / "bon.json").read_text())["benchmarks"]["mathvista.scored"]["selectors"]
    assert bon["majority_vote"]["acc"] == 1.0 and bon["oracle"]["acc"] == 1.0

    # 5. ACA against an OpenAI-compatible server (vLLM serve in the README)
    problems = World().sample_problems(8, 21, "s")
    probs = tmp_path / "problems.jsonl"
    probs.write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, "answer": str(p.answer)}) + "\n" for p in problems)
    )
    srv = SynthServer(problems)
    try:
        assert (
            main(
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
                    str(run),
                    "--out",
                    str(tmp_path / "aca.jsonl"),
                    "--concurrency",
                    "4",
                ]
            )
            == 0
        )
    finally:
        srv.close()
    recs = [json.loads(line) for line in (tmp_path / "aca.jsonl").read_text().splitlines()]
    assert len(recs) == 8 and all(r["tokens"] > 0 and 4 <= r["pool_size"] <= 16 for r in recs)
    # The server's policy writes "answer v"; the answers read from its text match the world's.
    by_id = {p.id: p for p in problems}
    assert all(r["correct"] == (int(r["chosen_answer"]) == by_id[r["id"]].answer) for r in recs)
    shutil.rmtree(tmp_path / "images")
