"""Forward-pass helpers shared by text scoring (``scoring``) and vision-language scoring
(``vision``): the autocast context, the split of a batch's outputs per trace, and a batch
of text traces through the model padded or packed."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import torch

from .types import StepScores

logger = logging.getLogger(__name__)


def _autocast(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def split_by_trace(out, n: int) -> list[StepScores]:
    """A forward pass's per-marker outputs (row-major) -> one ``StepScores`` per trace."""
    counts = torch.bincount(out.row, minlength=n).tolist()
    mus, kappas = out.mu.detach().float().cpu().split(counts), out.kappa.detach().float().cpu().split(counts)
    return [StepScores.from_mu_kappa(m.numpy(), k.numpy()) for m, k in zip(mus, kappas)]


def _padded_forward(prm, seqs, pad: int) -> list[StepScores]:
    from .scoring import pad_batch

    ids, mask = pad_batch(seqs, pad)
    with _autocast(prm.device):
        out = prm(ids.to(prm.device, non_blocking=True), attention_mask=mask.to(prm.device, non_blocking=True))
    return split_by_trace(out, len(seqs))


def _packed_forward(prm, seqs, pad: int) -> list[StepScores] | None:
    """Scores of ``seqs`` laid out without padding (``data.dataset.pack_rows``: rows of
    the longest trace, position ids per trace, a block-diagonal causal mask built by
    transformers). The first batch that puts two traces in one row is checked against the
    padded forward: a backbone whose attention ignores position ids (traces would see each
    other) turns packing off for this model, with a warning. None: not packed (score
    padded)."""
    from .data.dataset import pack_rows

    order, batch = pack_rows([{"input_ids": s, "i": i} for i, s in enumerate(seqs)], pad)
    if batch["input_ids"].shape[0] == len(seqs):  # one trace per row: nothing to gain
        return None
    with _autocast(prm.device):
        out = prm(
            input_ids=batch["input_ids"].to(prm.device, non_blocking=True),
            position_ids=batch["position_ids"].to(prm.device, non_blocking=True),
        )
    rep = prm.config.marker_repeat
    counts = [list(f["input_ids"]).count(prm.config.marker_id) // rep for f in order]
    if sum(counts) != out.mu.numel():
        raise RuntimeError(f"packed scoring: {out.mu.numel()} markers read but {sum(counts)} expected")
    mus, kappas = out.mu.float().cpu().split(counts), out.kappa.float().cpu().split(counts)
    scores: list = [None] * len(seqs)
    for f, m, k in zip(order, mus, kappas):
        scores[f["i"]] = StepScores.from_mu_kappa(m.numpy(), k.numpy())
    if not getattr(prm, "_betaprm_packing_checked", False):
        want = _padded_forward(prm, seqs, pad)
        exact = next(prm.parameters()).dtype == torch.float32 and prm.device.type != "cuda"
        worst = max(float(np.abs(a.mu - b.mu).max()) for a, b in zip(scores, want))
        if worst > (1e-4 if exact else 2e-2):
            logger.warning(
                "packed scoring disagrees with padded scoring by %.3g in mu: %s's attention does not keep packed "
                "traces apart; scoring this model with padding",
                worst,
                type(prm.backbone).__name__,
            )
            prm._betaprm_packing = False
            return want
        prm._betaprm_packing_checked = True
    return scores
