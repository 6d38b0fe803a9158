"""The Beta / Beta-Binomial math of BetaPRM, as pure tensor functions.

Conventions (shapes are elementwise-broadcast; nothing here knows about models):

- ``mu``    in [0, 1]: the Beta mean, the PRM's reward.
- ``kappa`` > 0      : the Beta concentration, ``alpha + beta``.
- ``k``, ``n``       : Monte Carlo counts, ``0 <= k <= n``, ``n >= 1``. ``k`` may be
  fractional (soft labels expressed as counts); the likelihood uses the Gamma-function
  form of the binomial coefficient, which is defined for real ``k``.

Every function computes in float64 when any tensor input is float64 and in float32
otherwise, so bf16/fp16 model outputs are upcast before the loss (the authors' code ran
the loss in bf16, where ``eps = 1e-6`` vanishes).
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "beta_binomial_nll",
    "evidence_regularizer",
    "soft_ce_loss",
    "beta_std",
    "beta_interval",
]

# Below this argument lgamma differences are computed directly; at and above it a
# Stirling series with the leading terms taken in closed form avoids the catastrophic
# cancellation of two huge lgamma values (kappa up to 1e6 and beyond).
_STIRLING_MIN = 10.0
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _compute_dtype(*xs) -> torch.dtype:
    for x in xs:
        if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
            return torch.float64
    return torch.float32


def _as(x, dtype, device) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.to(dtype=dtype, device=device)
    return torch.as_tensor(x, dtype=dtype, device=device)


def _device(*xs) -> torch.device:
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _upcast(*xs) -> list[torch.Tensor]:
    dtype, device = _compute_dtype(*xs), _device(*xs)
    return [_as(x, dtype, device) for x in xs]


def _stirling_tail(x: torch.Tensor) -> torch.Tensor:
    """lgamma(x) - [(x - 1/2) log x - x + log(2 pi)/2], accurate to ~1e-13 for x >= 10."""
    r = 1.0 / x
    r2 = r * r
    return r * (1.0 / 12 - r2 * (1.0 / 360 - r2 * (1.0 / 1260 - r2 / 1680)))


def _lgamma_ratio(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """log Gamma(x + k) - log Gamma(x) for x > 0, k >= 0, without cancellation.

    For large x the difference of two lgamma values of size ~x log x would lose all
    precision; the Stirling form rewrites it as
    ``(x - 1/2) log1p(k/x) + k log(x + k) - k + tail(x + k) - tail(x)``.
    """
    big = x >= _STIRLING_MIN
    # Each branch sees a safe argument so the unused branch never yields inf/NaN
    # gradients (torch.where differentiates both branches).
    xs = torch.where(big, x, torch.full_like(x, _STIRLING_MIN))
    xd = torch.where(big, torch.ones_like(x), x)
    stirling = (
        (xs - 0.5) * torch.log1p(k / xs) + k * torch.log(xs + k) - k + _stirling_tail(xs + k) - _stirling_tail(xs)
    )
    direct = torch.lgamma(xd + k) - torch.lgamma(xd)
    return torch.where(big, stirling, direct)


def beta_binomial_nll(mu, kappa, k, n, eps: float = 1e-6) -> torch.Tensor:
    """Per-element negative log-likelihood of ``k`` successes out of ``n`` under
    ``Beta-Binomial(n, alpha = mu*kappa + eps, beta = (1-mu)*kappa + eps)``.

    ``eps`` keeps both Beta parameters positive when ``mu`` saturates at 0 or 1 (the
    paper's 1e-6). Returns a tensor of the broadcast shape in the compute dtype.
    """
    mu, kappa, k, n = _upcast(mu, kappa, k, n)
    alpha = mu * kappa + eps
    beta = (1.0 - mu) * kappa + eps
    log_binom = torch.lgamma(n + 1.0) - torch.lgamma(k + 1.0) - torch.lgamma(n - k + 1.0)
    log_p = log_binom + _lgamma_ratio(alpha, k) + _lgamma_ratio(beta, n - k) - _lgamma_ratio(alpha + beta, n)
    return -log_p


def evidence_regularizer(mu, kappa, k, n) -> torch.Tensor:
    """Per-element ``|sg(mu) - k/n| * kappa`` (paper eq. for L_reg, without lambda_reg).

    The stop-gradient on ``mu`` means this term only moves ``kappa``: it discourages
    confidence where the mean disagrees with the count and never pulls ``mu`` toward
    the noisy ratio ``k/n``.
    """
    mu, kappa, k, n = _upcast(mu, kappa, k, n)
    return (mu.detach() - k / n).abs() * kappa


def soft_ce_loss(mu, k, n, eps: float = 1e-6) -> torch.Tensor:
    """Per-element cross-entropy of ``mu`` against the soft label ``k/n``: the
    standard PRM objective. ``mu`` is clamped to ``[eps, 1-eps]`` so saturated
    predictions give a finite loss."""
    mu, k, n = _upcast(mu, k, n)
    q = k / n
    mu = mu.clamp(eps, 1.0 - eps)
    return -(q * torch.log(mu) + (1.0 - q) * torch.log1p(-mu))


def beta_std(mu, kappa) -> torch.Tensor:
    """Standard deviation of Beta(mu*kappa, (1-mu)*kappa): sqrt(mu(1-mu)/(kappa+1))."""
    mu, kappa = _upcast(mu, kappa)
    return torch.sqrt(mu * (1.0 - mu) / (kappa + 1.0))


def beta_interval(mu, kappa, level: float = 0.9, eps: float = 1e-6):
    """Equal-tailed credible interval of Beta(mu*kappa + eps, (1-mu)*kappa + eps).

    Accepts numpy arrays, tensors or floats; returns ``(lo, hi)`` as float64 numpy
    arrays of the broadcast shape. ``level`` is the central probability mass.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    from scipy.stats import beta as beta_dist

    mu = np.asarray(mu.detach().cpu() if isinstance(mu, torch.Tensor) else mu, dtype=np.float64)
    kappa = np.asarray(kappa.detach().cpu() if isinstance(kappa, torch.Tensor) else kappa, dtype=np.float64)
    a = mu * kappa + eps
    b = (1.0 - mu) * kappa + eps
    tail = (1.0 - level) / 2.0
    return beta_dist.ppf(tail, a, b), beta_dist.ppf(1.0 - tail, a, b)
