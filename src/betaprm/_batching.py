"""Forward-pass helpers shared by text scoring (``scoring``) and vision-language scoring
(``vision``): the autocast context and the split of a batch's outputs per trace."""

from __future__ import annotations

import contextlib

import torch

from .types import StepScores


def _autocast(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def split_by_trace(out, n: int) -> list[StepScores]:
    """A forward pass's per-marker outputs (row-major) -> one ``StepScores`` per trace."""
    counts = torch.bincount(out.row, minlength=n).tolist()
    mus, kappas = out.mu.detach().float().cpu().split(counts), out.kappa.detach().float().cpu().split(counts)
    return [StepScores.from_mu_kappa(m.numpy(), k.numpy()) for m, k in zip(mus, kappas)]
