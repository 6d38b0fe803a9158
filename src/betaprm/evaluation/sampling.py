"""Samples of a benchmark stratified by class, so that a small run still reports every metric.

A step-level benchmark's F1 needs items of both kinds (erroneous and all-correct) in every
subset, and the official files are sorted by kind: the first hundreds of items of each
ProcessBench subset all have an error, so its first N items give an undefined F1 everywhere.
``stratified_sample`` draws from each class separately; ``limit_per_group`` does so within
each subset (``eval-steps --limit``). Both are deterministic for a seed (``random.Random``),
and keep the items in their input order.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Hashable, Sequence


def allocate(sizes: dict, n: int) -> dict:
    """How many of ``n`` items to draw from each class, in proportion to the class sizes
    (largest remainder; ties to the class that sorts first), with at least one from every
    non-empty class when ``n`` is at least the number of classes, so that a metric needing
    both kinds stays defined. All of every class when ``n`` covers them."""
    total = sum(sizes.values())
    if n >= total:
        return dict(sizes)
    keys = sorted(sizes)
    quota = {c: n * sizes[c] / total for c in keys}
    take = {c: int(quota[c]) for c in keys}
    for c in sorted(keys, key=lambda c: -(quota[c] - take[c]))[: n - sum(take.values())]:
        take[c] += 1
    if n >= sum(1 for c in keys if sizes[c]):
        for c in keys:
            if sizes[c] and not take[c]:
                donor = max(keys, key=lambda d: take[d])  # the largest share gives one up
                take[donor] -= 1
                take[c] = 1
    return take


def stratified_sample(
    classes: Sequence[Hashable], *, n: int | None = None, per_class: int | None = None, seed: int = 0
) -> list[int]:
    """Indices into ``classes`` (one class key per item, e.g. "has an error") of a sample
    drawn class by class, in the input's order. Exactly one of ``n`` (items in all, shared
    out in proportion to the classes' sizes by ``allocate``) and ``per_class`` (that many of
    each class, all of a smaller one). Deterministic: ``random.Random(seed)`` draws from the
    classes in sorted order (``rng.sample`` of each class's indices)."""
    if (n is None) == (per_class is None):
        raise ValueError("give exactly one of n and per_class")
    if (n if n is not None else per_class) < 0:
        raise ValueError(f"cannot draw a negative number of items ({n if n is not None else per_class})")
    members: dict = {}
    for i, c in enumerate(classes):
        members.setdefault(c, []).append(i)
    sizes = {c: len(ix) for c, ix in members.items()}
    take = allocate(sizes, n) if n is not None else {c: min(per_class, k) for c, k in sizes.items()}
    rng = random.Random(seed)
    keep: set[int] = set()
    for c in sorted(members):
        keep.update(rng.sample(members[c], take[c]))
    return sorted(keep)


def limit_per_group(groups: Sequence[str], classes: Sequence[Hashable], n: int, seed: int = 0) -> list[int]:
    """Indices of at most ``n`` items of each group (a benchmark's subset), stratified by
    class within it (``stratified_sample``), in the input's order. Each group draws with its
    own seed, made from ``seed`` and the group's name, so a group's sample does not change
    when other groups are added or left out."""
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    keep: list[int] = []
    for g, ix in by_group.items():
        picked = stratified_sample([classes[i] for i in ix], n=n, seed=zlib.crc32(f"{seed}/{g}".encode()))
        keep += [ix[j] for j in picked]
    return sorted(keep)
