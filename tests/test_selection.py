"""Selectors on hand-computed pools."""

import subprocess
import sys

import numpy as np
import pytest

from betaprm.scoring import StepScores
from betaprm.selection import (
    candidate_scores,
    majority_vote,
    select,
    sigma_threshold,
    tune,
    weighted_vote,
)


def S(mu, sigma):
    return StepScores(np.array(mu, float), np.ones(len(mu)), np.array(sigma, float))


# Three candidates:
#   A: mu (0.9, 0.5)       sigma (0.1, 0.3)
#   B: mu (0.8, 0.8, 0.8)  sigma (0.2, 0.2, 0.2)
#   C: mu (0.6, 0.95)      sigma (0.05, 0.05)
POOL = [S([0.9, 0.5], [0.1, 0.3]), S([0.8, 0.8, 0.8], [0.2, 0.2, 0.2]), S([0.6, 0.95], [0.05, 0.05])]


def test_mean_min_last_prod():
    np.testing.assert_allclose(candidate_scores(POOL, "mean"), [0.7, 0.8, 0.775])
    np.testing.assert_allclose(candidate_scores(POOL, "min"), [0.5, 0.8, 0.6])
    np.testing.assert_allclose(candidate_scores(POOL, "last"), [0.5, 0.8, 0.95])
    np.testing.assert_allclose(candidate_scores(POOL, "prod"), [0.45, 0.512, 0.57])
    assert select(POOL, "mean") == 1 and select(POOL, "min") == 1
    assert select(POOL, "last") == 2 and select(POOL, "prod") == 2


def test_s_lin():
    # A: ((0.9-0.1)+(0.5-0.3))/2 = 0.5 (lam=1); B: 0.6; C: ((0.55)+(0.9))/2 = 0.725
    np.testing.assert_allclose(candidate_scores(POOL, "lin", lam=1.0), [0.5, 0.6, 0.725])
    # lam = 0.5: A 0.6, B 0.7, C 0.75
    np.testing.assert_allclose(candidate_scores(POOL, "lin", lam=0.5), [0.6, 0.7, 0.75])
    assert select(POOL, "lin", lam=0.0) == 1  # reduces to mean
    assert select(POOL, "lin", lam=1.0) == 2


def test_s_rb_with_percentile_tau():
    # Step sigmas: 0.1 0.3 0.2 0.2 0.2 0.05 0.05 -> sorted .05 .05 .1 .2 .2 .2 .3
    # numpy's linear quantile at q=0.5 is the 4th value, 0.2; at q=0.9: 0.2 + 0.4*0.1 = 0.24
    assert sigma_threshold([POOL], 0.5) == pytest.approx(0.2)
    tau = sigma_threshold([POOL], 0.9)
    assert tau == pytest.approx(0.24)
    # Fraction of steps with sigma > 0.24: A 1/2, B 0, C 0.
    np.testing.assert_allclose(candidate_scores(POOL, "rb", lam=0.2, tau=tau), [0.6, 0.8, 0.775])
    # tau = 0.15: A 1/2 (0.3), B 3/3, C 0 -> lam=0.2: 0.6, 0.6, 0.775
    np.testing.assert_allclose(candidate_scores(POOL, "rb", lam=0.2, tau=0.15), [0.6, 0.6, 0.775])
    assert select(POOL, "rb", lam=0.2, tau=0.15) == 2
    with pytest.raises(ValueError, match="needs tau"):
        candidate_scores(POOL, "rb")


def test_ties_go_to_lowest_index_and_errors():
    tied = [S([0.5], [0.1]), S([0.5], [0.1])]
    assert select(tied) == 0
    with pytest.raises(ValueError, match="unknown selection method"):
        select(POOL, "median")
    with pytest.raises(ValueError, match="empty pool"):
        select([])


def test_majority_vote():
    assert majority_vote(["4", "5", "5", "4", "5"]) == 1  # "5" wins, first carrier is 1
    assert majority_vote(["4", "5", "5", "4"]) == 0  # tie: the answer seen first
    assert majority_vote([None, "7", None]) == 1  # None abstains
    assert majority_vote([None, None]) is None


def test_weighted_vote():
    answers = ["4", "5", "5", "4", "6"]
    weights = [0.9, 0.3, 0.4, 0.2, 1.0]
    # totals: "4" 1.1, "5" 0.7, "6" 1.0 -> "4"; its best member is index 0 (0.9)
    assert weighted_vote(answers, weights) == 0
    # Re-weighting flips it: "5" 1.5 vs "4" 0.3 -> best member of "5" is index 2 (0.9)
    assert weighted_vote(answers, [0.1, 0.6, 0.9, 0.2, 1.0]) == 2
    with pytest.raises(ValueError, match="5 answers but 2 weights"):
        weighted_vote(answers, [1, 2])


def test_tune_picks_from_the_paper_grid_on_validation():
    # Problem 1: mean picks candidate 0 (wrong: high mu but uncertain); candidate 1 is
    # right with lower mu and low sigma. Problem 2: the confident candidate is right.
    p1 = [S([0.9, 0.9], [0.3, 0.5]), S([0.7, 0.7], [0.05, 0.05])]
    p2 = [S([0.8, 0.8], [0.05, 0.05]), S([0.6, 0.6], [0.3, 0.5])]
    pools, correct = [p1, p2], [[False, True], [True, False]]
    assert tune(pools, correct, method="mean").val_accuracy == 0.5
    # Sigmas sorted: .05 x4, .3, .3, .5, .5. q=0.7 -> tau = 0.3 (linear quantile), so
    # only the 0.5 steps exceed it: S_RB(p1 c0) = 0.9 - lam/2 beats 0.7 unless lam > 0.4.
    # Grid order is lambda-major, so (0.2, *) fail and (0.5, 0.7) is the first to win.
    res = tune(pools, correct, method="rb")
    assert (res.lam, res.q, res.val_accuracy) == (0.5, 0.7, 1.0)
    assert res.tau == pytest.approx(0.3)
    assert [res.select(p) for p in pools] == [1, 0]
    # S_lin: 0.9 - 0.4 lam vs 0.7 - 0.05 lam needs lam > 4/7 -> 0.7 is the first.
    lin = tune(pools, correct, method="lin")
    assert (lin.lam, lin.val_accuracy) == (0.7, 1.0)
    with pytest.raises(ValueError, match="2 scored candidates but 1"):
        tune(pools, [[True], [True, False]])


def test_selection_and_aca_import_without_torch():
    """Selection and ACA work on numpy value types (betaprm.types): importing them must not
    load torch."""
    code = "import betaprm.selection, betaprm.aca, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_value_types_are_reexported():
    import betaprm
    import betaprm.aca
    import betaprm.scoring
    import betaprm.types

    assert betaprm.scoring.StepScores is betaprm.types.StepScores is betaprm.StepScores is StepScores
    assert betaprm.aca.Task is betaprm.types.Task
