"""Evaluation statistics on hand-computed cases."""

import numpy as np
import pytest

from betaprm.evaluation.metrics import auroc, bootstrap_ci, paired_bootstrap, spearman, within_problem_auroc


def test_auroc_by_hand():
    # positives 0.9, 0.4; negatives 0.5, 0.4: pairs (0.9>0.5) (0.9>0.4) (0.4<0.5) (0.4=0.4 -> 1/2)
    assert auroc([0.9, 0.5, 0.4, 0.4], [1, 0, 1, 0]) == pytest.approx(2.5 / 4)
    assert np.isnan(auroc([0.1, 0.2], [1, 1]))
    # Problem 1 AUROC 1.0, problem 2 AUROC 0.0, problem 3 one class only (skipped).
    assert within_problem_auroc([[0.9, 0.1], [0.2, 0.8], [0.5, 0.6]], [[1, 0], [1, 0], [1, 1]]) == pytest.approx(0.5)


def test_auroc_equals_counting_pairs_with_ties():
    # auroc goes through average ranks; it must equal the definition, ties counting 1/2.
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        s, y = rng.integers(0, 5, n).astype(float), rng.random(n) < 0.5
        if y.all() or not y.any():
            continue
        pos, neg = s[y], s[~y]
        pairs = ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg))
        assert auroc(s, y) == pytest.approx(pairs, abs=1e-12)


def test_bootstrap_intervals():
    hits = np.array([1] * 80 + [0] * 20)
    lo, hi = bootstrap_ci(hits, n_boot=4000, seed=1)
    # Normal approximation: 0.8 +- 1.96 * 0.04
    assert lo == pytest.approx(0.8 - 0.0784, abs=0.015) and hi == pytest.approx(0.8 + 0.0784, abs=0.015)
    a = np.array([1, 1, 1, 0] * 25)
    b = np.array([1, 1, 0, 0] * 25)
    res = paired_bootstrap(a, b, n_boot=4000, seed=1)
    assert res["diff"] == pytest.approx(0.25)
    assert res["ci"][0] > 0.15 and res["ci"][1] < 0.35
    same = paired_bootstrap(a, a)
    assert same == {"diff": 0.0, "ci": [0.0, 0.0]}


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
