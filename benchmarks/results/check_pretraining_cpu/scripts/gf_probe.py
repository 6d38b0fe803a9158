# ruff: noqa: E402, E501, E731
# The probe script as run for benchmarks/RESULTS.md (entry "the step check learned before the PRMs"), kept as it was.
"""step_check_probe with a Grokfast-EMA gradient filter (g += lamb * EMA(g)) before each optimiser step."""

import os
import sys

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import torch
from transformers import TrainerCallback

import step_check_probe as scp

ALPHA = float(os.environ.get("GF_ALPHA", "0.98"))
LAMB = float(os.environ.get("GF_LAMB", "2.0"))


class Grokfast(TrainerCallback):
    def __init__(self):
        self.ema = {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.grad is None:
                    continue
                e = self.ema.get(n)
                if e is None:
                    e = self.ema[n] = p.grad.detach().clone()
                else:
                    e.mul_(ALPHA).add_(p.grad, alpha=1 - ALPHA)
                p.grad.add_(e, alpha=LAMB)


orig = scp.train_prm


def train_prm(*a, callbacks=None, **k):
    print(f"grokfast alpha={ALPHA} lamb={LAMB}", flush=True)
    return orig(*a, callbacks=(callbacks or []) + [Grokfast()], **k)


scp.train_prm = train_prm
scp.main()
