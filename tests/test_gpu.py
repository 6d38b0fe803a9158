"""GPU paths: bf16 autocast scoring, a bf16 backbone, and the loss on CUDA.

Skipped without CUDA (CI has none); run on a GPU machine with `pytest tests/test_gpu.py`.
"""

import random

import numpy as np
import pytest
import torch

from betaprm import BetaPRM, beta_binomial_nll, evidence_regularizer
from betaprm.formatting import encode_traces
from betaprm.tiny import tiny_causal_lm

from .conftest import fresh_tokenizer, random_steps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")


def _cands(n=9, seed=0):
    rng = random.Random(seed)
    return [random_steps(rng, rng.randint(1, 6)) for _ in range(n)]


def test_bf16_autocast_scoring_matches_cpu_float32(bpe_tokenizer):
    tok = fresh_tokenizer(bpe_tokenizer)
    prm = BetaPRM.from_backbone(tiny_causal_lm(len(tok), hidden_size=128, num_layers=2), tok)
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    cands = _cands()
    cpu = prm.score("Q?", cands, batch_size=4)
    prm.to("cuda")
    gpu = prm.score("Q?", cands, batch_size=4)
    gpu_single = [prm.score("Q?", [c], batch_size=1)[0] for c in cands]
    for a, b, c in zip(cpu, gpu, gpu_single):
        # bf16 autocast: ~3 significant digits, hence the tolerance.
        np.testing.assert_allclose(a.mu, b.mu, atol=2e-2)
        np.testing.assert_allclose(a.kappa, b.kappa, rtol=0.1)  # softplus of a bf16 dot product
        np.testing.assert_allclose(b.mu, c.mu, atol=2e-2)
        assert b.mu.dtype == np.float64 and np.all(np.isfinite(b.sigma))


def test_bf16_backbone_trains_with_float32_loss(bpe_tokenizer):
    tok = fresh_tokenizer(bpe_tokenizer)
    prm = BetaPRM.from_backbone(tiny_causal_lm(len(tok), hidden_size=128, num_layers=2).to(torch.bfloat16), tok).to(
        "cuda"
    )
    assert next(prm.backbone.parameters()).dtype == torch.bfloat16
    assert prm.kappa_head.weight.dtype == torch.float32
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [("q", c) for c in _cands(4)])
    width = max(map(len, ids))
    x = torch.tensor([i + [0] * (width - len(i)) for i in ids], device="cuda")
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device="cuda")
    out = prm(x, attention_mask=mask)
    assert out.mu.dtype == torch.float32 and out.kappa.dtype == torch.float32
    k = torch.full_like(out.mu, 3.0)
    n = torch.full_like(out.mu, 8.0)
    loss = (beta_binomial_nll(out.mu, out.kappa, k, n) + 0.05 * evidence_regularizer(out.mu, out.kappa, k, n)).mean()
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(prm.kappa_head.weight.grad).all() and prm.kappa_head.weight.grad.abs().sum() > 0


def test_nll_on_cuda_matches_cpu():
    g = torch.rand(1000, dtype=torch.float64)
    kappa = 10 ** (torch.rand(1000, dtype=torch.float64) * 9 - 3)
    n = torch.randint(1, 65, (1000,)).double()
    k = torch.floor(torch.rand(1000, dtype=torch.float64) * (n + 1))
    cpu = beta_binomial_nll(g, kappa, k, n)
    gpu = beta_binomial_nll(g.cuda(), kappa.cuda(), k.cuda(), n.cuda()).cpu()
    torch.testing.assert_close(cpu, gpu, rtol=1e-10, atol=1e-12)


def test_train_in_bf16_on_gpu(tmp_path):
    from betaprm.train import TrainConfig, train

    from .helpers import make_counts, make_lm_dir

    lm = make_lm_dir(tmp_path / "lm", hidden=64)
    data = make_counts(tmp_path / "counts.jsonl", n=64)
    cfg = TrainConfig(
        model=str(lm),
        data=str(data),
        output_dir=str(tmp_path / "run"),
        global_batch_size=8,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        max_steps=8,
        logging_steps=2,
        save_steps=4,
    )
    prm, trainer, _ = train(cfg)
    assert trainer.args.bf16 and prm.device.type == "cuda"  # precision auto -> bf16 on a bf16 GPU
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and all(np.isfinite(h["loss"]) and np.isfinite(h["kappa_mean"]) for h in logs)
    loaded = BetaPRM.from_pretrained(tmp_path / "run", device="cuda")
    s = loaded.score("add these", [["1 + 2 = 3"]])[0]
    assert np.all(np.isfinite(s.mu)) and np.all(np.isfinite(s.kappa))
