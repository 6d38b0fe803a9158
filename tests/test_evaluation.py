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


def test_count_calibration_against_scipy_and_by_hand():
    from scipy.stats import betabinom, binom

    from betaprm.evaluation.calibration import evaluate_counts

    mu = np.array([0.1, 0.15, 0.5, 0.9])
    kappa = np.array([2.0, 50.0, 5.0, 1000.0])
    k = np.array([0.0, 3.0, 8.0, 16.0])
    n = np.array([16.0, 16.0, 16.0, 16.0])
    r = evaluate_counts(mu, kappa, k, n, beta=True, bins=2)
    a, b = mu * kappa + 1e-6, (1 - mu) * kappa + 1e-6
    assert r["nll"]["beta_binomial"] == pytest.approx(-betabinom.logpmf(k, n, a, b).mean(), rel=1e-6)
    assert r["nll"]["binomial_at_mu"] == pytest.approx(-binom.logpmf(k, n, mu).mean(), rel=1e-9)
    p = k.sum() / n.sum()
    assert r["constant_rate"] == p and r["nll"]["constant"] == pytest.approx(-binom.logpmf(k, n, p).mean())
    rate = k / n
    # two bins: mu < 0.5 holds steps 0 and 1, mu >= 0.5 steps 2 and 3
    ece = 0.5 * abs(0.125 - (0 + 3 / 16) / 2) + 0.5 * abs(0.7 - (0.5 + 1) / 2)
    assert r["ece"] == pytest.approx(ece) and r["brier"] == pytest.approx(((mu - rate) ** 2).mean())
    for level in (0.5, 0.9):
        lo, hi = betabinom.ppf((1 - level) / 2, n, a, b), betabinom.ppf((1 + level) / 2, n, a, b)
        got = r["intervals"][f"beta_binomial_{level:g}"]
        assert got["coverage"] == pytest.approx(((k >= lo) & (k <= hi)).mean())
        assert got["width"] == pytest.approx(((hi - lo) / n).mean())
    # a point estimate ignores how unsure mu is: its intervals are narrower than the Beta-Binomial's
    assert r["intervals"]["binomial_at_mu_0.9"]["width"] < r["intervals"]["beta_binomial_0.9"]["width"]
    std = evaluate_counts(mu, kappa, k, n, beta=False)
    assert "beta_binomial" not in std["nll"] and "spearman_sigma_error" not in std


def test_beta_binomial_intervals_from_a_table_equal_scipys_quantiles():
    """The held-out intervals of K come from one table of each step's Beta-Binomial (fast
    enough to evaluate while training); they must be scipy's ppf to the last k, at extreme
    parameters too (mu 0 or 1, kappa from 0.05 to 3000), and fall back to it for large N."""
    from scipy.stats import betabinom

    from betaprm.evaluation.calibration import TABLE_MAX_N, beta_binomial_interval

    rng = np.random.default_rng(0)
    for n in (rng.integers(1, 40, 2000).astype(float), np.full(100, float(TABLE_MAX_N + 1))):
        m = len(n)
        mu = rng.uniform(0, 1, m)
        mu[:20], mu[20:40] = 0.0, 1.0
        kappa = np.exp(rng.uniform(-3, 8, m))
        a, b = mu * kappa + 1e-6, (1 - mu) * kappa + 1e-6
        for level in (0.5, 0.9, 0.99):
            lo, hi = beta_binomial_interval(n, a, b, level)
            tail = (1 - level) / 2
            dist = betabinom(n, a, b)
            np.testing.assert_array_equal(lo, dist.ppf(tail))
            np.testing.assert_array_equal(hi, dist.ppf(1 - tail))
