"""Final answers of text traces, and checking them against a reference with math-verify.

``check`` returns True or False when the comparison ran, and None when it could not
(math-verify raised, timed out, or could not read the reference): callers count those
as failed checks, never as wrong answers. A trace that states no answer at all is
wrong (False), not a failed check.

Checks run in a few worker processes, never in this one: math-verify can spend minutes
inside sympy on one adversarial answer (``\\sin(10^{10^{6}})``), where neither its own
signal-based timeouts nor a thread can stop it. A check still running after
``timeout`` seconds gets its worker killed (and replaced) and counts as failed. Workers
take pairs in batches and answer one check at a time, so thousands of quick checks cost
a few process starts, not one each. They are plain ``python`` processes running this
file, not ``multiprocessing`` children: those re-import the main module, and importing
betaprm brings torch.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait
from pathlib import Path

from .errors import BetaPRMInputError
from .generation.base import GenerationError
from .generation.openai import OpenAIGenerator
from .generation.text import bare_answer, extract_answer, final_answer

__all__ = ["AnswerChecker", "LLMJudge", "bare_answer", "extract_answer", "final_answer"]

# Runs answer_worker.py (a plain script: not the betaprm package, whose import brings torch).
# The first sys.path entry is the working directory, where a stray file could shadow a module.
_BOOT = "import runpy, sys\nif sys.path and sys.path[0] == '': del sys.path[0]\nrunpy.run_path(sys.argv[1])['main']()"
WORKER_FILE = str(Path(__file__).with_name("answer_worker.py"))
_START_TIMEOUT = 120.0  # seconds a worker may take to import math-verify
_BATCH = (16, 64)  # pairs per batch sent to a worker: at least, at most


class _Worker:
    """One check process and the checks sent to it, not yet answered (in order)."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, WORKER_FILE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.ready = False
        self.held: deque = deque()
        self.since = time.monotonic()  # when its current check (or its start) began
        self._buf = b""

    def send(self, batch: list) -> None:
        self.held.extend(batch)
        self.since = time.monotonic()
        self.proc.stdin.write(json.dumps(batch).encode() + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> list | None:
        """The messages that have arrived (call when readable); None when it died."""
        data = os.read(self.proc.stdout.fileno(), 1 << 16)
        if not data:
            return None
        *lines, self._buf = (self._buf + data).split(b"\n")
        return [json.loads(line) for line in lines]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _kill_all(pool: list) -> None:
    while pool:
        pool.pop().kill()


class AnswerChecker:
    """Answer checking in worker processes, with a hard time bound per check (see the
    module's docstring). Thread-safe; ``close()`` (or ``with``) stops the workers, which
    are stopped at exit in any case."""

    def __init__(self, timeout: float = 10.0, workers: int = 4):
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            # NaN would never expire (no kill), and 0 would fail every check.
            raise BetaPRMInputError(f"--check-timeout must be a number of seconds > 0, got {timeout!r}")
        self.timeout = timeout
        self.workers = max(1, workers)
        self.failed = 0
        self.workers_started = 0  # worker processes started so far (replacements included)
        self._pool: list[_Worker] = []
        self._lock = threading.Lock()
        self._close = weakref.finalize(self, _kill_all, self._pool)  # also runs at exit

    def close(self) -> None:
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def check_many(self, pairs: Sequence[tuple[object, str | None]]) -> list[bool | None]:
        """``(gold, predicted answer)`` pairs -> True / False / None (check failed)."""
        out: list[bool | None] = [False] * len(pairs)  # no stated answer: wrong
        todo = []
        for i, (g, p) in enumerate(pairs):
            if g is None:
                out[i] = None
            elif p is not None:
                todo.append([i, str(g), str(p)])
        with self._lock:
            if todo:
                if not self._close.alive:  # used again after close(): stop the new workers at exit too
                    self._close = weakref.finalize(self, _kill_all, self._pool)
                try:
                    self._run(deque(todo), out)
                except BaseException:
                    # Interrupted (or broken): workers may be busy with checks nobody awaits.
                    _kill_all(self._pool)
                    raise
            self.failed += sum(r is None for r in out)
        return out

    def check(self, gold, pred: str | None) -> bool | None:
        return self.check_many([(gold, pred)])[0]

    def _run(self, queue: deque, out: list) -> None:
        size = max(_BATCH[0], min(_BATCH[1], -(-len(queue) // self.workers)))
        pool = self._pool
        while queue or any(w.held for w in pool):
            idle = [w for w in pool if not w.held]
            while len(pool) < self.workers and len(idle) * size < len(queue):
                pool.append(_Worker())
                idle.append(pool[-1])
                self.workers_started += 1
            for w in idle:
                if w.ready and queue:
                    batch = [queue.popleft() for _ in range(min(size, len(queue)))]
                    try:
                        w.send(batch)
                    except OSError:  # it died while idle: its checks go back to the queue
                        w.held.clear()
                        queue.extendleft(reversed(batch))
                        self._drop(w, queue, out)
            # Wait for answers, until the earliest deadline of a check (or a start).
            now = time.monotonic()
            limits = [
                w.since + (self.timeout if w.ready else _START_TIMEOUT) - now for w in pool if w.held or not w.ready
            ]
            if not limits:
                continue
            readable = wait([w.proc.stdout for w in pool], timeout=max(0.0, min(limits)))
            for w in [w for w in pool if w.proc.stdout in readable]:
                msgs = w.receive()
                if msgs is None:  # it crashed: the check it was running fails
                    self._drop(w, queue, out)
                    continue
                for m in msgs:
                    if m == "ready":
                        w.ready = True
                    elif isinstance(m, dict):
                        raise RuntimeError(f"answer checks cannot run: {m['error']}")
                    else:
                        i, verdict = m
                        assert w.held[0][0] == i, "a worker answered out of order"
                        w.held.popleft()
                        out[i] = verdict
                    w.since = time.monotonic()
            now = time.monotonic()
            for w in list(pool):
                if (w.held or not w.ready) and now - w.since > (self.timeout if w.ready else _START_TIMEOUT):
                    self._drop(w, queue, out)  # a check past its time: killed, counted as failed

    def _drop(self, w: _Worker, queue: deque, out: list) -> None:
        """Kill ``w``: the check it was running fails (None), the rest of its batch goes
        back to the front of the queue."""
        if not w.ready:
            _kill_all(self._pool)
            raise RuntimeError(
                f"an answer-check worker ({sys.executable} running {WORKER_FILE}) did not start within "
                f"{_START_TIMEOUT:g} s or exited at start"
            )
        w.kill()
        self._pool.remove(w)
        if w.held:
            out[w.held.popleft()[0]] = None
            queue.extendleft(reversed(w.held))


class LLMJudge:
    """Answer equivalence judged by a model behind an OpenAI-compatible server.

    The judge sees the reference and the extracted final answer (and the question with
    ``with_question``: the paper's authors' judge reads it, which helps with answers whose
    meaning depends on it, such as an option letter or a unit) and must reply yes or no;
    any other reply, and any call that fails after the client's retries, is a failed check
    (None), counted in ``failed``, never a wrong answer."""

    PROMPT = (
        "Reference answer: {gold}\nCandidate answer: {pred}\n"
        "Are the two answers mathematically equivalent? Reply with exactly one word: yes or no."
    )
    PROMPT_WITH_QUESTION = (
        "Question: {question}\nReference answer: {gold}\nCandidate answer: {pred}\n"
        "Is the candidate answer to the question the same as the reference answer, mathematically or in meaning "
        "(ignore formatting such as LaTeX or \\boxed)? Reply with exactly one word: yes or no."
    )

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        max_retries: int = 2,
        with_question: bool = False,
    ):
        self.with_question = with_question
        # The key goes only where it is given (the CLI reads it from --api-key-env);
        # a judge that redirects is refused, never followed (BetaPRMInputError).
        self.client = OpenAIGenerator(
            base_url,
            model,
            api_key=api_key,
            concurrency=concurrency,
            timeout=timeout,
            max_retries=max_retries,
            url_flag="--judge-url",
            model_flag="--judge-model",
        )
        self.concurrency = concurrency
        self.failed = 0

    def close(self) -> None:
        """Nothing to stop (each call closes its connection); here so that callers can
        close either checker alike."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def prompt(self, gold, pred, question: str | None = None) -> str:
        """The text the judge is sent for one check."""
        if self.with_question:
            return self.PROMPT_WITH_QUESTION.format(question=question, gold=gold, pred=pred)
        return self.PROMPT.format(gold=gold, pred=pred)

    def _one(self, gold, pred, question: str | None = None) -> bool | None:
        body = {
            "model": self.client.model,
            "messages": [{"role": "user", "content": self.prompt(gold, pred, question)}],
            "max_tokens": 4,
            "temperature": 0.0,
        }
        try:
            ans = self.client.post_json("/chat/completions", body)
            word = ans["choices"][0]["message"]["content"].strip().lower()
        except (GenerationError, KeyError, IndexError, TypeError, AttributeError):
            return None
        word = word.split()[0].strip(".!,") if word else ""
        return True if word == "yes" else False if word == "no" else None

    def check_many(
        self, pairs: Sequence[tuple[object, str | None]], questions: Sequence[str] | None = None
    ) -> list[bool | None]:
        """``(gold, predicted answer)`` pairs -> True / False / None (check failed);
        ``questions``, one per pair, are what a ``with_question`` judge reads."""
        if self.with_question and (questions is None or len(questions) != len(pairs)):
            raise ValueError("a judge with_question needs one question per pair")
        out: list[bool | None] = [False] * len(pairs)
        todo = [i for i, (g, p) in enumerate(pairs) if g is not None and p is not None]
        for i, (g, _) in enumerate(pairs):
            if g is None:
                out[i] = None

        def ask(i):
            return self._one(*pairs[i], questions[i] if questions is not None else None)

        with ThreadPoolExecutor(self.concurrency) as pool:
            for i, v in zip(todo, pool.map(ask, todo)):
                out[i] = v
        self.failed += sum(r is None for r in out)
        return out
