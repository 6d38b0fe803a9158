"""Vision-language backbones: tiny random-init Qwen2.5-VL and InternVL built from configs,
small generated images; marker alignment, batched == one by one, a training run through
`betaprm train` (vision encoder frozen by default), scoring, save/load."""

import json

import numpy as np
import pytest
import torch

from betaprm.model import BetaPRM
from betaprm.scoring import score_traces
from betaprm.tiny import save_vlm_dir, tiny_vlm

KINDS = ["qwen2_5_vl", "internvl"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("img")
    rng = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate([(40, 30), (64, 64), (30, 50)]):
        p = d / f"img{i}.png"
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(p)
        paths.append(str(p))
    return paths


def _traces(images):
    return [
        ("what is 3 + 4 ?", ["3 + 4 = 7", "so the answer is 7"], [images[0]]),
        ("no image here", ["1 + 1 = 2"], []),
        (
            "compare the two pictures",
            ["the first is wider", "the second is square", "answer first"],
            [images[1], images[2]],
        ),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_marker_alignment_and_batching(kind, images):
    model, proc = tiny_vlm(kind)
    prm = BetaPRM.from_backbone(model, processor=proc)
    assert prm.is_vision and prm.config.auto_class == "AutoModelForImageTextToText"
    traces = _traces(images)
    batched = score_traces(prm, traces, batch_size=3)
    assert [len(s.mu) for s in batched] == [2, 1, 3]
    one = [score_traces(prm, [t])[0] for t in traces]
    for a, b in zip(batched, one):
        assert np.abs(a.mu - b.mu).max() < 1e-5 and np.allclose(a.kappa, prm.config.kappa_init)
    # mu is the softmax over the Yes/No columns of the full logits at the marker positions.
    from betaprm.vision import encode_multimodal

    enc = encode_multimodal(prm, traces[:1])
    with torch.no_grad():
        logits = prm.backbone(**enc).logits[0]
    pos = (enc["input_ids"][0] == prm.config.marker_id).nonzero().flatten()
    z = logits[pos][:, list(prm.config.reward_token_ids)]
    assert np.abs(torch.softmax(z, -1)[:, 0].numpy() - batched[0].mu).max() < 1e-5
    # Images change the scores (the vision tower is really used).
    no_img = score_traces(prm, [(traces[0][0], traces[0][1], [])])[0]
    assert np.abs(no_img.mu - batched[0].mu).max() > 1e-6


@pytest.mark.parametrize("kind", KINDS)
def test_train_score_save_load(kind, images, tmp_path):
    from betaprm.cli import main

    model, proc = tiny_vlm(kind)
    lm = tmp_path / "vlm"
    save_vlm_dir(model, proc, lm)
    data = tmp_path / "counts.jsonl"
    rng = np.random.default_rng(1)
    with open(data, "w") as f:
        for i in range(24):
            q, steps, imgs = _traces(images)[i % 3]
            f.write(
                json.dumps(
                    {
                        "id": f"r{i}",
                        "question": q,
                        "steps": steps,
                        "images": imgs,
                        "mc_correct": rng.integers(0, 9, len(steps)).tolist(),
                        "mc_total": 8,
                    }
                )
                + "\n"
            )
    out = tmp_path / "prm"
    rc = main(
        [
            "train",
            "--model",
            str(lm),
            "--data",
            str(data),
            "--output-dir",
            str(out),
            "--max-steps",
            "3",
            "--global-batch-size",
            "4",
            "--per-device-train-batch-size",
            "2",
            "--learning-rate",
            "1e-3",
            "--use-cpu",
            "--save-steps",
            "1000",
            "--logging-steps",
            "1",
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert rc == 0 and (tmp_path / "plots" / "kappa_dynamics.png").stat().st_size > 0
    trained = BetaPRM.from_pretrained(out)
    start = BetaPRM.from_backbone(str(lm))
    changed = {
        n: not torch.equal(p, dict(start.backbone.named_parameters())[n])
        for n, p in trained.backbone.named_parameters()
    }
    vision = [n for n in changed if n.startswith(("model.visual.", "model.vision_tower.")) and "merger" not in n]
    projector = [n for n in changed if "merger" in n or "multi_modal_projector" in n]
    language = [n for n in changed if "language_model" in n and "layers.0." in n]
    assert vision and not any(changed[n] for n in vision), "the vision encoder must stay frozen by default"
    assert any(changed[n] for n in projector) and any(changed[n] for n in language)
    assert not torch.equal(trained.kappa_head.weight, start.kappa_head.weight)
    # Reloaded == in memory, and scoring runs on image records.
    again = BetaPRM.from_pretrained(out)
    a, b = score_traces(trained, _traces(images)), score_traces(again, _traces(images))
    assert all(np.abs(x.mu - y.mu).max() < 1e-6 and np.abs(x.kappa - y.kappa).max() < 1e-5 for x, y in zip(a, b))


def test_train_vision_unfreezes(images, tmp_path):
    from betaprm.cli import main

    model, proc = tiny_vlm("internvl")
    lm = tmp_path / "vlm"
    save_vlm_dir(model, proc, lm)
    data = tmp_path / "c.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "question": "q",
                    "steps": ["a", "b"],
                    "images": [images[0]],
                    "mc_correct": [3, 1],
                    "mc_total": 4,
                }
            )
            + "\n"
            for i in range(8)
        )
    )
    out = tmp_path / "prm"
    assert (
        main(
            [
                "train",
                "--model",
                str(lm),
                "--data",
                str(data),
                "--output-dir",
                str(out),
                "--max-steps",
                "2",
                "--global-batch-size",
                "4",
                "--per-device-train-batch-size",
                "4",
                "--learning-rate",
                "1e-3",
                "--use-cpu",
                "--train-vision",
            ]
        )
        == 0
    )
    trained, start = BetaPRM.from_pretrained(out), BetaPRM.from_backbone(str(lm))
    p0 = dict(start.backbone.named_parameters())
    assert any(
        not torch.equal(p, p0[n])
        for n, p in trained.backbone.named_parameters()
        if n.startswith("model.vision_tower.")
    )


