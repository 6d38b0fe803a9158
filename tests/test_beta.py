"""The Beta-Binomial math against scipy and against a 40-digit mpmath reference."""

import itertools

import mpmath
import numpy as np
import pytest
import torch
from scipy.stats import beta as scipy_beta
from scipy.stats import betabinom

from betaprm.beta import (
    beta_binomial_nll,
    beta_interval,
    beta_std,
    evidence_regularizer,
    soft_ce_loss,
)

KAPPAS = [1e-3, 1e-2, 0.1, 1.0, 4.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
MUS = [1e-6, 1e-3, 0.1, 0.5, 0.9, 0.999, 1 - 1e-6]
NS = [1, 2, 7, 16, 64]
EPS = 1e-6


def _grid():
    rows = []
    for kappa, mu, n in itertools.product(KAPPAS, MUS, NS):
        for k in sorted({0, 1, n // 2, n - 1, n}):
            rows.append((mu, kappa, k, n))
    return np.array(rows, dtype=np.float64)


GRID = _grid()


def _exact_nll(mu, kappa, k, n, eps=EPS):
    mpmath.mp.dps = 40
    a = mpmath.mpf(mu) * mpmath.mpf(kappa) + mpmath.mpf(eps)
    b = (1 - mpmath.mpf(mu)) * mpmath.mpf(kappa) + mpmath.mpf(eps)
    log_p = (
        mpmath.loggamma(n + 1)
        - mpmath.loggamma(k + 1)
        - mpmath.loggamma(n - k + 1)
        + mpmath.log(mpmath.beta(k + a, n - k + b))
        - mpmath.log(mpmath.beta(a, b))
    )
    return float(-log_p)


@pytest.fixture(scope="module")
def exact():
    return np.array([_exact_nll(*row) for row in GRID])


def _ours(dtype=torch.float64, grid=GRID):
    g = torch.tensor(grid, dtype=dtype)
    return beta_binomial_nll(g[:, 0], g[:, 1], g[:, 2], g[:, 3], eps=EPS)


def test_grid_covers_the_extremes():
    assert GRID[:, 1].min() == 1e-3 and GRID[:, 1].max() == 1e6
    assert GRID[:, 0].min() == 1e-6 and GRID[:, 0].max() == 1 - 1e-6
    assert (GRID[:, 2] == 0).any() and (GRID[:, 2] == GRID[:, 3]).any()
    assert GRID[:, 3].min() == 1 and GRID[:, 3].max() == 64


def test_nll_matches_scipy_betabinom(exact):
    mu, kappa, k, n = GRID.T
    ref = -betabinom.logpmf(k, n, mu * kappa + EPS, (1 - mu) * kappa + EPS)
    ours = _ours().numpy()
    # scipy's betaln loses precision when kappa is huge and (1-mu)*kappa ~ 1 (it is off
    # by up to 2.4e-4 relative there, against 40-digit arithmetic). Compare with scipy
    # wherever scipy itself is right to 1e-7; the next test covers every point exactly.
    scipy_ok = np.abs(ref - exact) <= 1e-7 * np.abs(exact)
    assert scipy_ok.mean() > 0.97, f"scipy unreliable on {np.sum(~scipy_ok)} points"
    np.testing.assert_allclose(ours[scipy_ok], ref[scipy_ok], rtol=1e-5, atol=0)


def test_nll_matches_exact_arithmetic_everywhere(exact):
    np.testing.assert_allclose(_ours().numpy(), exact, rtol=1e-6, atol=0)


def test_nll_without_eps_matches_scipy():
    mu, kappa, k, n = 0.3, 2.5, 3.0, 9.0
    ref = -betabinom.logpmf(k, n, mu * kappa, (1 - mu) * kappa)
    got = beta_binomial_nll(torch.tensor(mu, dtype=torch.float64), kappa, k, n, eps=0.0)
    assert got.item() == pytest.approx(ref, rel=1e-12)


def test_float32_and_bf16_are_upcast_and_accurate():
    # Compare with float64 on the float32-rounded inputs: the error measured is the
    # algorithm's, not the rounding of mu = 1 - 1e-6 to float32.
    g32 = torch.tensor(GRID, dtype=torch.float32)
    got = beta_binomial_nll(g32[:, 0], g32[:, 1], g32[:, 2], g32[:, 3])
    ref = beta_binomial_nll(*(g32.double()[:, i] for i in range(4)))
    assert got.dtype == torch.float32
    err = (got.double() - ref).abs() / ref.abs().clamp_min(1.0)
    assert err.max().item() < 1e-4
    bf = beta_binomial_nll(torch.tensor([0.5], dtype=torch.bfloat16), torch.tensor([4.0], dtype=torch.bfloat16), 3, 8)
    assert bf.dtype == torch.float32
    assert beta_std(torch.tensor([0.5], dtype=torch.bfloat16), 3.0).dtype == torch.float32


def test_fractional_counts_follow_the_gamma_form():
    # Soft labels expressed as counts (k = 4.8 of 16) use the continuous extension.
    mpmath.mp.dps = 40
    got = beta_binomial_nll(torch.tensor(0.3, dtype=torch.float64), 7.0, 4.8, 16.0)
    assert got.item() == pytest.approx(_exact_nll(0.3, 7.0, 4.8, 16.0), rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_finite_on_grid(dtype):
    g = torch.tensor(GRID, dtype=dtype)
    mu = g[:, 0].clone().requires_grad_(True)
    kappa = g[:, 1].clone().requires_grad_(True)
    loss = beta_binomial_nll(mu, kappa, g[:, 2], g[:, 3]) + evidence_regularizer(mu, kappa, g[:, 2], g[:, 3])
    loss.sum().backward()
    assert torch.isfinite(loss).all()
    assert torch.isfinite(mu.grad).all() and torch.isfinite(kappa.grad).all()
    mu2 = g[:, 0].clone().requires_grad_(True)
    soft_ce_loss(mu2, g[:, 2], g[:, 3]).sum().backward()
    assert torch.isfinite(mu2.grad).all()


def test_regularizer_gives_zero_gradient_to_mu():
    mu = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, requires_grad=True)
    kappa = torch.tensor([2.0, 10.0, 50.0], dtype=torch.float64, requires_grad=True)
    k, n = torch.tensor([3.0, 8.0, 1.0]), torch.tensor([16.0, 16.0, 16.0])
    reg = evidence_regularizer(mu, kappa, k, n)
    g_mu, g_kappa = torch.autograd.grad(reg.sum(), (mu, kappa), allow_unused=True)
    assert g_mu is None or torch.count_nonzero(g_mu) == 0
    # ...while it does move kappa, by exactly |mu - k/n|.
    torch.testing.assert_close(g_kappa, (mu.detach() - k / n).abs())
    # And adding it to the NLL leaves the mu-gradient bit-identical.
    nll = beta_binomial_nll(mu, kappa, k, n)
    (g_nll,) = torch.autograd.grad(nll.sum(), mu, retain_graph=True)
    (g_both,) = torch.autograd.grad((nll + 0.05 * reg).sum(), mu)
    assert torch.equal(g_nll, g_both)


def test_gradcheck_float64():
    torch.manual_seed(0)
    mu = torch.rand(12, dtype=torch.float64).clamp(0.05, 0.95).requires_grad_(True)
    kappa = (torch.rand(12, dtype=torch.float64) * 30 + 0.5).requires_grad_(True)
    # Include arguments on both sides of the Stirling switch (alpha, beta < and > 10).
    kappa.data[:4] *= 100
    k = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 0, 16], dtype=torch.float64)
    n = torch.tensor([8, 8, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda m, c: beta_binomial_nll(m, c, k, n), (mu, kappa))
    # The regulariser is checked in kappa only: its mu-gradient is zero by design
    # (stop-gradient), which finite differences cannot see.
    assert torch.autograd.gradcheck(lambda c: evidence_regularizer(mu.detach(), c, k, n), (kappa,))
    assert torch.autograd.gradcheck(lambda m: soft_ce_loss(m, k, n), (mu,))
    assert torch.autograd.gradcheck(beta_std, (mu, kappa))


def test_soft_ce_is_the_bernoulli_cross_entropy():
    got = soft_ce_loss(torch.tensor([0.8]), torch.tensor([3.0]), torch.tensor([4.0]))
    assert got.item() == pytest.approx(-(0.75 * np.log(0.8) + 0.25 * np.log(0.2)), rel=1e-6)
    # Saturated predictions stay finite.
    assert torch.isfinite(soft_ce_loss(torch.tensor([0.0, 1.0]), 1.0, 2.0)).all()


def test_beta_std_and_interval_match_scipy():
    mu = np.array([0.1, 0.5, 0.93])
    kappa = np.array([0.5, 4.0, 300.0])
    std = beta_std(torch.tensor(mu, dtype=torch.float64), torch.tensor(kappa, dtype=torch.float64))
    np.testing.assert_allclose(std.numpy(), scipy_beta.std(mu * kappa, (1 - mu) * kappa), rtol=1e-12)
    lo, hi = beta_interval(mu, kappa, level=0.9, eps=0.0)
    np.testing.assert_allclose(lo, scipy_beta.ppf(0.05, mu * kappa, (1 - mu) * kappa))
    np.testing.assert_allclose(hi, scipy_beta.ppf(0.95, mu * kappa, (1 - mu) * kappa))
    assert np.all(lo < mu) and np.all(mu < hi)
    with pytest.raises(ValueError, match="level"):
        beta_interval(mu, kappa, level=1.5)
