"""Step rewards for search code, with search-and-learn's PRM interface.

``StepRewards(prm=...)`` scores in this process; ``StepRewards(url=...)`` asks a
``betaprm serve`` server. ``score(questions, outputs)`` takes, per question, a list of
completions (text), cuts each into steps at ``separator`` and returns, per question and
completion, one reward per step: ``mu`` (``value="mu"``) or the reliability-aware
``mu - lam * sigma`` (``value="lin"``). Local and remote give the same numbers: the
server scores with the same code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .errors import BetaPRMInputError, redact_url
from .generation.base import GenerationError
from .generation.openai import MAX_RESPONSE_BYTES, http_post
from .options import DEFAULT_MAX_BATCH_TOKENS

__all__ = ["StepRewards"]


class StepRewards:
    def __init__(
        self,
        prm=None,
        url: str | None = None,
        separator: str = "\n\n",
        value: str = "mu",
        lam: float = 0.5,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_batch_tokens: int | None = None,
    ):
        if (prm is None) == (url is None):
            raise BetaPRMInputError("give a local prm= or a server url=, not both and not neither")
        if value not in ("mu", "lin"):
            raise BetaPRMInputError(f"value must be 'mu' or 'lin' (mu - lam * sigma), got {value!r}")
        if not separator:
            raise BetaPRMInputError("separator must not be empty")
        self.prm, self.url = prm, url.rstrip("/") if url else None
        self.separator, self.value, self.lam = separator, value, lam
        self.api_key, self.timeout, self.max_batch_tokens = api_key, timeout, max_batch_tokens

    def steps(self, completion: str) -> list[str]:
        return [s.strip() for s in completion.split(self.separator) if s.strip()]

    def _scores(self, traces: list[tuple[str, list[str]]]) -> list[tuple[list[float], list[float]]]:
        """(mu, sigma) per trace."""
        if self.prm is not None:
            from .scoring import score_traces

            out = score_traces(self.prm, traces, max_batch_tokens=self.max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS)
            return [(s.mu.tolist(), s.sigma.tolist()) for s in out]

        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = json.dumps({"items": [{"question": q, "steps": s} for q, s in traces]}).encode()
        try:
            status, _, raw = http_post(self.url + "/v1/score", body, headers, self.timeout, MAX_RESPONSE_BYTES)
        except TimeoutError:
            raise GenerationError(f"{redact_url(self.url)}/v1/score: no answer within {self.timeout:g} s") from None
        except OSError as e:  # the socket's own message names no URL; this one names it without its password
            raise GenerationError(f"{redact_url(self.url)}/v1/score: cannot connect ({e})") from None
        if status != 200:
            raise GenerationError(
                f"{redact_url(self.url)}/v1/score answered {status}: {raw[:300].decode(errors='replace')}"
            )
        return [(r["mu"], r["sigma"]) for r in json.loads(raw)["results"]]

    def score(self, questions: Sequence[str], outputs: Sequence[Sequence[str]]) -> list[list[list[float]]]:
        if len(questions) != len(outputs):
            raise BetaPRMInputError(f"{len(questions)} questions but {len(outputs)} lists of outputs")
        traces, shape = [], []
        for q, outs in zip(questions, outputs):
            shape.append(len(outs))
            for o in outs:
                steps = self.steps(o)
                if not steps:
                    raise BetaPRMInputError(f"an output of question {q[:60]!r} has no step to score (empty text)")
                traces.append((q, steps))
        flat = self._scores(traces) if traces else []
        values = [mu if self.value == "mu" else [m - self.lam * s for m, s in zip(mu, sg)] for mu, sg in flat]
        out, k = [], 0
        for n in shape:
            out.append(values[k : k + n])
            k += n
        return out
