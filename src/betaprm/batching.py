"""Batching for forward passes, in one place: token budgets (how traces are grouped so
that a batch's positions stay under ``max_batch_tokens``), packing several traces into one
row, padding, and the padded and packed forward passes that scoring, vision-language
scoring and training share."""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Sequence

import numpy as np
import torch

from .errors import BetaPRMInputError
from .types import StepScores

logger = logging.getLogger(__name__)


def pad_id(tokenizer) -> int:
    """The tokenizer's padding id: its pad token, else its end of sequence, else 0."""
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    return 0 if pad is None else pad


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, S) ``input_ids`` and ``attention_mask``; right padding keeps
    every real token at its unpadded position, so batched == one-by-one."""
    rows = [torch.as_tensor(s, dtype=torch.long) for s in seqs]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id)
    lengths = torch.tensor([len(s) for s in seqs])
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    return ids, mask


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def token_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int | None = None) -> list[list[int]]:
    """Indices packed longest first into batches whose padded size (number of traces x
    the longest one's length) is at most ``max_batch_tokens``; a trace longer than the
    budget is scored alone. ``max_batch_size`` optionally caps the traces per batch."""
    if max_batch_tokens < 1:
        raise BetaPRMInputError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    if max_batch_size is not None and max_batch_size < 1:
        raise BetaPRMInputError(f"batch size must be >= 1, got {max_batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        b = batches[-1] if batches else None
        # Longest first: the batch's first trace sets its padded width.
        if (
            b
            and (len(b) + 1) * max(lengths[b[0]], 1) <= max_batch_tokens
            and (max_batch_size is None or len(b) < max_batch_size)
        ):
            b.append(i)
        else:
            batches.append([i])
    return batches


def first_fit_rows(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of ``lengths`` packed first-fit decreasing into rows of ``max(lengths)``."""
    cap = max(lengths)
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: ties keep batch order
        r = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if r is None:
            rows.append([i])
            room.append(cap - lengths[i])
        else:
            rows[r].append(i)
            room[r] -= lengths[i]
    return rows


def batch_tokens(lengths: Sequence[int], packed: bool) -> int:
    """Positions of the batch tensor the collator makes of traces of ``lengths``: rows x
    the longest trace, packed (``first_fit_rows``) or one trace per row."""
    rows = len(first_fit_rows(lengths)) if packed else len(lengths)
    return rows * max(lengths)


def fill_batches(order: Sequence[int], lengths: Sequence[int], max_batch_tokens: int, packed: bool) -> list[list[int]]:
    """``order`` cut greedily into batches of at most ``max_batch_tokens`` positions
    (``batch_tokens``); a trace over the budget makes a batch of its own."""
    batches: list[list[int]] = []
    pending = deque(order)
    while pending:
        # Fill by a bound that is cheap to keep (the traces' own tokens when packed, count x
        # longest when padded), then give back traces while the packed rows overflow.
        batch, total, longest = [], 0, 0
        while pending:
            n = lengths[pending[0]]
            cost = total + n if packed else (len(batch) + 1) * max(longest, n)
            if batch and cost > max_batch_tokens:
                break
            batch.append(pending.popleft())
            total, longest = total + n, max(longest, n)
        while len(batch) > 1 and batch_tokens([lengths[j] for j in batch], packed) > max_batch_tokens:
            pending.appendleft(batch.pop())
        batches.append(batch)
    return batches


def pack_rows(features: list[dict], pad_id: int) -> tuple[list[dict], dict]:
    """``features`` packed first-fit decreasing into rows of the longest one's length.
    (Longer rows fit more traces but cost attention: on the demo's short traces, rows of
    twice the longest gained nothing.) Returns the features in packed order (row by row,
    left to right: the order of their markers in the batch) and ``input_ids``, ``position_ids``, ``lm_keep`` tensors. A
    row's tail of padding is a segment of its own (positions from 0), attended by nothing
    real."""
    lengths = [len(f["input_ids"]) for f in features]
    cap = max(lengths)
    rows = first_fit_rows(lengths)
    ids = torch.full((len(rows), cap), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), cap), dtype=torch.long)
    seg = torch.full((len(rows), cap), -1, dtype=torch.long)  # -1: padding
    order = []
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            n = lengths[i]
            ids[r, at : at + n] = torch.as_tensor(features[i]["input_ids"], dtype=torch.long)
            pos[r, at : at + n] = torch.arange(n)
            seg[r, at : at + n] = len(order)
            order.append(i)
            at += n
        pos[r, at:] = torch.arange(cap - at)
    keep = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] >= 0)
    return [features[i] for i in order], {"input_ids": ids, "position_ids": pos, "lm_keep": keep}


def autocast(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def split_by_trace(out, n: int) -> list[StepScores]:
    """A forward pass's per-marker outputs (row-major) -> one ``StepScores`` per trace."""
    counts = torch.bincount(out.row, minlength=n).tolist()
    mus, kappas = out.mu.detach().float().cpu().split(counts), out.kappa.detach().float().cpu().split(counts)
    return [StepScores.from_mu_kappa(m.numpy(), k.numpy()) for m, k in zip(mus, kappas)]


def padded_forward(prm, seqs, pad: int) -> list[StepScores]:
    ids, mask = pad_batch(seqs, pad)
    with autocast(prm.device):
        out = prm(ids.to(prm.device, non_blocking=True), attention_mask=mask.to(prm.device, non_blocking=True))
    return split_by_trace(out, len(seqs))


def packed_forward(prm, seqs, pad: int) -> list[StepScores] | None:
    """Scores of ``seqs`` laid out without padding (``pack_rows``: rows of
    the longest trace, position ids per trace, a block-diagonal causal mask built by
    transformers). The first batch that puts two traces in one row is checked against the
    padded forward: a backbone whose attention ignores position ids (traces would see each
    other) turns packing off for this model, with a warning. None: not packed (score
    padded)."""
    order, batch = pack_rows([{"input_ids": s, "i": i} for i, s in enumerate(seqs)], pad)
    if batch["input_ids"].shape[0] == len(seqs):  # one trace per row: nothing to gain
        return None
    with autocast(prm.device):
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
        want = padded_forward(prm, seqs, pad)
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
