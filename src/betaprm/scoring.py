"""Batched scoring of traces into ``StepScores``.

One forward pass per trace whatever its number of steps (the marker after every step
is read in the same pass), traces sorted by length into batches so that padding stays
small, and results returned in the caller's order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import BetaPRMInputError
from .formatting import encode_traces

__all__ = ["PRMScorer", "StepScores", "score_token_ids", "score_traces"]


@dataclass
class StepScores:
    """The Beta belief at each step of one trace: float64 numpy arrays of shape (T,)."""

    mu: np.ndarray
    kappa: np.ndarray
    sigma: np.ndarray

    def __post_init__(self):
        self.mu = np.asarray(self.mu, dtype=np.float64)
        self.kappa = np.asarray(self.kappa, dtype=np.float64)
        if self.sigma is None:
            self.sigma = np.sqrt(self.mu * (1.0 - self.mu) / (self.kappa + 1.0))
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        if not (self.mu.shape == self.kappa.shape == self.sigma.shape) or self.mu.ndim != 1:
            raise ValueError(f"mu, kappa, sigma must be 1-D of one length, got {self.mu.shape}, {self.kappa.shape}, {self.sigma.shape}")

    @classmethod
    def from_mu_kappa(cls, mu, kappa) -> StepScores:
        return cls(mu, kappa, None)

    def __len__(self) -> int:
        return len(self.mu)

    def to_dict(self) -> dict:
        return {"mu": self.mu.tolist(), "kappa": self.kappa.tolist(), "sigma": self.sigma.tolist()}


def _autocast(device: torch.device):
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _pad_id(tokenizer) -> int:
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


@torch.no_grad()
def split_by_trace(out, n: int) -> list[StepScores]:
    """A forward pass's per-marker outputs (row-major) -> one ``StepScores`` per trace."""
    counts = torch.bincount(out.row, minlength=n).tolist()
    mus, kappas = out.mu.float().cpu().split(counts), out.kappa.float().cpu().split(counts)
    return [StepScores.from_mu_kappa(m.numpy(), k.numpy()) for m, k in zip(mus, kappas)]


