"""Batched scoring of traces into ``StepScores``.

One forward pass per trace whatever its number of steps (the marker after every step
is read in the same pass), traces sorted by length into batches so that padding stays
small, and results returned in the caller's order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from .batching import fill_batches, packed_forward, pad_id, padded_forward, token_batches
from .data.records import read_records
from .errors import BetaPRMInputError
from .formatting import TRUNCATE_MODES, encode_traces, fit_to_length
from .options import DEFAULT_MAX_BATCH_TOKENS
from .progress import progress_bar
from .provenance import (
    completed_ids,  # resuming: ids already in an output
    json_line,
)
from .types import StepScores
from .vision import score_multimodal

logger = logging.getLogger(__name__)

__all__ = ["PRMScorer", "StepScores", "score_pool_file", "score_token_ids", "score_traces"]


def max_positions(prm) -> int | None:
    """The backbone's number of positions (``max_position_embeddings``), or None."""
    cfg = prm.backbone.config
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n else None


TRUNCATE_HINT = (
    "pass --truncate steps to score the whole steps that fit (the others get no score), or use a model with more "
    "positions"
)


def fit_traces(
    prm,
    token_ids: Sequence[Sequence[int]],
    truncate: str = "error",
    names: Sequence[str] | None = None,
    max_length: int | None = None,
    hint: str = TRUNCATE_HINT,
) -> tuple[list[list[int]], list[int | None]]:
    """Encoded traces made to fit the model's positions: ``(ids, steps kept)``, where
    ``steps kept`` is None for a trace that fits whole (no pass over its tokens is spent
    on counting) and the number of whole steps kept for a cut one.

    ``truncate="error"`` stops at the first trace longer than the model's positions,
    naming it; ``"steps"`` keeps its first whole steps that fit (as training does), so
    its scores cover those steps only. A trace of which not even one step fits is an
    error in both modes: there is nothing to score. ``hint`` ends the error message (what
    the caller's user can do about it).
    """
    if truncate not in TRUNCATE_MODES:
        raise BetaPRMInputError(f"truncate must be one of {TRUNCATE_MODES}, got {truncate!r}")
    limit = max_length or max_positions(prm)
    marker, rep = prm.config.marker_id, prm.config.marker_repeat
    out_ids, kept = [], []
    for j, ids in enumerate(token_ids):
        if limit is None or len(ids) <= limit:
            out_ids.append(ids)
            kept.append(None)
            continue
        name = names[j] if names is not None else f"trace {j}"
        if truncate == "error":
            raise BetaPRMInputError(f"{name}: {len(ids)} tokens, more than the model's {limit} positions; {hint}")
        cut, n = fit_to_length(ids, marker, limit, rep)
        if n == 0:
            raise BetaPRMInputError(
                f"{name}: not even its first step fits in the model's {limit} positions ({len(ids)} tokens); shorten "
                "the question or use a model with more positions"
            )
        out_ids.append(cut)
        kept.append(n)
    return out_ids, kept


def score_token_ids(
    prm,
    token_ids: Sequence[Sequence[int]],
    batch_size: int | None = None,
    progress=None,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    pack: bool = True,
) -> list[StepScores]:
    """Score already-encoded traces (lists of token ids with marker tokens), in order.

    Batches hold at most ``max_batch_tokens`` positions (and at most ``batch_size`` traces
    when given), so memory is bounded by tokens, not by the number of traces. With ``pack``
    (and no ``batch_size``) each batch's traces are laid out without padding (rows as long as
    the longest, see ``batching.packed_forward``), the same scores for less compute; else padded.
    No autograd graph is kept. ``progress``: an optional callable given the number of
    traces finished per batch.
    """
    pad = pad_id(prm.tokenizer)
    results: list[StepScores | None] = [None] * len(token_ids)
    was_training = prm.training
    prm.eval()
    lengths = [len(t) for t in token_ids]
    packed = pack and getattr(prm, "_betaprm_packing", True) and batch_size is None
    if packed:
        # Longest first, each batch filled to the budget of packed positions.
        batches = fill_batches(sorted(range(len(lengths)), key=lambda i: -lengths[i]), lengths, max_batch_tokens, True)
    else:
        batches = token_batches(lengths, max_batch_tokens, batch_size)
    try:
        with torch.inference_mode():
            for batch in batches:
                seqs = [token_ids[i] for i in batch]
                scores = packed_forward(prm, seqs, pad) if packed else None
                if scores is None:
                    scores = padded_forward(prm, seqs, pad)
                for i, sc in zip(batch, scores):
                    results[i] = sc
                if progress is not None:
                    progress(len(batch))
    finally:
        prm.train(was_training)
    return results  # type: ignore[return-value]


def score_traces(
    prm,
    traces: Sequence[tuple[str, Sequence[str]]],
    batch_size: int | None = None,
    progress=None,
    *,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    truncate: str = "error",
    names: Sequence[str] | None = None,
    max_length: int | None = None,
    hint: str = TRUNCATE_HINT,
) -> list[StepScores]:
    """Score ``(question, steps)`` traces, or ``(question, steps, image paths)`` with a
    vision-language BetaPRM; one ``StepScores`` per trace, in order.

    A trace longer than the model's positions is an error naming it (``names[i]``, or
    its index), unless ``truncate="steps"``: then its scores cover the whole steps that
    fit, so ``len(scores[i]) < len(steps)`` for that trace (see ``fit_traces``).
    Vision-language PRMs batch ``batch_size`` traces (default 8) and do not truncate: an
    image's token count is known only after the processor has run.
    """
    if getattr(prm, "processor", None) is not None:
        return score_multimodal(prm, traces, batch_size=batch_size or 8, progress=progress)
    if any(len(t) > 2 and t[2] for t in traces):
        raise BetaPRMInputError("traces with images need a vision-language BetaPRM; this one is text-only")
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [(t[0], t[1]) for t in traces], prm.config.trace_format)
    ids, _ = fit_traces(prm, ids, truncate, names, max_length, hint)
    return score_token_ids(prm, ids, batch_size=batch_size, progress=progress, max_batch_tokens=max_batch_tokens)