def test_text_model_refuses_image_records(images, tmp_path, capsys):
    from betaprm.cli import main
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    data = tmp_path / "c.jsonl"
    data.write_text(
        json.dumps(
            {"id": "r", "question": "q", "steps": ["a"], "images": [images[0]], "mc_correct": [1], "mc_total": 2}
        )
        + "\n"
    )
    assert (
        main(
            [
                "train",
                "--model",
                str(lm),
                "--data",
                str(data),
                "--output-dir",
                str(tmp_path / "o"),
                "--max-steps",
                "1",
                "--use-cpu",
            ]
        )
        == 2
    )
    assert "need a vision-language backbone" in capsys.readouterr().err


def test_eval_steps_on_a_vision_model_with_images(images, tmp_path):
    """`betaprm eval-steps` zero-shot on an untrained vision-language backbone: records
    with and without images (the "Base (w/o training)" row)."""
    from betaprm.cli import main

    model, proc = tiny_vlm("qwen2_5_vl")
    lm = tmp_path / "vlm"
    save_vlm_dir(model, proc, lm)
    data = tmp_path / "vpb.jsonl"
    rows = [
        {
            "image": images[i % 3] if i % 2 else None,
            "question": f"question {i}",
            "answer": "1",
            "data_source": ["A", "B"][i % 2],
            "response": {"steps": ["look", "count", "answer 1"], "process_correctness": [1, 0, -1 if i % 3 else 1]},
        }
        for i in range(20)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.json"
    assert (
        main(["eval-steps", "--model", str(lm), "--data", str(data), "--out", str(out), "--val-fraction", "0.3"]) == 0
    )
    r = json.loads(out.read_text())
    assert r["model_kind"] == "zero-shot" and r["n_steps"] == 2 * r["n_test_items"]
