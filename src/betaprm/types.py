"""Value types shared by scoring, selection, ACA and the CLI; numpy only, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["StepScores", "Task"]


@dataclass
class StepScores:
    """The Beta belief at each step of one trace: float64 numpy arrays of shape (T,)."""

    mu: np.ndarray
    kappa: np.ndarray
    sigma: np.ndarray

    def __post_init__(self):
        self.mu = np.asarray(self.mu, dtype=np.float64)
        self.kappa = np.asarray(self.kappa, dtype=np.float64)
        if self.sigma is None:
            # clipped: a mean summed in floating point (the Bayes belief's) can pass 1 by an ulp
            self.sigma = np.sqrt(np.clip(self.mu * (1.0 - self.mu), 0.0, None) / (self.kappa + 1.0))
        self.sigma = np.asarray(self.sigma, dtype=np.float64)
        if not (self.mu.shape == self.kappa.shape == self.sigma.shape) or self.mu.ndim != 1:
            raise ValueError(
                f"mu, kappa, sigma must be 1-D of one length, got {self.mu.shape}, {self.kappa.shape}, "
                f"{self.sigma.shape}"
            )

    @classmethod
    def from_mu_kappa(cls, mu, kappa) -> StepScores:
        return cls(mu, kappa, None)

    def __len__(self) -> int:
        return len(self.mu)

    def to_dict(self) -> dict:
        return {"mu": self.mu.tolist(), "kappa": self.kappa.tolist(), "sigma": self.sigma.tolist()}


@dataclass
class Task:
    """One problem: ``handle`` is passed to the generator (the synthetic world's Problem)."""

    id: str
    question: str
    answer: Any = None
    handle: Any = None
    images: list[str] = field(default_factory=list)
    """Image paths of the problem: sent to vision-language policies and PRMs."""

    def trace(self, steps) -> tuple:
        """What a scorer takes for ``steps`` of this problem (with its images, if any)."""
        return (self.question, steps, self.images) if self.images else (self.question, steps)
