"""Batched scoring of traces into ``StepScores``.

One forward pass per trace whatever its number of steps (the marker after every step
is read in the same pass), traces sorted by length into batches so that padding stays
small, and results returned in the caller's order.

Several processes (torchrun) share the same work here too (``score_shared``, and
``score_pool_file`` with ``procs``): they deal out the forward passes a single process would
run, so that their scores are the single process's. Over 400 lines because the plan of those
passes is made in one place for one process and for many.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from .batching import fill_batches, packed_forward, pad_id, padded_forward, token_batches
from .data.records import read_records
from .distributed import PartWriter, Processes, balanced_shares, done_ids, merge_parts, read_part_records
from .errors import BetaPRMInputError
from .formatting import TRUNCATE_MODES, encode_traces, fit_to_length
from .options import DEFAULT_MAX_BATCH_TOKENS
from .progress import progress_bar
from .provenance import (
    completed_ids,  # resuming: ids already in an output
    json_line,
    part_files,
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
    results: list[StepScores | None] = [None] * len(token_ids)
    batches, packed = batch_plan(prm, [len(t) for t in token_ids], batch_size, max_batch_tokens, pack)
    with eval_mode(prm):
        for batch in batches:
            for i, sc in zip(batch, score_batch(prm, [token_ids[i] for i in batch], packed)):
                results[i] = sc
            if progress is not None:
                progress(len(batch))
    return results  # type: ignore[return-value]


def batch_plan(
    prm,
    lengths: Sequence[int],
    batch_size: int | None = None,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    pack: bool = True,
) -> tuple[list[list[int]], bool]:
    """The forward passes ``score_token_ids`` runs for traces of these ``lengths``: the
    indices of each pass, and whether they are packed."""
    packed = pack and getattr(prm, "_betaprm_packing", True) and batch_size is None
    if packed:
        # Longest first, each batch filled to the budget of packed positions.
        return fill_batches(
            sorted(range(len(lengths)), key=lambda i: -lengths[i]), lengths, max_batch_tokens, True
        ), True
    return token_batches(lengths, max_batch_tokens, batch_size), False


def score_batch(prm, seqs: Sequence[Sequence[int]], packed: bool) -> list[StepScores]:
    """One forward pass over encoded traces, under inference mode: packed (padded when the
    model does not keep packed traces apart), or padded."""
    with torch.inference_mode():
        scores = packed_forward(prm, seqs, pad_id(prm.tokenizer)) if packed else None
        return scores if scores is not None else padded_forward(prm, seqs, pad_id(prm.tokenizer))


@contextlib.contextmanager
def eval_mode(prm):
    """``prm`` in eval mode for the block, then back in the mode it was in."""
    was_training = prm.training
    prm.eval()
    try:
        yield prm
    finally:
        prm.train(was_training)


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
    procs: Processes | None = None,
) -> dict:
    """Score a JSONL file of candidate pools into ``output_path``, appending.

    Each output line is the input record with ``mu``, ``kappa`` and ``sigma`` lists added
    to every candidate. Records whose id is already in the output are skipped, so an
    interrupted run continues where it stopped, with nothing duplicated. With
    ``truncate="steps"`` a candidate longer than the model's positions is scored on the
    whole steps that fit and carries ``steps_scored`` (the length of its score lists).

    ``procs`` (``distributed.processes()``, under torchrun): the processes share the work,
    each scoring whole chunks of pools (the ones a single process would score together),
    dealt out by tokens, into its part file; rank 0 then writes them into ``output_path`` in
    input order (``distributed.merge_parts``), so the output is the single process's. Part
    files left by an interrupted run are finished the same way, by any number of processes.
    """
    procs = procs or Processes()
    loaded = read_records(
        input_path,
        kind="pool",
        marker=prm.config.marker,
        on_error=on_error,
        rejects=rejects if procs.main else None,
        flag="--input",
    )
    shared = procs.world > 1 or bool(part_files(output_path))
    if shared:
        done = procs.broadcast(done_ids(output_path) if procs.main else None)
    else:
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
    chunks = pool_chunks(todo, chunk_candidates)
    kw = dict(batch_size=batch_size, max_batch_tokens=max_batch_tokens, truncate=truncate)
    if not shared:
        with (
            open(output_path, "a", encoding="utf-8") as out,
            progress_bar(len(todo), "scoring", "pool", disable=not show_progress) as bar,
        ):
            for pools in chunks:
                # One write per record: a kill leaves at most one partial line, which the
                # next run removes.
                out.writelines(scored_pool_lines(prm, pools, input_path, **kw))
                out.flush()
                stats["scored"] += len(pools)
                stats["candidates"] += sum(len(r["candidates"]) for r in pools)
                bar.update(len(pools))
        return stats
    # Several processes: each scores its chunks into its part file; rank 0 merges.
    mine = [chunks[i] for i in balanced_shares(_chunk_tokens(prm, chunks, procs), procs.world)[procs.rank]]
    scored = candidates = 0
    with (
        PartWriter(output_path, procs) as part,
        progress_bar(sum(map(len, mine)), "scoring", "pool", disable=not show_progress or not procs.main) as bar,
    ):
        for pools in mine:
            part.write(scored_pool_lines(prm, pools, input_path, **kw))
            scored += len(pools)
            candidates += sum(len(r["candidates"]) for r in pools)
            bar.update(len(pools))
    counts = procs.all_gather((scored, candidates))  # every part complete from here on
    stats["scored"] = sum(c[0] for c in counts)
    stats["candidates"] = sum(c[1] for c in counts)
    if procs.main:
        merge_parts(output_path, [str(r["id"]) for r in loaded.records])
    return stats


def pool_chunks(pools: Sequence[dict], chunk_candidates: int) -> list[list[dict]]:
    """Consecutive whole pools of at most ``chunk_candidates`` candidates (a pool with more
    alone): the pools whose candidates share forward passes."""
    chunks, start = [], 0
    while start < len(pools):
        end, n = start, 0
        while end < len(pools) and (n == 0 or n + len(pools[end]["candidates"]) <= chunk_candidates):
            n += len(pools[end]["candidates"])
            end += 1
        chunks.append(list(pools[start:end]))
        start = end
    return chunks


def _pool_traces(prm, pools, input_path) -> list[tuple]:
    traces = [(r["question"], c["steps"], pool_images(r, input_path)) for r in pools for c in r["candidates"]]
    if getattr(prm, "processor", None) is None:
        if any(t[2] for t in traces):
            raise BetaPRMInputError(
                f"{input_path}: pools with images need a vision-language BetaPRM; "
                f"{type(prm.backbone).__name__} is text-only"
            )
        traces = [t[:2] for t in traces]
    return traces


def scored_pool_lines(prm, pools, input_path, **kw) -> list[str]:
    """The output lines of ``pools`` (a chunk): each record with its candidates' scores.
    ``kw``: ``score_traces``' batching and truncation."""
    traces = _pool_traces(prm, pools, input_path)
    names = [f"{input_path}: record {r['id']!r} candidate {j}" for r in pools for j in range(len(r["candidates"]))]
    scores = iter(score_traces(prm, traces, names=names, **kw))
    lines = []
    for r in pools:
        rec = dict(r)
        rec["candidates"] = [with_scores(c, next(scores)) for c in r["candidates"]]
        lines.append(json_line(rec, ensure_ascii=False))  # a NaN raises before this chunk is written
    return lines


