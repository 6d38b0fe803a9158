"""Training data: counts records -> token ids with aligned labels (text and vision-language),
the batch samplers (length buckets, token budgets) and the batch collator."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..batching import fill_batches, pack_rows, pad_batch
from ..data.records import Record
from ..errors import BetaPRMInputError
from ..formatting import encode_traces, fit_to_length
from ..vision import encode_multimodal


@dataclass
class EncodeStats:
    """What fitting records to ``max_length`` did (reported at the end of training)."""

    records: int = 0
    truncated_records: int = 0
    dropped_steps: int = 0
    rejected_too_long: int = 0
    steps: int = 0

    def describe(self, max_length: int) -> str:
        return (
            f"{self.records} records ({self.steps} steps) fit max_length {max_length}; "
            f"{self.truncated_records} truncated to whole steps ({self.dropped_steps} steps dropped), "
            f"{self.rejected_too_long} rejected as too long"
        )


class CountsDataset(torch.utils.data.Dataset):
    """Encoded examples: ``input_ids`` with one marker per kept step, and K, N per kept step."""

    def __init__(self, examples: list[dict], stats: EncodeStats):
        self.examples = examples
        self.stats = stats

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        return self.examples[i]

    def lengths(self) -> list[int]:
        """Tokens per example (for length-grouped batches)."""
        return [len(e["input_ids"]) for e in self.examples]


class LengthBucketSampler(torch.utils.data.Sampler):
    """Example indices in batches of similar length, the batches in random order.

    Each epoch shuffles the examples, cuts them into groups of ``group`` batches, sorts each
    group by length and cuts it into batches of ``batch_size``; the full batches then come in
    a random order (the Trainer's ``LengthGroupedSampler`` keeps them longest-first within a
    group, a sawtooth over lengths), partial ones last, so a DataLoader that batches the
    indices in order with ``batch_size`` gets exactly these batches. The order depends only on
    ``seed`` and the epoch (``set_epoch``), so a resumed run skips the same batches.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: int = 50):
        self.lengths = list(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.group = group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def batches(self) -> list[list[int]]:
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(len(self.lengths), generator=g).tolist()
        span = self.batch_size * self.group
        full, partial = [], []
        for start in range(0, len(perm), span):
            chunk = sorted(perm[start : start + span], key=lambda i: self.lengths[i])
            for k in range(0, len(chunk), self.batch_size):
                (full if len(chunk[k : k + self.batch_size]) == self.batch_size else partial).append(
                    chunk[k : k + self.batch_size]
                )
        order = torch.randperm(len(full), generator=g).tolist()
        return [full[k] for k in order] + partial

    def __iter__(self):
        return iter([i for b in self.batches() for i in b])


class TokenBudgetBatchSampler(torch.utils.data.Sampler):
    """Batches of example indices that each fill at most ``max_batch_tokens`` positions of the
    batch tensor (``batch_tokens``: packed rows, or one padded row per trace), for one
    process of ``world``: a batch holds many short traces or a few long ones.

    Each epoch shuffles the examples (with ``group``: sorts each span of ``group``
    budgets' worth by length first, so that a batch holds similar lengths) and fills batches
    greedily in that order; the batches come in a random order. A trace longer than the
    budget makes a batch of its own. Every process computes the same batches from ``seed`` and
    the epoch (``set_epoch``; so a resumed run skips the same ones) and yields all of them;
    accelerate deals them out to the ``world`` processes in turn. When their count does not
    divide by ``world``, the largest batches are halved until it does, so that no process
    repeats a batch to keep up (nothing is dropped or repeated)."""

    def __init__(
        self,
        lengths: Sequence[int],
        max_batch_tokens: int,
        packed: bool,
        seed: int = 0,
        group: int | None = None,
        world: int = 1,
    ):
        if max_batch_tokens < 1:
            raise BetaPRMInputError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if len(lengths) < world:
            raise BetaPRMInputError(f"{len(lengths)} examples cannot make a batch for each of {world} processes")
        self.lengths = list(lengths)
        self.max_batch_tokens = max_batch_tokens
        self.packed = packed
        self.seed = seed
        self.group = group
        self.world = world
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def all_batches(self) -> list[list[int]]:
        """This epoch's batches, of all processes."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        if self.group:
            mean = sum(self.lengths) / len(self.lengths)
            span = max(1, int(self.group * self.max_batch_tokens / mean))
            order = [
                i
                for k in range(0, len(order), span)
                for i in sorted(order[k : k + span], key=self.lengths.__getitem__)
            ]
        batches = fill_batches(order, self.lengths, self.max_batch_tokens, self.packed)
        batches = [batches[k] for k in torch.randperm(len(batches), generator=g).tolist()]
        while len(batches) % self.world:
            k = max(range(len(batches)), key=lambda b: len(batches[b]))
            if len(batches[k]) < 2:  # cannot happen: len(lengths) >= world
                raise RuntimeError("token-budget batches could not be split across processes")
            half = len(batches[k]) // 2
            batches[k : k + 1] = [batches[k][:half], batches[k][half:]]
        self._cache = (self.epoch, batches)
        return batches

    def __len__(self) -> int:
        return len(self.all_batches())

    def __iter__(self):
        return iter(self.all_batches())


def encode_records(
    prm, records: Sequence[Record], max_length: int, truncation: str = "steps", chunk: int = 512, progress=None
) -> CountsDataset:
    """Tokenise ``records`` for training.

    ``truncation="steps"`` (formerly ``"keep-steps"``): a record longer than ``max_length`` keeps the whole
    steps whose markers fit, with their labels; ``"reject"``: such a record is left out.
    Either way a record whose first step does not fit is left out, and all of it is
    counted in the returned dataset's ``stats``.
    """
    if truncation not in ("steps", "keep-steps", "reject"):  # keep-steps: the old name of steps
        raise BetaPRMInputError(f"truncation must be 'steps' or 'reject', got {truncation!r}")
    if max_length < 2:
        raise BetaPRMInputError(f"max_length must be at least 2, got {max_length}")
    marker_id = prm.config.marker_id
    stats = EncodeStats()
    if getattr(prm, "processor", None) is not None:
        return _encode_multimodal_records(prm, records, max_length, truncation, stats, progress)
    examples = []
    for start in range(0, len(records), chunk):
        batch = records[start : start + chunk]
        encoded = encode_traces(
            prm.tokenizer, marker_id, [(r.question, r.steps) for r in batch], prm.config.trace_format
        )
        for j, (r, ids) in enumerate(zip(batch, encoded)):
            kept_ids, kept = fit_to_length(ids, marker_id, max_length, prm.config.marker_repeat)
            if _count(stats, r, kept, truncation):
                # index: the record's position, so a diverging batch can be named by ids.
                examples.append(
                    {
                        "input_ids": kept_ids,
                        "mc_correct": list(r.mc_correct[:kept]),
                        "mc_total": list(r.mc_total[:kept]),
                        "index": start + j,
                    }
                )
        if progress is not None:
            progress(len(batch))
    return CountsDataset(examples, stats)


class MultimodalCountsDataset(torch.utils.data.Dataset):
    """Records for a vision-language BetaPRM, processed when an example is read (images
    are not held in memory): ``input_ids``, ``pixel_values`` (and ``image_grid_thw``),
    K and N per kept step. Which steps fit ``max_length`` is decided once, at load."""

    def __init__(self, prm, items: list[tuple], stats: EncodeStats):
        self.prm = prm
        self.items = items  # (question, kept steps, image paths, K, N, record index)
        self.stats = stats

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        q, steps, images, k, n, index = self.items[i]
        enc = encode_multimodal(self.prm, [(q, steps, images)])
        ex = {"input_ids": enc["input_ids"][0].tolist(), "mc_correct": k, "mc_total": n, "index": index}
        for key in ("pixel_values", "image_grid_thw"):
            if key in enc:
                ex[key] = enc[key]
        return ex


def _count(stats: EncodeStats, r, kept: int, truncation: str) -> bool:
    """Record what truncation did to ``r`` (``kept`` whole steps fit); False: leave it out."""
    if kept < len(r.steps):
        if truncation == "reject" or kept == 0:
            stats.rejected_too_long += 1
            return False
        stats.truncated_records += 1
        stats.dropped_steps += len(r.steps) - kept
    stats.records += 1
    stats.steps += kept
    return True


def _encode_multimodal_records(prm, records, max_length, truncation, stats, progress):
    items = []
    for j, r in enumerate(records):
        ids = encode_multimodal(prm, [(r.question, r.steps, r.images)])["input_ids"][0].tolist()
        _, kept = fit_to_length(ids, prm.config.marker_id, max_length, prm.config.marker_repeat)
        if _count(stats, r, kept, truncation):
            items.append(
                (
                    r.question,
                    list(r.steps[:kept]),
                    list(r.images),
                    list(r.mc_correct[:kept]),
                    list(r.mc_total[:kept]),
                    j,
                )
            )
        if progress is not None:
            progress(1)
    return MultimodalCountsDataset(prm, items, stats)


class CountsCollator:
    """Right-pads ``input_ids`` and concatenates K and N in row-major marker order, the
    order in which ``BetaPRM.forward`` returns its per-marker outputs; image inputs are
    concatenated in the same example order, as the processors batch them.

    ``pack=True`` lays the same traces out without padding: first-fit decreasing into rows
    as long as the batch's longest trace, each trace with its own ``position_ids`` from 0
    and no ``attention_mask``, from which transformers builds a block-diagonal causal mask
    (a trace never attends to another). ``lm_keep`` marks the next-token pairs inside one
    trace, for the auxiliary language-model loss."""

    def __init__(self, pad_id: int, pack: bool = False):
        self.pad_id = pad_id
        self.pack = pack

    def __call__(self, features: list[dict]) -> dict:
        if self.pack:
            if any(k in f for f in features for k in ("pixel_values", "image_grid_thw")):
                raise BetaPRMInputError("packing is for text PRMs; vision-language batches keep padding")
            features, batch = pack_rows(features, self.pad_id)
        else:
            ids, mask = pad_batch([f["input_ids"] for f in features], self.pad_id)
            batch = {"input_ids": ids, "attention_mask": mask, "lm_keep": mask[:, 1:].bool()}
        k = torch.tensor([v for f in features for v in f["mc_correct"]], dtype=torch.float32)
        n = torch.tensor([v for f in features for v in f["mc_total"]], dtype=torch.float32)
        batch.update(mc_correct=k, mc_total=n)
        if all("index" in f for f in features):
            batch["record_index"] = torch.tensor([f["index"] for f in features], dtype=torch.long)
        for key in ("pixel_values", "image_grid_thw"):
            parts = [f[key] for f in features if key in f]
            if parts:
                batch[key] = torch.cat(parts, dim=0)
        return batch
