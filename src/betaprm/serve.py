"""A reward server: a BetaPRM behind HTTP, for RL and search loops.

``create_app(prm, ServeSettings(...))`` builds a FastAPI app (run by ``betaprm serve``
under uvicorn) with

- ``POST /v1/score``: one trace ``{"question", "steps"}`` (with a vision-language BetaPRM
  also ``"images"``: data URLs, ``data:image/png;base64,...``) or ``{"items": [...]}`` ->
  per step ``mu``, ``kappa``, ``sigma`` and trace scores (``mean``, ``min``, ``last``,
  ``prod``, ``lin``, and ``rb`` when a sigma threshold ``tau`` is known); ``lam`` and
  ``tau`` may be given per request;
- ``POST /get_reward``: OpenRLHF's remote reward-model contract, ``{"query": [...],
  "prompts": [...], "labels": [...]}`` -> ``{"rewards": [...], "scores": [...],
  "step_rewards": [[...]]}``. A prompt is the conversation rendered with the policy's chat
  template and a query that prompt followed by the response and its special tokens
  (``<|im_end|>``, padding); ``betaprm.chat.ChatTemplateReader``, built from the chat
  template of ``policy_tokenizer`` (else the PRM's tokenizer), reads the question (the
  last user message's content; a prompt without the template's role markers is the
  question as it stands) and the response (the query after its prompt, special tokens
  removed), which is cut into steps at ``step_separator``; the reward (and ``scores``, the
  same numbers) is the ``aggregate`` trace score, ``step_rewards`` the steps' ``mu``. A
  request without ``prompts`` is refused (400) unless ``allow_no_prompts``: then the
  question and the response are read from the query alone (the response starts after the
  template's last generation prompt). An empty ``query`` list gets empty lists;
- ``GET /health`` and ``GET /v1/models``.

Concurrent requests are batched dynamically: traces queue up, and a single worker takes
what arrived within ``max_wait_ms`` of the first (up to ``max_batch_tokens`` tokens),
scores it with the offline scorer (``score_token_ids``: packed by padded tokens, one
forward per batch) and answers every request from it, so the scores equal
``betaprm score``'s. Bad requests get a 4xx status and a message, never a crash:
malformed JSON or fields (400), a trace longer than the model's positions or too many
items (413), a missing or wrong key (401).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# At module level: FastAPI reads the handlers' annotations (``Request``) from here.
from fastapi import Request

from .chat import reward_reader, reward_traces
from .errors import BetaPRMInputError
from .formatting import encode_traces
from .scoring import DEFAULT_MAX_BATCH_TOKENS, max_positions, score_token_ids
from .selection import METHODS, candidate_scores
from .types import StepScores

__all__ = ["ServeSettings", "create_app", "trace_scores"]


@dataclass
class ServeSettings:
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_wait_ms: float = 5.0
    max_items: int = 256
    max_request_bytes: int = 16 * 2**20
    lam: float = 0.5
    tau: float | None = None
    aggregate: str = "mean"
    step_separator: str = "\n\n"
    api_key: str | None = None
    model_name: str = "betaprm"
    model_kind: str = "beta"  # betaprm.model.model_kind: beta, standard or zero-shot; shown by /v1/models
    # /get_reward: the policy's tokenizer (a folder or hub name, or a tokenizer object) whose
    # chat template rendered the prompts; None: the PRM's tokenizer's template.
    policy_tokenizer: object | None = None
    # /get_reward: accept a request without "prompts" (read both parts from the query).
    allow_no_prompts: bool = False
    trust_remote_code: bool = False  # for loading policy_tokenizer


class RequestError(Exception):
    """A request the server refuses: ``status`` and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def trace_scores(s: StepScores, lam: float, tau: float | None) -> dict:
    """The selectors' scores of one trace (``rb`` only with a sigma threshold)."""
    methods = [m for m in METHODS if m != "rb" or tau is not None]
    return {m: float(candidate_scores([s], m, lam, tau)[0]) for m in methods}