def trace_tokens(prm, traces: Sequence[tuple]) -> list[int]:
    """The number of tokens of each trace as the scorer encodes it (before any cut); for a
    vision-language PRM, whose images are counted only by its processor, the characters of
    the question and steps."""
    if getattr(prm, "processor", None) is not None:
        return [len(t[0]) + sum(map(len, t[1])) for t in traces]
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [(t[0], t[1]) for t in traces], prm.config.trace_format)
    return [len(x) for x in ids]


def _chunk_tokens(prm, chunks, procs: Processes) -> list[int]:
    """The tokens of each chunk of pools: each process encodes every ``world``-th chunk, and
    the counts are shared."""
    own = {
        c: sum(trace_tokens(prm, [(r["question"], x["steps"]) for r in chunks[c] for x in r["candidates"]]))
        for c in range(procs.rank, len(chunks), procs.world)
    }
    tokens = [0] * len(chunks)
    for part in procs.all_gather(own):
        for c, n in part.items():
            tokens[c] = n
    return tokens


def score_shared(
    prm,
    traces: Sequence[tuple],
    procs: Processes,
    names: Sequence[str] | None = None,
    state=None,
    keys: Sequence[str] | None = None,
    *,
    batch_size: int | None = None,
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    truncate: str = "error",
    progress: str | None = None,
) -> list[StepScores] | None:
    """``score_traces`` shared by the processes ``procs``: every trace's scores, in order, on
    rank 0; None on the others.

    The plan is the single process's (``batch_plan``: the same forward passes, the same
    traces in each), so the scores are the ones ``score_traces`` gives; its passes are
    dealt out by their tokens. ``state``: a path (an evaluation's ``OUT.scores``) whose part
    files keep each trace's scores as its pass ends (``{"id": index, "mu": ..., "kappa":
    ..., "sigma": ...}``, the id ``keys[i]``, by default ``i``): a run killed mid-way resumes
    with the traces found there, under any number of processes. Without it the scores travel
    to rank 0 in memory.
    ``progress``: the description of a progress bar of rank 0's share (None: no bar).
    """
    keys = [str(k) for k in keys] if keys is not None else [str(i) for i in range(len(traces))]
    # Rank 0 reads what is done (cutting a line a kill left torn) before anyone appends.
    done = procs.broadcast(done_ids(state) if state is not None and procs.main else set())
    todo = [i for i in range(len(traces)) if keys[i] not in done]
    if procs.main and len(todo) < len(traces):
        logger.info(
            f"{state}: {len(traces) - len(todo)} of {len(traces)} traces scored by an interrupted run; scoring the "
            f"other {len(todo)} ({procs.world} process{'es' if procs.world > 1 else ''})"
        )
    names = list(names) if names is not None else [f"trace {i}" for i in range(len(traces))]
    vision = getattr(prm, "processor", None) is not None
    if vision:
        bs = batch_size or 8
        plan = [todo[b : b + bs] for b in range(0, len(todo), bs)]
        weights = procs.all_gather(
            {
                p: sum(trace_tokens(prm, [traces[i] for i in plan[p]]))
                for p in range(procs.rank, len(plan), procs.world)
            }
        )
        packed = False
    else:
        # Each process encodes (and checks the length of) every world-th trace; the plan
        # comes from all the lengths.
        stride = todo[procs.rank :: procs.world]
        ids, _ = fit_traces(prm, _encode(prm, [traces[i] for i in stride]), truncate, [names[i] for i in stride])
        lengths = {}
        for part in procs.all_gather({i: len(x) for i, x in zip(stride, ids)}):
            lengths.update(part)
        local, packed = batch_plan(prm, [lengths[i] for i in todo], batch_size, max_batch_tokens)
        plan = [[todo[j] for j in batch] for batch in local]
        weights = [{p: sum(lengths[i] for i in batch) for p, batch in enumerate(plan)}]
    tokens = [0] * len(plan)
    for part in weights:
        for p, n in part.items():
            tokens[p] = n
    mine = [plan[p] for p in balanced_shares(tokens, procs.world)[procs.rank]]
    results: dict[int, StepScores] = {}
    writer = PartWriter(state, procs) if state is not None else None
    n_mine = sum(map(len, mine))
    bar = progress_bar(n_mine, progress or "", "trace", disable=progress is None or not procs.main)
    try:
        if not vision:
            wanted = sorted(i for batch in mine for i in batch)
            ids, _ = fit_traces(prm, _encode(prm, [traces[i] for i in wanted]), truncate, [names[i] for i in wanted])
            encoded = dict(zip(wanted, ids))
        with eval_mode(prm):
            for batch in mine:
                if vision:
                    scores = score_multimodal(prm, [traces[i] for i in batch], batch_size=len(batch))
                else:
                    scores = score_batch(prm, [encoded[i] for i in batch], packed)
                if writer is not None:
                    writer.write([json_line({"id": keys[i], **s.to_dict()}) for i, s in zip(batch, scores)])
                else:
                    results.update(zip(batch, scores))
                bar.update(len(batch))
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    if writer is not None:
        procs.all_gather(None)  # every part complete from here on
        if not procs.main:
            return None
        found = read_part_records(state)
        return [StepScores(found[k]["mu"], found[k]["kappa"], found[k]["sigma"]) for k in keys]
    gathered = procs.gather(results)
    if gathered is None:
        return None
    for part in gathered:
        results.update(part)
    return [results[i] for i in range(len(traces))]


def _encode(prm, traces) -> list[list[int]]:
    return encode_traces(prm.tokenizer, prm.config.marker_id, [(t[0], t[1]) for t in traces], prm.config.trace_format)


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
