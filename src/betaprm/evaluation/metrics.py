"""Statistics for evaluation tables (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_ci(hits, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``hits`` (resampling problems)."""
    x = np.asarray(hits, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def paired_bootstrap(a, b, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Mean of ``a - b`` over the same problems, with a paired percentile interval."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = a - b
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(1)
    q = (1 - level) / 2
    return {"diff": float(d.mean()), "ci": [float(np.quantile(means, q)), float(np.quantile(means, 1 - q))]}


def auroc(scores, labels) -> float:
    """Probability that a random positive outscores a random negative (ties count 1/2)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    from scipy.stats import rankdata

    # Mann-Whitney through average ranks: the same value as counting pairs, in O(n log n).
    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def within_problem_auroc(scores: Sequence, labels: Sequence) -> float:
    """Mean over problems (with both correct and wrong candidates) of the AUROC of the
    candidates' scores: does the score rank a problem's right answers above its wrong
    ones? 0.5 means no."""
    vals = [auroc(s, y) for s, y in zip(scores, labels)]
    vals = [v for v in vals if not np.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)
