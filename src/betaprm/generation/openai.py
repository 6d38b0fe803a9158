"""A client for OpenAI-compatible servers (vLLM ``serve``, SGLang, TGI, llama.cpp).

Standard library only (``http.client`` and a thread pool): one HTTP call per completion,
so every completion gets its exact generated-token count from ``usage.completion_tokens``
(the server's prefix cache makes the repeated prompt cheap). Calls run with bounded
concurrency; connection failures, timeouts, 429 and 5xx answers are retried with
exponential backoff; anything else fails at once with the server's own message.

Each call is bounded as a whole: ``timeout`` covers connecting, sending and every read
(a server that drips a byte at a time cannot stretch it), and an answer larger than
``max_response_bytes`` is refused. Redirects are never followed: the request, and the
API key with it, would go to an address nobody gave.

Several servers of one model (replicas: ``base_url`` a list, or URLs separated by commas)
share the calls: each goes to the replica with the fewest calls in flight, a call that fails
on one (the failures above that are retried) goes to another at once, and replicas that keep
failing are set aside for a while (``betaprm.generation.replicas``). A call fails only when
it has failed on every replica, after ``max_retries`` rounds of retries. The request body, its seed included, is
the same on every replica, so which one answers does not change what is drawn; only an
answer received counts (its tokens once), never a failed try.

Images go out only through the chat endpoint (``takes_images``), each read and decoded as
an image within the caps of ``betaprm.image_files`` before any request of the batch is
sent. URLs in messages pass through ``redact_url``: a password in the base URL is never
printed.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import BetaPRMInputError, redact_url
from ..image_files import ImageRefused, read_image
from .base import Completion, GenerationError, GenerationRequest
from .replicas import COOL_DOWN, FAIL_LIMIT, Replicas, split_urls
from .text import Sampling, TextFormat, final_answer

MAX_RESPONSE_BYTES = 16 * 2**20
"""Default cap on one answer: a completion is text, far below this."""


class _TooLarge(Exception):
    pass


def image_data_url(path: str) -> str:
    """An image file as a ``data:`` URL (what OpenAI-compatible servers take in image_url),
    once it has decoded as an image within the caps; the MIME type is the decoded format's,
    never guessed from the name."""
    try:
        mime, data = read_image(path)
    except ImageRefused as e:
        raise BetaPRMInputError(f"image not sent: {e}") from None
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def http_post(url: str, data: bytes, headers: dict, timeout: float, max_bytes: int) -> tuple[int, str | None, bytes]:
    """POST ``data`` to ``url``: (status, Location header, body). The whole call ends
    within ``timeout`` seconds (TimeoutError past it); a body over ``max_bytes`` raises
    ``_TooLarge``; a 3xx answer comes back without its body."""
    u = urllib.parse.urlsplit(url)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    https = u.scheme == "https"
    conn = (http.client.HTTPSConnection if https else http.client.HTTPConnection)(
        u.hostname, u.port or (443 if https else 80), timeout=timeout
    )
    expired = threading.Event()

    def expire():
        # Socket timeouts bound each read only; shutting the socket down at the deadline
        # ends whatever read or write is blocked on it.
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if expired.is_set():  # the deadline passed while connecting, before the socket existed
            raise TimeoutError
        conn.request("POST", path, body=data, headers=headers)
        resp = conn.getresponse()
        if 300 <= resp.status < 400:
            return resp.status, resp.getheader("Location"), b""
        length = resp.getheader("Content-Length")
        if length and length.strip().isdigit() and int(length) > max_bytes:
            raise _TooLarge
        body = bytearray()
        while chunk := resp.read1(65536):
            body += chunk
            if len(body) > max_bytes:
                raise _TooLarge
    except (OSError, http.client.HTTPException):
        if expired.is_set():  # cut off by the deadline, not a network failure
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # the deadline's shutdown reads as an early end of the answer
        raise TimeoutError
    return resp.status, None, bytes(body)


class OpenAIGenerator:
    """``endpoint="chat"`` posts ``/chat/completions`` messages; prefilled continuation
    uses the ``continue_final_message`` extension of vLLM and SGLang. ``endpoint=
    "completions"`` posts a plain prompt to ``/completions`` (rendered with
    ``tokenizer``'s chat template when given): any server, prefill included.

    ``base_url``: one server, or several replicas of one model (a list, or URLs separated
    by commas); ``concurrency`` calls in flight per replica, ``fail_limit`` failed calls in
    a row set a replica aside for ``cool_down`` seconds (``generation.replicas``).

    ``api_key`` is sent as ``Authorization: Bearer`` when given, never otherwise.
    ``url_flag`` and ``model_flag`` name the options the base URL and the served model
    name came from, for error messages."""

    def __init__(
        self,
        base_url: str | Sequence[str],
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
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        url_flag: str = "--base-url",
        model_flag: str = "--policy",
        fail_limit: int = FAIL_LIMIT,
        cool_down: float = COOL_DOWN,
    ):
        if endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be chat or completions, got {endpoint!r}")
        urls = split_urls(base_url, url_flag)
        for url in urls:
            u = urllib.parse.urlsplit(url)
            shown = redact_url(url)
            try:
                _ = u.port  # raises on a port that is not a number in 0..65535
            except ValueError:
                raise BetaPRMInputError(
                    f"{url_flag} {shown!r} has a bad port; give the server's base URL, e.g. http://127.0.0.1:8000/v1"
                ) from None
            if u.scheme not in ("http", "https") or not u.hostname:
                raise BetaPRMInputError(
                    f"{url_flag} {shown!r} is not an http:// or https:// URL; give the server's base URL, e.g. "
                    "http://127.0.0.1:8000/v1" + (" (several servers: URLs separated by commas)" * (len(urls) > 1))
                )
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise BetaPRMInputError(f"the request timeout must be a number of seconds > 0, got {timeout!r}")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0]
        self.replicas = Replicas(self.base_urls, fail_limit, cool_down)
        self._answered = threading.local()  # the replica that answered this thread's last call
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
        self.max_response_bytes = max_response_bytes
        self.url_flag = url_flag
        self.model_flag = model_flag

    @property
    def takes_images(self) -> bool:
        """Whether requests with images may be sent: the chat endpoint carries them as
        image_url parts; the completions endpoint takes text only."""
        return self.endpoint == "chat"

    # ------------------------------------------------------------------ one call
    def _body(self, req: GenerationRequest, copy: int, image_urls: dict | None = None) -> tuple[str, dict]:
        s = self.sampling
        body = {
            "model": self.model,
            "n": 1,
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if s.top_k > 0:
            body["top_k"] = s.top_k  # vLLM/SGLang extension; OpenAI itself ignores it
        if req.seed is not None:
            body["seed"] = (req.seed * 1009 + copy) % 2**31  # servers take a 32-bit seed
        if req.max_steps == 1 and self.fmt.step_stop():
            body["stop"] = [self.fmt.step_stop()]  # one step (step-level search)
        if self.endpoint == "chat":
            msgs, prefilled = self.fmt.messages(req.question, list(req.prefix))
            if req.images:  # the user turn as text and image_url parts (data URLs: no file server needed)
                user = next(m for m in msgs if m["role"] == "user")
                user["content"] = [{"type": "text", "text": user["content"]}] + [
                    {"type": "image_url", "image_url": {"url": (image_urls or {}).get(p) or image_data_url(p)}}
                    for p in req.images
                ]
            body["messages"] = msgs
            if prefilled:
                body["continue_final_message"] = True
                body["add_generation_prompt"] = False
            return "/chat/completions", body
        if req.images:
            raise BetaPRMInputError(
                "problems with images need --endpoint chat (the completions endpoint takes text only); no image "
                "was sent"
            )
        body["prompt"] = self.fmt.prompt_text(req.question, list(req.prefix), self.tokenizer)
        return "/completions", body

    def post_json(self, path: str, body: dict) -> dict:
        """POST ``body`` to ``path`` on a replica; the answer's JSON. A failure worth another
        try (no connection, a timeout, 429, 5xx) moves the call to another replica at once;
        once every replica has failed it in a round, the next round starts after the backoff
        (``max_retries`` rounds after the first). Before giving up, a replica the call has
        not reached (it was set aside) gets one try. Anything else fails at once."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        failures: dict[int, str] = {}  # this call's last failure on each replica
        for rnd in range(self.max_retries + 1):
            if rnd:
                time.sleep(self.backoff * 2 ** (rnd - 1))
            tried: set[int] = set()
            while (i := self.replicas.acquire(tried)) is not None:
                tried.add(i)
                ans, failures[i] = self._try(i, path, data, headers)
                if ans is not None:
                    return ans
        for i in range(len(self.replicas)):
            if i not in failures:  # set aside all along while another replica failed it
                ans, failures[i] = self._try(self.replicas.acquire(only=i), path, data, headers)
                if ans is not None:
                    return ans
        rounds = self.max_retries + 1
        shown = [redact_url(u) for u in self.base_urls]
        if len(self.replicas) == 1:
            raise GenerationError(
                f"{shown[0]}{path}: {failures[0]} after {rounds} attempts. Is the server running and serving "
                f"{self.model!r}? (e.g. `vllm serve MODEL --port 8000`, then {self.url_flag} http://HOST:8000/v1)"
            )
        lasts = "; ".join(f"{shown[i]}: {failures[i]}" for i in range(len(shown)))
        raise GenerationError(
            f"all {len(self.replicas)} {self.url_flag} servers failed a request ({rounds} rounds of tries; last "
            f"failure of each: {lasts}). Are the servers running and serving {self.model!r}? (e.g. `vllm serve "
            f"MODEL --port 8000` on each, then {self.url_flag} http://HOST1:8000/v1,http://HOST2:8000/v1)"
        )

    def _try(self, i: int, path: str, data: bytes, headers: dict) -> tuple[dict | None, str]:
        """One call to replica ``i`` (acquired): ``(the answer's JSON, "")``, or ``(None,
        why)`` after a failure worth another try (recorded against the replica); other
        failures raise."""
        url = self.base_urls[i] + path
        shown = redact_url(url)  # what messages say: the request still goes to url
        failure = None
        try:
            try:
                status, location, raw = http_post(url, data, headers, self.timeout, self.max_response_bytes)
            except TimeoutError:
                failure = f"no answer within {self.timeout:g} s"
                return None, failure
            except _TooLarge:
                raise GenerationError(
                    f"{shown} sent an answer larger than {self.max_response_bytes} bytes; a completion is far "
                    "smaller, so this is not the server you meant"
                ) from None
            except (ConnectionRefusedError, socket.gaierror) as e:
                failure = f"cannot connect ({e})"
                return None, failure
            except (OSError, http.client.HTTPException) as e:
                failure = f"connection failed ({e!r})"
                return None, failure
            if 300 <= status < 400:
                raise BetaPRMInputError(
                    f"{shown} answered HTTP {status}, a redirect to {redact_url(location or '')!r}; redirects are "
                    "not followed (the request and any API key would go to another address): give the address "
                    f"you mean to reach as {self.url_flag}"
                )
            detail = raw[:300].decode(errors="replace")
            if status == 429 or status >= 500:
                failure = f"HTTP {status}: {detail}"
                return None, failure
            if status >= 400:
                raise GenerationError(
                    f"{shown} refused the request with HTTP {status}: {detail} (check {self.model_flag} "
                    f"{self.model!r}, the served model name, and the sampling settings)"
                )
            try:
                ans = json.loads(raw)
            except ValueError:
                raise GenerationError(f"{shown} answered with something that is not JSON: {raw[:200]!r}") from None
            self._answered.url = url
            return ans, ""
        finally:
            self.replicas.release(i, failure)

    def _one(self, req: GenerationRequest, copy: int, image_urls: dict | None = None) -> Completion:
        path, body = self._body(req, copy, image_urls)
        ans = self.post_json(path, body)
        try:
            choice = ans["choices"][0]
            text = choice["message"]["content"] if self.endpoint == "chat" else choice["text"]
            n_tokens = int(ans["usage"]["completion_tokens"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise GenerationError(
                f"{redact_url(getattr(self._answered, 'url', self.base_url + path))} answered without "
                f"choices[0].{'message.content' if self.endpoint == 'chat' else 'text'} "
                f"or usage.completion_tokens: {json.dumps(ans)[:300]}"
            ) from None
        steps = self.fmt.split_steps(text or "")
        if "stop" not in body:
            return Completion(steps, n_tokens)
        # One step was asked for: did the model end the trace (the final answer, or its end of
        # text) or stop at the step boundary? vLLM says which stop it met (stop_reason: the
        # string, or None at the end of text); other servers do not, and the answer decides.
        if "stop_reason" in choice:
            finished = choice["stop_reason"] is None and choice.get("finish_reason") == "stop"
        else:
            # A stated answer only: a bare step (a line of arithmetic) has not ended the trace.
            finished = final_answer(steps, bare=False) is not None
        return Completion(steps, n_tokens, finished=finished)

    # ------------------------------------------------------------------ protocol
    def _image_urls(self, requests: Sequence[GenerationRequest]) -> dict[str, str]:
        """Every image of the batch as a data URL, checked before any request is sent: a
        file that is not an image, or images on the completions endpoint, stop the batch
        with nothing sent (requests run concurrently, so a check inside one would come
        after others went out)."""
        paths = list(dict.fromkeys(p for r in requests for p in r.images))
        if paths and not self.takes_images:
            raise BetaPRMInputError(
                f"problems with images need --endpoint chat (the {self.endpoint} endpoint takes text only); no "
                "request was sent"
            )
        return {p: image_data_url(p) for p in paths}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        jobs = [(i, j) for i, r in enumerate(requests) for j in range(r.n)]
        image_urls = self._image_urls(requests)
        pool = ThreadPoolExecutor(self.concurrency * len(self.replicas))
        try:
            futures = [pool.submit(self._one, requests[i], j, image_urls) for i, j in jobs]
            results = [f.result() for f in futures]
        finally:
            # On the first failure, calls not yet started are dropped instead of each
            # waiting out its own retries.
            pool.shutdown(wait=True, cancel_futures=True)
        out: list[list[Completion]] = [[] for _ in requests]
        for (i, _), c in zip(jobs, results):
            out[i].append(c)
        return out
