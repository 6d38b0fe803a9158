"""betaprm: process reward models that report how reliable each step reward is.

The torch-free names (``StepScores``, ``TraceFormat``, ...) are imported here; the model
and the Beta losses are imported on first use, so ``import betaprm.selection`` (or ACA,
or the CLI's argument parsing) does not load torch.
"""

import importlib

from .errors import BetaPRMInputError
from .formatting import TraceFormat, format_trace
from .types import StepScores

_LAZY = {
    "BetaPRM": "model",
    "BetaPRMConfig": "model",
    "beta_binomial_nll": "beta",
    "beta_interval": "beta",
    "beta_std": "beta",
    "evidence_regularizer": "beta",
    "soft_ce_loss": "beta",
}

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


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