# ---------------------------------------------------------------------- files
def pool_images(record: dict, input_path) -> list[str]:
    """A pool's image paths, relative ones resolved against the pool file's folder."""
    imgs = record.get("images") or (
        [record["image"]] if isinstance(record.get("image"), str) else record.get("image") or []
    )
    base = Path(input_path).parent
    return [p if Path(p).is_absolute() else str(base / p) for p in imgs]


def score_pool_file(
    prm,
    input_path,
    output_path,
    batch_size: int | None = None,
    on_error: str = "fail",
    rejects=None,
    chunk_candidates: int = 256,
    show_progress: bool = True,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    truncate: str = "error",
) -> dict:
    """Score a JSONL file of candidate pools into ``output_path``, appending.

    Each output line is the input record with ``mu``, ``kappa`` and ``sigma`` lists added
    to every candidate. Records whose id is already in the output are skipped, so an
    interrupted run continues where it stopped, with nothing duplicated. With
    ``truncate="steps"`` a candidate longer than the model's positions is scored on the
    whole steps that fit and carries ``steps_scored`` (the length of its score lists).
    """
    loaded = read_records(
        input_path, kind="pool", marker=prm.config.marker, on_error=on_error, rejects=rejects, flag="--input"
    )
    done = completed_ids(output_path)
    todo = [r for r in loaded.records if str(r["id"]) not in done]
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    stats = {
        "records": len(loaded.records),
        "already_done": len(loaded.records) - len(todo),
        "scored": 0,
        "rejected": loaded.n_rejected,
        "candidates": 0,
    }
    with (
        open(output_path, "a", encoding="utf-8") as out,
        progress_bar(len(todo), "scoring", "pool", disable=not show_progress) as bar,
    ):
        start = 0
        while start < len(todo):
            # A chunk of whole pools: candidates of several problems share batches.
            end, n = start, 0
            while end < len(todo) and (n == 0 or n + len(todo[end]["candidates"]) <= chunk_candidates):
                n += len(todo[end]["candidates"])
                end += 1
            pools = todo[start:end]
            traces = [(r["question"], c["steps"], pool_images(r, input_path)) for r in pools for c in r["candidates"]]
            if getattr(prm, "processor", None) is None:
                if any(t[2] for t in traces):
                    raise BetaPRMInputError(
                        f"{input_path}: pools with images need a vision-language BetaPRM; "
                        f"{type(prm.backbone).__name__} is text-only"
                    )
                traces = [t[:2] for t in traces]
            names = [
                f"{input_path}: record {r['id']!r} candidate {j}" for r in pools for j in range(len(r["candidates"]))
            ]
            scores = iter(
                score_traces(
                    prm,
                    traces,
                    batch_size=batch_size,
                    max_batch_tokens=max_batch_tokens,
                    truncate=truncate,
                    names=names,
                )
            )
            lines = []
            for r in pools:
                rec = dict(r)
                rec["candidates"] = [with_scores(c, next(scores)) for c in r["candidates"]]
                lines.append(json_line(rec, ensure_ascii=False))  # a NaN raises before this chunk is written
            # One write per record: a kill leaves at most one partial line, which the
            # next run removes.
            out.writelines(lines)
            out.flush()
            stats["scored"] += len(pools)
            stats["candidates"] += n
            bar.update(len(pools))
            start = end
    return stats


SCORED_FIELDS = ("mu", "kappa", "sigma", "steps_scored")


def with_scores(candidate: dict, scores: StepScores) -> dict:
    """``candidate`` with this scoring's ``mu``/``kappa``/``sigma`` lists, plus
    ``steps_scored`` when the trace was cut to fewer steps than it has
    (``truncate="steps"``). Scores of an earlier scoring are dropped first, so a stale
    ``steps_scored`` never outlives them."""
    d = {k: v for k, v in candidate.items() if k not in SCORED_FIELDS}
    d.update(scores.to_dict())
    if len(scores) < len(candidate["steps"]):
        d["steps_scored"] = len(scores)
    return d


class PRMScorer:
    """A ``Scorer`` for ACA and the labeller: ``scorer(traces) -> list[StepScores]``
    with a BetaPRM (or a standard PRM trained by betaprm), batches packed by
    ``max_batch_tokens`` (and at most ``batch_size`` traces when given)."""

    def __init__(self, prm, batch_size: int | None = None, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS):
        self.prm = prm
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens

    def __call__(self, traces: Sequence[tuple]) -> list[StepScores]:
        """``(question, steps)`` or ``(question, steps, image paths)`` traces."""
        names = [f"a candidate of question {t[0][:60]!r}" for t in traces]
        return score_traces(
            self.prm,
            [(t[0], list(t[1]), *t[2:]) for t in traces],
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            names=names,
            hint=(
                "ACA needs every step scored: use a PRM with more positions, or a lower --max-new-tokens for the "
                "policy"
            ),
        )
