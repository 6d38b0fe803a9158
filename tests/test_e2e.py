"""End to end: `betaprm train` on a generated counts file, then reload and score."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from betaprm import BetaPRM

from .helpers import make_counts, make_lm_dir


def test_train_reload_score(tmp_path):
    lm = make_lm_dir(tmp_path / "lm", hidden=48)
    data = make_counts(tmp_path / "counts.jsonl", n=384, seed=3)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "betaprm",
        "train",
        "--model",
        str(lm),
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--learning-rate",
        "2e-3",
        "--global-batch-size",
        "16",
        "--per-device-train-batch-size",
        "8",
        "--max-steps",
        "48",
        "--logging-steps",
        "4",
        "--save-steps",
        "24",
        "--use-cpu",
        "--seed",
        "0",
        "--report-to",
        "tensorboard",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "384 records (" in res.stdout and "saved the BetaPRM" in res.stdout

    summary = json.loads((out / "train_summary.json").read_text())
    losses = [h["loss"] for h in summary["log_history"] if "loss" in h]
    assert len(losses) == 12
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert last < first - 0.1, (first, last)  # the loss falls

    # The kappa head's parameters changed from their initial values.
    init = BetaPRM.from_backbone(str(lm))
    trained = BetaPRM.from_pretrained(out)
    assert not torch.allclose(trained.kappa_head.weight, init.kappa_head.weight)
    assert not torch.allclose(trained.kappa_head.bias, init.kappa_head.bias)

    # The final directory and the step-48 checkpoint hold the same model, and reloading
    # scores exactly as the checkpoint's weights do.
    from betaprm.train import load_state

    ckpt_model = BetaPRM.from_backbone(str(lm))
    load_state(ckpt_model, out / "checkpoint-48" / "model.safetensors")
    cands = [["3 + 4 = 7", "7 + 1 = 8"], ["3 + 4 = 8", "8 + 1 = 9"]]
    a = trained.score("add these", cands)
    b = ckpt_model.score("add these", cands)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.mu, y.mu)
        np.testing.assert_array_equal(x.kappa, y.kappa)

    # TensorBoard got the PRM metrics (report_to passes through to the Trainer).
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(out.rglob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/nll", "train/reg", "train/kappa_mean", "train/kappa_p90", "train/mu_mean"} <= tags
