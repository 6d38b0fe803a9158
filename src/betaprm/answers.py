"""Final answers of text traces, and checking them against a reference with math-verify.

``check`` returns True or False when the comparison ran, and None when it could not
(math-verify raised, timed out, or could not read the reference): callers count those
as failed checks, never as wrong answers. A trace that states no answer at all is
wrong (False), not a failed check.

math-verify's own timeouts use signals, which only work in the main thread; here they
are switched off (``parsing_timeout=None, timeout_seconds=None``) and every check runs
in a worker thread whose result is awaited for at most ``timeout`` seconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:)?\s*[:=]?\s*(.+?)\s*\.?\s*$", re.IGNORECASE | re.DOTALL)


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = text.find("{", start)
        if i == -1:
            return None
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip()
            j += 1
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_answer(text: str) -> str | None:
    """The stated final answer of ``text``: the last ``\\boxed{}``, else an
    ``<answer>`` tag, else what follows "answer is"/"answer:" on the last line that has
    it; None when the text states no answer."""
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    for line in reversed(text.strip().splitlines()):
        m = _ANSWER_IS.search(line)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


def final_answer(steps: Sequence[str]) -> str | None:
    """The answer a trace ends with: from its last step, else from the whole text."""
    if not steps:
        return None
    return extract_answer(steps[-1]) or extract_answer("\n".join(steps))


def _verify(gold: str, pred: str) -> bool | None:
    import logging

    from math_verify import parse, verify

    # It warns on every call that its own timeout is off: we bound the time ourselves.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    g = parse(gold, parsing_timeout=None)
    if not g:
        g = parse(f"${gold}$", parsing_timeout=None)
    if not g:
        return None  # the reference itself cannot be read: a failed check
    p = parse(pred, parsing_timeout=None) or parse(f"${pred}$", parsing_timeout=None)
    if not p:
        return pred.strip() == gold.strip()
    return bool(verify(g, p, timeout_seconds=None))


class AnswerChecker:
    """Thread-safe answer checking with a time bound per check."""

    def __init__(self, timeout: float = 10.0, workers: int = 4):
        self.timeout = timeout
        self.workers = workers
        self.failed = 0

    def _safe(self, gold, pred):
        try:
            return _verify(str(gold), str(pred))
        except Exception:  # math-verify raising is a failed check, not a wrong answer
            return None

    def check_many(self, pairs: Sequence[tuple[object, str | None]]) -> list[bool | None]:
        """``(gold, predicted answer)`` pairs -> True / False / None (check failed)."""
        out: list[bool | None] = [False] * len(pairs)
        pool = ThreadPoolExecutor(self.workers)
        try:
            futs = {i: pool.submit(self._safe, g, p) for i, (g, p) in enumerate(pairs) if p is not None and g is not None}
            for i, (g, p) in enumerate(pairs):
                if g is None:
                    out[i] = None
                elif i in futs:
                    try:
                        out[i] = futs[i].result(timeout=self.timeout)
                    except FutureTimeout:
                        out[i] = None
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        self.failed += sum(r is None for r in out)
        return out

    def check(self, gold, pred: str | None) -> bool | None:
        return self.check_many([(gold, pred)])[0]


class LLMJudge:
    """Answer equivalence judged by a model behind an OpenAI-compatible server.

    The judge sees only the reference and the extracted final answer and must reply yes
    or no; any other reply, and any call that fails after the client's retries, is a
    failed check (None), counted in ``failed``, never a wrong answer."""

    PROMPT = (
        "Reference answer: {gold}\nCandidate answer: {pred}\n"
        "Are the two answers mathematically equivalent? Reply with exactly one word: yes or no."
    )

    def __init__(self, base_url: str, model: str, api_key: str | None = None, concurrency: int = 8, timeout: float = 60.0, max_retries: int = 2):
        from .generation.openai import OpenAIGenerator

        self.client = OpenAIGenerator(base_url, model, api_key=api_key, concurrency=concurrency, timeout=timeout, max_retries=max_retries)
        self.concurrency = concurrency
        self.failed = 0

    def _one(self, gold, pred) -> bool | None:
        from .generation.base import GenerationError

        body = {"model": self.client.model, "messages": [{"role": "user", "content": self.PROMPT.format(gold=gold, pred=pred)}], "max_tokens": 4, "temperature": 0.0}
        try:
            ans = self.client._post("/chat/completions", body)
            word = ans["choices"][0]["message"]["content"].strip().lower()
        except (GenerationError, KeyError, IndexError, TypeError, AttributeError):
            return None
        word = word.split()[0].strip(".!,") if word else ""
        return True if word == "yes" else False if word == "no" else None

    def check_many(self, pairs: Sequence[tuple[object, str | None]]) -> list[bool | None]:
        out: list[bool | None] = [False] * len(pairs)
        todo = [i for i, (g, p) in enumerate(pairs) if g is not None and p is not None]
        for i, (g, _) in enumerate(pairs):
            if g is None:
                out[i] = None
        with ThreadPoolExecutor(self.concurrency) as pool:
            for i, v in zip(todo, pool.map(lambda i: self._one(*pairs[i]), todo)):
                out[i] = v
        self.failed += sum(r is None for r in out)
        return out
