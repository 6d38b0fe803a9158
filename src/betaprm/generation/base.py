"""The ``Generator`` protocol.

A generator continues a trace: given a question and the steps kept so far (possibly
none), it samples ``n`` continuations, each a list of new steps ending with the final
answer step, and reports how many tokens it generated for each (the prompt and the kept
prefix excluded, as in the paper's token accounting). The chain-arithmetic policy
(``betaprm.synth``) implements it; so do the model backends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class GenerationError(RuntimeError):
    """A generation backend could not produce completions (server down, bad answers,
    missing package or GPU). The CLI reports it in one line, exit status 1."""


@dataclass
class GenerationRequest:
    """Continue ``prefix`` (steps already kept) for ``question``, ``n`` times."""

    question: str
    prefix: list[str] = field(default_factory=list)
    n: int = 1
    problem: Any = None
    """Backend-specific handle on the problem (the synthetic world passes its Problem,
    whose hidden values its policy knows); text backends ignore it."""
    seed: int | None = None
    """Sampling seed for this request (backends that support it): makes a resumed run
    draw what the uninterrupted run drew."""
    images: list[str] = field(default_factory=list)
    """Image paths of the problem, for vision-language policies (the OpenAI-compatible
    backend sends them as image_url parts); a backend that cannot send them refuses."""
    max_steps: int | None = None
    """Stop after this many new steps (step-level search asks for 1); None: to the final
    answer. A backend that cannot stop there returns whole completions (``finished`` None)
    and the caller keeps the first steps."""


@dataclass
class Completion:
    """New steps after the prefix (the last one holds the final answer)."""

    steps: list[str]
    n_tokens: int
    finished: bool | None = None
    """Whether the last step is the final answer; None: the backend did not say (a whole
    completion, which always ends with the answer)."""
    step_tokens: list[int] | None = None
    """Generated tokens of each step (summing to ``n_tokens``), where the backend knows them;
    None: ``step_token_split`` apportions ``n_tokens`` by the steps' lengths."""


def step_token_split(c: Completion) -> list[int]:
    """Each step's generated tokens: the backend's own count, else ``n_tokens`` shared out in
    proportion to the steps' characters (a step break included), summing to ``n_tokens``."""
    if c.step_tokens is not None:
        return list(c.step_tokens)
    if not c.steps:
        return []
    sizes = [len(s) + 1 for s in c.steps]
    bounds = [round(c.n_tokens * sum(sizes[: i + 1]) / sum(sizes)) for i in range(len(sizes))]
    return [b - a for a, b in zip([0, *bounds[:-1]], bounds)]


@runtime_checkable
class Generator(Protocol):
    """A backend may set ``takes_images`` (True only where requests with images can be
    sent to its policy; absent means False): callers refuse problems with images before
    generating otherwise."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """One list of ``request.n`` completions per request, in order."""
        ...
