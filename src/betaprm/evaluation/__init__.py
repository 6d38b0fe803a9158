"""Evaluation: accuracy with bootstrap intervals, Best-of-N, verification, calibration, plots."""

from .metrics import bootstrap_ci, paired_bootstrap, within_problem_auroc

__all__ = ["bootstrap_ci", "paired_bootstrap", "within_problem_auroc"]
