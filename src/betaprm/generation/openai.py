"""A client for OpenAI-compatible servers (vLLM ``serve``, SGLang, TGI, llama.cpp).

Standard library only (``urllib`` and a thread pool): one HTTP call per completion, so
every completion gets its exact generated-token count from ``usage.completion_tokens``
(the server's prefix cache makes the repeated prompt cheap). Calls run with bounded
concurrency; connection failures, timeouts, 429 and 5xx answers are retried with
exponential backoff; anything else fails at once with the server's own message.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .base import Completion, GenerationError, GenerationRequest
from .text import Sampling, TextFormat


class OpenAIGenerator:
    """``endpoint="chat"`` posts ``/chat/completions`` messages; prefilled continuation
    uses the ``continue_final_message`` extension of vLLM and SGLang. ``endpoint=
    "completions"`` posts a plain prompt to ``/completions`` (rendered with
    ``tokenizer``'s chat template when given): any server, prefill included."""

    def __init__(
        self,
        base_url: str,
        model: str,
        fmt: TextFormat | None = None,
        sampling: Sampling | None = None,
        endpoint: str = "chat",
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 1.0,
        tokenizer=None,
    ):
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be chat or completions, got {endpoint!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.fmt = fmt or TextFormat()
        self.sampling = sampling or Sampling()
        self.endpoint = endpoint
        self.api_key = api_key
        self.concurrency = max(1, concurrency)
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.tokenizer = tokenizer

    # ------------------------------------------------------------------ one call
    def _body(self, req: GenerationRequest, copy: int) -> tuple[str, dict]:
        s = self.sampling
        body = {"model": self.model, "n": 1, "max_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
        if s.top_k > 0:
            body["top_k"] = s.top_k  # vLLM/SGLang extension; OpenAI itself ignores it
        if req.seed is not None:
            body["seed"] = (req.seed * 1009 + copy) % 2**31  # servers take a 32-bit seed
        if self.endpoint == "chat":
            msgs, prefilled = self.fmt.messages(req.question, list(req.prefix))
            body["messages"] = msgs
            if prefilled:
                body["continue_final_message"] = True
                body["add_generation_prompt"] = False
            return "/chat/completions", body
        body["prompt"] = self.fmt.prompt_text(req.question, list(req.prefix), self.tokenizer)
        return "/completions", body

    def _post(self, path: str, body: dict) -> dict:
        url = self.base_url + path
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=self.timeout) as r:
                    raw = r.read()
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode(errors="replace")
                if e.code == 429 or e.code >= 500:
                    last = f"HTTP {e.code}: {detail}"
                    continue
                raise GenerationError(f"{url} refused the request with HTTP {e.code}: {detail} (check --model-name and the sampling settings)") from None
            except TimeoutError:
                last = f"no answer within {self.timeout:g} s"
                continue
            except urllib.error.URLError as e:
                if isinstance(e.reason, (TimeoutError, socket.timeout)):
                    last = f"no answer within {self.timeout:g} s"
                else:
                    last = f"cannot connect ({e.reason})"
                continue
            except (ConnectionError, OSError) as e:
                last = f"connection failed ({e})"
                continue
            try:
                return json.loads(raw)
            except ValueError:
                raise GenerationError(f"{url} answered with something that is not JSON: {raw[:200]!r}") from None
        raise GenerationError(
            f"{url}: {last} after {self.max_retries + 1} attempts. Is the server running and serving {self.model!r}? "
            f"(e.g. `vllm serve MODEL --port 8000`, then --base-url http://HOST:8000/v1)"
        )

    def _one(self, req: GenerationRequest, copy: int) -> Completion:
        path, body = self._body(req, copy)
        ans = self._post(path, body)
        try:
            choice = ans["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
            n_tokens = int(ans["usage"]["completion_tokens"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise GenerationError(
                f"{self.base_url}{path} answered without choices[0].{'message.content' if self.endpoint == 'chat' else 'text'} "
                f"or usage.completion_tokens: {json.dumps(ans)[:300]}"
            ) from None
        return Completion(self.fmt.split_steps(text or ""), n_tokens)

    # ------------------------------------------------------------------ protocol
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        jobs = [(i, j) for i, r in enumerate(requests) for j in range(r.n)]
        pool = ThreadPoolExecutor(self.concurrency)
        try:
            futures = [pool.submit(self._one, requests[i], j) for i, j in jobs]
            results = [f.result() for f in futures]
        finally:
            # On the first failure, calls not yet started are dropped instead of each
            # waiting out its own retries.
            pool.shutdown(wait=True, cancel_futures=True)
        out: list[list[Completion]] = [[] for _ in requests]
        for (i, _), c in zip(jobs, results):
            out[i].append(c)
        return out