class _Batcher:
    """Gathers queued traces into batches; one worker thread tokenises each batch in one
    call and scores it, so the event loop only parses requests and answers them."""

    def __init__(self, prm, settings: ServeSettings):
        self.prm = prm
        self.settings = settings
        self.limit = max_positions(prm)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="betaprm-score")
        self.batches = 0
        self.traces = 0

    async def score(self, traces: list[tuple[str, list[str]]], names: list[str]) -> list[StepScores]:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in traces]
        for t, n, f in zip(traces, names, futures):
            self.queue.put_nowait((t, n, f))
        # Every future is awaited (no "exception never retrieved"); the first error answers.
        results = await asyncio.gather(*futures, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)

    def _score(self, batch) -> list:
        """StepScores, or the RequestError of a trace over the model's positions, per item."""
        if self.prm.processor is not None:  # vision-language: batches of traces, images decoded
            from .vision import score_multimodal

            return score_multimodal(self.prm, [t for t, _, _ in batch])
        ids = encode_traces(
            self.prm.tokenizer, self.prm.config.marker_id, [t for t, _, _ in batch], self.prm.config.trace_format
        )
        out: list = [None] * len(batch)
        fits = []
        for i, ((_, name, _), x) in enumerate(zip(batch, ids)):
            if self.limit is not None and len(x) > self.limit:
                out[i] = RequestError(
                    413, f"{name}: {len(x)} tokens, more than the model's {self.limit} positions; send a shorter trace"
                )
            else:
                fits.append(i)
        for i, r in zip(
            fits, score_token_ids(self.prm, [ids[i] for i in fits], max_batch_tokens=self.settings.max_batch_tokens)
        ):
            out[i] = r
        return out

    def _score_alone(self, item):
        try:
            return self._score([item])[0]
        except Exception as e:
            return e

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.settings.max_wait_ms / 1000
        # Gathered by characters, as tokenising happens in the worker: up to about four
        # forward batches' worth (3 characters per token is a low estimate), which the
        # worker packs by padded tokens like the offline scorer.
        budget = 12 * self.settings.max_batch_tokens
        while True:
            batch = [await self.queue.get()]
            size = _chars(batch[0][0])
            deadline = loop.time() + wait
            while size < budget:
                left = deadline - loop.time()
                if left <= 0 and self.queue.empty():
                    break
                try:
                    item = (
                        self.queue.get_nowait()
                        if not self.queue.empty()
                        else await asyncio.wait_for(self.queue.get(), left)
                    )
                except (asyncio.TimeoutError, TimeoutError):
                    break
                batch.append(item)
                size += _chars(item[0])
            # A cancelled request (its client went away) needs no scores.
            batch = [b for b in batch if not b[2].done()]
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(self.pool, self._score, batch)
            except Exception:
                # One trace the tokenizer or model chokes on must not fail the others that
                # shared its batch: score them one by one, each with its own outcome.
                results = [await loop.run_in_executor(self.pool, self._score_alone, b) for b in batch]
            self.batches += 1
            self.traces += len(batch)
            for (_, _, f), r in zip(batch, results):
                if not f.done():
                    f.set_exception(r) if isinstance(r, Exception) else f.set_result(r)


def _chars(trace: tuple) -> int:
    return len(trace[0]) + sum(len(x) for x in trace[1])


def _text(obj: dict, key: str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str):
        raise RequestError(400, f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    return v


def _number(obj: dict, key: str, default):
    v = obj.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RequestError(400, f"field {key!r} must be a finite number, got {v!r}")
    return float(v)


MAX_IMAGES = 16
"""Images per trace at most."""


def _image(url, where: str):
    """A ``data:image/...;base64,`` URL as a PIL image (the server reads no files or URLs)."""
    import base64
    import binascii
    import io

    from PIL import Image

    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise RequestError(400, f"{where}: an image must be a data URL, 'data:image/png;base64,...'")
    try:
        raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")
    except (binascii.Error, ValueError, OSError, Image.DecompressionBombError) as e:
        raise RequestError(400, f"{where}: not a readable image ({e})") from None


def _parse_trace(obj, where: str, vision: bool = False) -> tuple:
    if not isinstance(obj, dict):
        raise RequestError(400, f"{where}: must be an object with 'question' and 'steps'")
    question = _text(obj, "question", where)
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) and s.strip() for s in steps):
        raise RequestError(400, f"{where}: field 'steps' must be a non-empty list of non-empty strings")
    images = obj.get("images")
    if not images:
        return question, steps
    if not vision:
        raise RequestError(400, f"{where}: this server's BetaPRM is text-only; leave out 'images'")
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise RequestError(400, f"{where}: field 'images' must be a list of at most {MAX_IMAGES} data URLs")
    return question, steps, [_image(u, f"{where}.images[{i}]") for i, u in enumerate(images)]