def score_token_ids(prm, token_ids: Sequence[Sequence[int]], batch_size: int = 16, progress=None) -> list[StepScores]:
    """Score already-encoded traces (lists of token ids with marker tokens).

    ``progress``: an optional callable given the number of traces finished per batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = prm.device
    pad = _pad_id(prm.tokenizer)
    results: list[StepScores | None] = [None] * len(token_ids)
    was_training = prm.training
    prm.eval()
    try:
        for batch in length_batches([len(t) for t in token_ids], batch_size):
            ids, mask = pad_batch([token_ids[i] for i in batch], pad)
            with _autocast(device):
                out = prm(ids.to(device, non_blocking=True), attention_mask=mask.to(device, non_blocking=True))
            for i, sc in zip(batch, split_by_trace(out, len(batch))):
                results[i] = sc
            if progress is not None:
                progress(len(batch))
    finally:
        prm.train(was_training)
    return results  # type: ignore[return-value]


def score_traces(prm, traces: Sequence[tuple[str, Sequence[str]]], batch_size: int = 16, progress=None) -> list[StepScores]:
    """Score ``(question, steps)`` traces, or ``(question, steps, image paths)`` with a
    vision-language BetaPRM; one ``StepScores`` per trace, in order."""
    if getattr(prm, "processor", None) is not None:
        from .vision import score_multimodal

        return score_multimodal(prm, traces, batch_size=batch_size)
    if any(len(t) > 2 and t[2] for t in traces):
        raise BetaPRMInputError("traces with images need a vision-language BetaPRM; this one is text-only")
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [(t[0], t[1]) for t in traces], prm.config.trace_format)
    return score_token_ids(prm, ids, batch_size=batch_size, progress=progress)


# ---------------------------------------------------------------------- files
def _completed_ids(path) -> set[str]:
    """Ids already in an output file. A last line without its newline is the remains of
    an interrupted write: it is cut off (and said so), every complete line is kept."""
    import json
    import os
    import sys

    ids: set[str] = set()
    if not os.path.exists(path):
        return ids
    with open(path, "rb") as f:
        data = f.read()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        print(f"{path}: removing a partial last line ({len(data) - keep} bytes) left by an interrupted run", file=sys.stderr)
        with open(path, "r+b") as f:
            f.truncate(keep)
    for i, line in enumerate(data[:keep].splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            from .errors import BetaPRMInputError

            raise BetaPRMInputError(f"{path}:{i}: existing output line is not a scored record; move the file away or fix it") from None
    return ids


def _pool_images(record: dict, input_path) -> list[str]:
    """A pool's image paths, relative ones resolved against the pool file's folder."""
    from pathlib import Path

    imgs = record.get("images") or ([record["image"]] if isinstance(record.get("image"), str) else record.get("image") or [])
    base = Path(input_path).parent
    return [p if Path(p).is_absolute() else str(base / p) for p in imgs]


def score_pool_file(prm, input_path, output_path, batch_size: int = 16, on_error: str = "fail", rejects=None, chunk_candidates: int = 256, show_progress: bool = True) -> dict:
    """Score a JSONL file of candidate pools into ``output_path``, appending.

    Each output line is the input record with ``mu``, ``kappa`` and ``sigma`` lists added
    to every candidate. Records whose id is already in the output are skipped, so an
    interrupted run continues where it stopped, with nothing duplicated.
    """
    import json
    from pathlib import Path

    from tqdm.auto import tqdm

    from .data.records import read_records

    loaded = read_records(input_path, kind="pool", marker=prm.config.marker, on_error=on_error, rejects=rejects)
    done = _completed_ids(output_path)
    todo = [r for r in loaded.records if str(r["id"]) not in done]
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    stats = {"records": len(loaded.records), "already_done": len(loaded.records) - len(todo), "scored": 0, "rejected": loaded.n_rejected, "candidates": 0}
    with open(output_path, "a", encoding="utf-8") as out, tqdm(total=len(todo), desc="scoring", unit="pool", disable=not show_progress) as bar:
        start = 0
        while start < len(todo):
            # A chunk of whole pools: candidates of several problems share batches.
            end, n = start, 0
            while end < len(todo) and (n == 0 or n + len(todo[end]["candidates"]) <= chunk_candidates):
                n += len(todo[end]["candidates"])
                end += 1
            pools = todo[start:end]
            traces = [(r["question"], c["steps"], _pool_images(r, input_path)) for r in pools for c in r["candidates"]]
            if getattr(prm, "processor", None) is None:
                if any(t[2] for t in traces):
                    raise BetaPRMInputError(f"{input_path}: pools with images need a vision-language BetaPRM; {type(prm.backbone).__name__} is text-only")
                traces = [t[:2] for t in traces]
            scores = iter(score_traces(prm, traces, batch_size=batch_size))
            lines = []
            for r in pools:
                rec = dict(r)
                rec["candidates"] = [{**c, **next(scores).to_dict()} for c in r["candidates"]]
                lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
            # One write per record: a kill leaves at most one partial line, which the
            # next run removes.
            out.writelines(lines)
            out.flush()
            stats["scored"] += len(pools)
            stats["candidates"] += n
            bar.update(len(pools))
            start = end
    return stats


class PRMScorer:
    """A ``Scorer`` for ACA and the labeller: ``scorer(traces) -> list[StepScores]``
    with a BetaPRM (or a standard PRM trained by betaprm) and a batch size."""

    def __init__(self, prm, batch_size: int = 16):
        self.prm = prm
        self.batch_size = batch_size

    def __call__(self, traces: Sequence[tuple[str, Sequence[str]]]) -> list[StepScores]:
        return score_traces(self.prm, [(q, list(s)) for q, s in traces], batch_size=self.batch_size)
