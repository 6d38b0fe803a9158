"""Shared builders for training tests: a tiny causal-LM directory and a counts file."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer
from betaprm.train import TrainConfig

from .conftest import CORPUS


def make_lm_dir(path: Path, arch="llama", tie=False, hidden=32, layers=2) -> Path:
    tok = train_bytelevel_tokenizer(CORPUS + ["1 + 2 = 3 so 4 + 5 = 9"] * 20, vocab_size=400)
    model = tiny_causal_lm(len(tok), arch=arch, hidden_size=hidden, num_layers=layers, tie_word_embeddings=tie)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def make_counts(path: Path, n=96, seed=0, n_mc=8) -> Path:
    """Addition steps; a wrong sum makes every later prefix fail (K drawn near 0),
    a right one succeeds with probability 0.85 per remaining step."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            steps, ks, ok = [], [], True
            t = rng.randint(1, 5)
            for j in range(t):
                a, b = rng.randint(0, 9), rng.randint(0, 9)
                c = a + b if rng.random() > 0.25 else a + b + rng.choice([-1, 1])
                ok = ok and c == a + b
                steps.append(f"{a} + {b} = {c}")
                q = 0.85 ** (t - j - 1) if ok else 0.03
                ks.append(sum(rng.random() < q for _ in range(n_mc)))
            f.write(
                json.dumps(
                    {"id": f"r{i}", "question": "add these", "steps": steps, "mc_correct": ks, "mc_total": n_mc}
                )
                + "\n"
            )
    return path


def train_config(lm_dir, data, out, **kw) -> TrainConfig:
    """A tiny CPU training run's config: these settings, ``kw`` over them."""
    base = dict(
        model=str(lm_dir),
        data=str(data),
        output_dir=str(out),
        global_batch_size=8,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        max_steps=6,
        logging_steps=2,
        save_steps=3,
        use_cpu=True,
        seed=1,
    )
    return TrainConfig(**{**base, **kw})


def run_cli(*args, cwd=None, timeout=300):
    """``python -m betaprm ARGS`` in a fresh process; the CompletedProcess with its text output."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "betaprm", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def leaky_attention_copy(model_dir, dst):
    """A copy of a model directory whose attention masks causally over the whole row,
    ignoring position ids (as an architecture that builds its own mask would): packed
    traces would see each other. Returns ``dst``."""
    import shutil

    import torch.nn.functional as F
    from transformers import AttentionInterface

    def causal_over_row(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("causal_over_row", causal_over_row)
    shutil.copytree(model_dir, dst)
    conf = json.loads((Path(dst) / "config.json").read_text())
    conf["attn_implementation"] = "causal_over_row"
    (Path(dst) / "config.json").write_text(json.dumps(conf))
    return dst


def wait_healthy(proc, request, log, timeout=90):
    """Wait until a `betaprm serve` process answers /health (``request(method, path)`` ->
    (status, ...)); its ``log()`` text in the error when it exits first."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log()[-2000:]}")
        try:
            if request("GET", "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("server did not come up")
