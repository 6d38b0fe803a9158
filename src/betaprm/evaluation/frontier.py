"""Accuracy against compute: a method's frontier over its own knob, and two methods compared
at matched compute (pure numpy).

A method run at several settings of its knob (ACA's stopping threshold, Best-of-n's n)
gives one point per setting: the generated tokens and the per-problem hits on the same
problems. Its **frontier** is the line through those points sorted by tokens. Every point
on a segment is reachable: run the segment's two settings at random, each problem with
the lower setting with probability w, and the tokens and accuracy are the mix of the two,
per problem (``hits_at``). So two methods compare at the same tokens, per problem,
without choosing any setting on the test problems:

- ``matched``: method A at one of its points against B's frontier at A's tokens: the
  paired difference of hits over the same problems, with a bootstrap interval;
- ``dominance``: over the token range both frontiers cover, whether one is at or above the
  other everywhere (at every point of either).

``pooled_paired`` combines paired differences of several runs (seeds, worlds): a
bootstrap that resamples runs and, within each, problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .metrics import bootstrap_ci


@dataclass(frozen=True)
class Point:
    """One setting of a method: its knob value, the tokens it generated on all problems,
    and its per-problem hits (1 / 0, in the problems' order)."""

    knob: float
    tokens: float
    hits: np.ndarray

    @property
    def acc(self) -> float:
        return float(np.mean(self.hits))

    def to_json(self) -> dict:
        """The point with its hits as one string of 0s and 1s (compact in a JSON file)."""
        if not np.isin(self.hits, (0.0, 1.0)).all():
            raise ValueError("only 0/1 hits are written as a string")
        return {"knob": self.knob, "tokens": self.tokens, "hits": "".join("1" if h else "0" for h in self.hits)}

    @classmethod
    def from_json(cls, d: dict) -> Point:
        return cls(d["knob"], d["tokens"], np.array([c == "1" for c in d["hits"]], dtype=np.float64))


def _sorted(points: Sequence[Point]) -> list[Point]:
    if not points:
        raise ValueError("a frontier needs at least one point")
    n = {len(p.hits) for p in points}
    if len(n) != 1:
        raise ValueError(f"a frontier's points must be on the same problems, got {sorted(n)} problems")
    return sorted(points, key=lambda p: (p.tokens, p.knob))


def curve(points: Sequence[Point], seed: int = 0) -> list[dict]:
    """The frontier as JSON-ready rows sorted by tokens: knob, tokens, accuracy and its 95%
    bootstrap interval over problems."""
    return [
        {"knob": p.knob, "tokens": p.tokens, "acc": p.acc, "ci": list(bootstrap_ci(p.hits, seed=seed))}
        for p in _sorted(points)
    ]


def hits_at(points: Sequence[Point], tokens: float) -> np.ndarray | None:
    """Per-problem expected hits of the frontier at ``tokens`` (the mix of the two settings
    around it, as a run that picks between them at random would get); None outside the
    frontier's token range."""
    ps = _sorted(points)
    if tokens < ps[0].tokens or tokens > ps[-1].tokens:
        return None
    for lo, hi in zip(ps, ps[1:]):
        if lo.tokens <= tokens <= hi.tokens:
            if hi.tokens == lo.tokens:  # two settings at the same tokens: the better one
                return (hi if hi.acc > lo.acc else lo).hits * 1.0
            w = (hi.tokens - tokens) / (hi.tokens - lo.tokens)
            return w * lo.hits + (1 - w) * hi.hits
    return ps[0].hits * 1.0  # a single point, at its own tokens


def acc_at(points: Sequence[Point], tokens: float) -> float | None:
    h = hits_at(points, tokens)
    return None if h is None else float(h.mean())


def _paired(d: np.ndarray, n_boot: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    return {"diff": float(d.mean()), "ci": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]}


def matched(a: Point, b: Sequence[Point], n_boot: int = 2000, seed: int = 0) -> dict | None:
    """A's point against B's frontier at A's tokens: the mean paired difference of hits (A
    minus B) with a 95% bootstrap interval over problems, and the per-problem differences
    (for pooling); None when A's tokens lie outside B's range."""
    hb = hits_at(b, a.tokens)
    if hb is None:
        return None
    d = a.hits - hb
    return {"tokens": a.tokens, "a_acc": a.acc, "b_acc": float(hb.mean()), **_paired(d, n_boot, seed), "d": d}


def dominance(a: Sequence[Point], b: Sequence[Point]) -> dict:
    """Which frontier is higher over the tokens both cover: ``"a"`` (at or above B at every
    point of either, above at one), ``"b"``, ``"equal"``, ``"crossing"`` (each above
    somewhere) or ``"disjoint"`` (no common tokens); with the largest gaps each way. With no
    common tokens, the cheaper frontier wins outright (``"a"`` or ``"b"``, ``"range": None``)
    when its most accurate point is at least as accurate as every point of the dearer one:
    it reaches as much with fewer tokens (``"margin"``: its best minus the dearer one's best)."""
    pa, pb = _sorted(a), _sorted(b)
    lo, hi = max(pa[0].tokens, pb[0].tokens), min(pa[-1].tokens, pb[-1].tokens)
    if lo > hi:
        cheap, dear, name = (pa, pb, "a") if pa[-1].tokens < pb[0].tokens else (pb, pa, "b")
        margin = max(p.acc for p in cheap) - max(p.acc for p in dear)
        return {"verdict": name if margin >= 0 else "disjoint", "range": None, "margin": float(margin)}
    xs = sorted({p.tokens for p in pa + pb if lo <= p.tokens <= hi} | {lo, hi})
    gaps = np.array([acc_at(pa, x) - acc_at(pb, x) for x in xs])
    up, down = float(gaps.max()), float(gaps.min())
    eps = 1e-12
    if up <= eps and down >= -eps:
        verdict = "equal"
    elif down >= -eps:
        verdict = "a"
    elif up <= eps:
        verdict = "b"
    else:
        verdict = "crossing"
    return {"verdict": verdict, "range": [lo, hi], "max_a_above_b": up, "max_b_above_a": -down}


def pooled_paired(diffs: Sequence[np.ndarray], n_boot: int = 2000, seed: int = 0) -> dict:
    """Paired differences of several runs (one array per run, over its own problems)
    pooled: the mean over all problems, and a 95% interval from a bootstrap that resamples
    the runs and, within each drawn run, its problems."""
    diffs = [np.asarray(d, dtype=np.float64) for d in diffs if len(d)]
    if not diffs:
        raise ValueError("no paired differences to pool")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for i in range(n_boot):
        runs = rng.integers(0, len(diffs), size=len(diffs))
        total = count = 0.0
        for r in runs:
            d = diffs[r]
            total += d[rng.integers(0, len(d), size=len(d))].sum()
            count += len(d)
        means[i] = total / count
    every = np.concatenate(diffs)
    return {
        "diff": float(every.mean()),
        "ci": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))],
        "runs": len(diffs),
        "problems": int(len(every)),
    }