def create_app(prm, settings: ServeSettings | None = None):
    """The FastAPI app serving ``prm`` (see the module docstring)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    settings = settings or ServeSettings()
    if settings.aggregate not in METHODS:
        raise BetaPRMInputError(f"--aggregate must be one of {', '.join(METHODS)}, got {settings.aggregate!r}")
    if settings.aggregate == "rb" and settings.tau is None:
        raise BetaPRMInputError("--aggregate rb needs --tau (S_RB's sigma threshold)")
    batcher = _Batcher(prm.eval(), settings)
    reader = reward_reader(prm, settings)
    vision = prm.processor is not None  # images come as data URLs in /v1/score
    limit = batcher.limit

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()
        batcher.pool.shutdown(wait=True)

    app = FastAPI(title="betaprm", lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def _refused(request, exc: RequestError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    async def body_of(request: Request):
        if settings.api_key is not None:
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {settings.api_key}".encode()):
                raise RequestError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > settings.max_request_bytes:
            raise RequestError(
                413, f"request body of {length} bytes is over the server's {settings.max_request_bytes}"
            )
        raw = await request.body()
        if len(raw) > settings.max_request_bytes:
            raise RequestError(
                413, f"request body of {len(raw)} bytes is over the server's {settings.max_request_bytes}"
            )
        try:
            return json.loads(raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")))
        except (ValueError, RecursionError) as e:
            raise RequestError(400, f"the body is not valid JSON: {e}") from None

    def check(traces: list[tuple[str, list[str]]], names: list[str]) -> None:
        if len(traces) > settings.max_items:
            raise RequestError(
                413,
                f"{len(traces)} traces in one request, more than the server's {settings.max_items}; send fewer per "
                "request",
            )
        marker = prm.config.marker
        for name, (q, steps, *_) in zip(names, traces):
            if marker in q or any(marker in x for x in steps):
                raise RequestError(
                    400,
                    f"{name} contains the marker text {marker!r}, which would add a scoring position that belongs to "
                    "no step; remove it",
                )

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "batches": batcher.batches,
            "traces": batcher.traces,
            "mean_batch_traces": batcher.traces / batcher.batches if batcher.batches else 0.0,
        }

    @app.get("/v1/models")
    async def models():
        c = prm.config
        return {
            "data": [
                {
                    "id": settings.model_name,
                    "object": "model",
                    "kind": settings.model_kind,
                    "marker": c.marker,
                    "reward_tokens": list(c.reward_tokens),
                    "max_positions": limit,
                    "lam": settings.lam,
                    "tau": settings.tau,
                    "aggregate": settings.aggregate,
                }
            ]
        }

    @app.post("/v1/score")
    async def score(request: Request):
        body = await body_of(request)
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object: one trace {question, steps} or {items: [...]}")
        single = "items" not in body
        items = [body] if single else body["items"]
        if not isinstance(items, list) or not items:
            raise RequestError(400, "field 'items' must be a non-empty list of {question, steps} objects")
        lam, tau = _number(body, "lam", settings.lam), _number(body, "tau", settings.tau)
        names = ["the trace" if single else f"items[{i}]" for i in range(len(items))]
        traces = [_parse_trace(it, n, vision) for it, n in zip(items, names)]
        check(traces, names)
        scores = await batcher.score(traces, names)
        results = [{**s.to_dict(), "scores": trace_scores(s, lam, tau)} for s in scores]
        # A ready response: FastAPI's encoder would walk every float of every list again.
        return JSONResponse(results[0] if single else {"results": results})

    @app.post("/get_reward")
    async def get_reward(request: Request):
        body = await body_of(request)
        if not isinstance(body, dict) or not isinstance(body.get("query"), list):
            raise RequestError(
                400,
                'the body must be {"query": [texts], "prompts": [texts], "labels": [...]} (OpenRLHF\'s remote '
                "reward model)",
            )
        if not body["query"]:  # OpenRLHF's client sends empty lists to spare servers
            return JSONResponse({"rewards": [], "scores": [], "step_rewards": []})
        try:
            traces = reward_traces(
                body["query"], body.get("prompts"), reader, settings.step_separator, settings.allow_no_prompts
            )
        except BetaPRMInputError as e:
            raise RequestError(400, str(e)) from None
        names = [f"query[{i}]" for i in range(len(traces))]
        check(traces, names)
        scores = await batcher.score(traces, names)
        agg = [trace_scores(s, settings.lam, settings.tau)[settings.aggregate] for s in scores]
        # OpenRLHF reads "rewards", and "scores" (dynamic filtering) when present.
        return JSONResponse({"rewards": agg, "scores": agg, "step_rewards": [s.mu.tolist() for s in scores]})

    return app
