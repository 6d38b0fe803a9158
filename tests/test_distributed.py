"""Two real processes (torchrun, gloo on CPU) train together and end with identical parameters."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import make_counts, make_lm_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, *args) -> tuple[dict, dict]:
    """dist_worker.py in two processes; returns each rank's report."""
    lm = make_lm_dir(tmp_path / "lm")
    data = make_counts(tmp_path / "counts.jsonl", n=48)
    out = tmp_path / "run"
    root = str(Path(__file__).parents[1])  # so that the worker imports tests.helpers
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": root}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(Path(__file__).parent / "dist_worker.py"),
        str(lm),
        str(data),
        str(out),
        *map(str, args),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text()), json.loads((out / "rank1.json").read_text())


@pytest.mark.parametrize("tokens", [0, 120])
def test_two_cpu_processes_end_with_the_same_parameters(tmp_path, tokens):
    """Also with a token budget per batch (``tokens``): the ranks train on different batches,
    as many each, and none twice."""
    r0, r1 = _torchrun(tmp_path, tokens)
    out = tmp_path / "run"
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["steps"] == r1["steps"] == 4
    if not tokens:
        assert r0["grad_accum"] == 2  # 8 = 2 per device x 2 ranks x 2
        # Batch rebalance (the default) deals each step's 8 traces out over the 2 ranks x 2
        # micro-batches itself; accelerate must not shard them again (transformers sees to it).
        assert sum(len(b) for r in (r0, r1) for b in r["seen"][: 4 * 2]) == 4 * 8
    else:
        assert len({len(b) for b in r0["seen"] + r1["seen"]}) > 1  # batches of varying size
    # (The data loader reads one batch ahead: a rank may have drawn one it did not train on.)
    assert len(r0["seen"]) == len(r1["seen"]) >= 4 * r0["grad_accum"]
    seen0, seen1 = ([i for b in r["seen"] for i in b] for r in (r0, r1))
    assert sum(map(len, (seen0, seen1))) < 48  # within the first epoch, so:
    assert not set(seen0) & set(seen1) and len(set(seen0)) == len(seen0)  # no record twice
    assert r0["digest"] == r1["digest"]
    init_bias = 3.9805  # softplus^-1(4.0 - 1e-3): the head moved away from it
    assert abs(r0["kappa_bias"] - init_bias) > 1e-3
    assert (out / "betaprm_config.json").exists()  # only rank 0 writes the final model


def test_two_cpu_processes_evaluate_alike_and_keep_the_same_best_checkpoint(tmp_path):
    """Evaluation while training with two processes: every rank scores all of the held-out
    data, so both log the same metrics at the same steps, agree on the best checkpoint and
    end with its weights; only rank 0 writes it."""
    held_out = make_counts(tmp_path / "held_out.jsonl", n=24, seed=7)
    r0, r1 = _torchrun(tmp_path, 0, held_out)
    out = tmp_path / "run"
    assert [e["eval_nll"] for e in r0["evals"]] == [e["eval_nll"] for e in r1["evals"]]
    assert r0["evals"] == r1["evals"] and len(r0["evals"]) == 2  # steps 2 and 4
    assert {"eval_nll", "eval_mae", "eval_ece", "eval_coverage"} <= set(r0["evals"][0])
    best = min(r0["evals"], key=lambda e: e["eval_nll"])
    assert r0["best_metric"] == r1["best_metric"] == best["eval_nll"]
    assert r0["best_checkpoint"] == r1["best_checkpoint"]
    assert Path(r0["best_checkpoint"]).is_dir()
    assert r0["digest"] == r1["digest"]  # the same final (best) weights on both ranks
    summary = json.loads((out / "train_summary.json").read_text())["evaluation"]
    assert summary["final_model_is"] == "best checkpoint"
