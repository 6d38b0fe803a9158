"""betaprm: process reward models that report how reliable each step reward is."""

from .beta import beta_binomial_nll, beta_interval, beta_std, evidence_regularizer, soft_ce_loss
from .errors import BetaPRMInputError
from .formatting import TraceFormat, format_trace
from .model import BetaPRM, BetaPRMConfig
from .scoring import StepScores

__all__ = [
    "BetaPRM",
    "BetaPRMConfig",
    "BetaPRMInputError",
    "StepScores",
    "TraceFormat",
    "beta_binomial_nll",
    "beta_interval",
    "beta_std",
    "evidence_regularizer",
    "format_trace",
    "soft_ce_loss",
]
