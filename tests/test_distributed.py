"""Two real processes (torchrun, gloo on CPU) train together and end with identical parameters."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from .helpers import make_counts, make_lm_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_end_with_the_same_parameters(tmp_path):
    lm = make_lm_dir(tmp_path / "lm")
    data = make_counts(tmp_path / "counts.jsonl", n=48)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
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
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r0 = json.loads((out / "rank0.json").read_text())
    r1 = json.loads((out / "rank1.json").read_text())
    assert r0["world_size"] == r1["world_size"] == 2 and r0["grad_accum"] == 2  # 8 = 2 per device x 2 ranks x 2
    assert r0["steps"] == r1["steps"] == 4
    assert r0["digest"] == r1["digest"]
    init_bias = 3.9805  # softplus^-1(4.0 - 1e-3): the head moved away from it
    assert abs(r0["kappa_bias"] - init_bias) > 1e-3
    assert (out / "betaprm_config.json").exists()  # only rank 0 writes the final model
