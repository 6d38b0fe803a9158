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
  template's last generation prompt). An empty ``query`` list gets empty lists. With
  ``step_reliability`` (or a request's ``"return_reliability": true``) the answer also holds
  ``step_kappa`` and ``step_sigma`` per step; without, it is byte for byte what it was;
- ``GET /health``, ``GET /v1/models`` (the model's ``model_name``, never a file path) and
  ``GET /metrics`` (Prometheus' text format, ``betaprm.serve_metrics``: requests by route and
  status, errors, latency, scored batch sizes, the scorer's queue), with ``access_log`` one
  line per request in the log.

``run_server`` runs the app under uvicorn on a socket bound beforehand
(``serve_requests.listen_socket``), and says it serves only once uvicorn accepts connections.

Every route checks, before anything else, the ``Host`` header against ``allowed_hosts``
(a browser page reaching a loopback server through DNS rebinding sends its own host name:
400), the key when one is set (401), and that a POST body is ``application/json`` (415: a
``text/plain`` POST needs no CORS preflight, so any web page could make a browser send
one). Bodies are read as they stream in and refused at ``max_request_bytes`` (413).

Slow and hostile clients are bounded (``uvicorn_options``): a connection is closed when its
request headers have not arrived within ``header_timeout`` (an idle socket included), at
most ``max_connections`` are open (503 past them), a body must arrive whole within
``body_timeout`` (408), a body past its first MiB waits, unread, for room under
``max_buffered_bytes`` (503 when none came in time) and is parsed when no other large one
is, a body's JSON values are counted before it is parsed (413 over ``max_json_values``:
millions of ``{}`` are never built), ``max_items`` is checked before any trace or query is
read, and a client that leaves is one line in the log.

Nothing slow runs on the event loop: a request's JSON is parsed and its images decoded in
a worker thread, and its traces are checked for size before they are tokenised (more
characters than ``max_positions * max_chars_per_token`` or more steps than positions can
never fit: 413 at once), then tokenised in one of ``TOKENIZER_THREADS`` threads, so a
large trace delays neither small requests nor the scoring of others; a trace over the
model's positions is refused (413) before it reaches the scorer. Concurrent requests are
batched dynamically: encoded traces queue up, and a single worker takes what arrived
within ``max_wait_ms`` of the first (up to about four forwards' worth of tokens), scores
it with the offline scorer (``score_token_ids``: packed by padded tokens, one forward per
``max_batch_tokens``) and answers every request from it, so the scores equal ``betaprm
score``'s. Bad requests get a 4xx status and a message, never a crash: malformed JSON or
fields, text that is not valid Unicode or values out of range (400), a trace longer than
the model's positions, a body over the cap or too many items (413).

Over 400 lines because the routes share what ``create_app`` closes over: the batcher, the
reader of chat prompts, the settings and the count of body bytes held.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass

# At module level: FastAPI reads the handlers' annotations (``Request``) from here.
from fastapi import Request

from .chat import reward_reader, reward_traces
from .errors import BetaPRMInputError
from .formatting import encode_traces
from .scoring import max_positions, score_token_ids
from .selection import METHODS, candidate_scores
from .serve_metrics import CONTENT_TYPE_LATEST, Observe, ServerMetrics
from .serve_requests import (
    MAX_LAM,
    Guard,
    RequestError,
    ServeOptions,
    http_protocol,
    json_values,
    longest_token_chars,
    number_field,
    parse_json,
    parse_trace,
    peer,
    request_size,
    trace_chars,
)
from .types import StepScores
from .vision import score_multimodal

__all__ = ["ServeSettings", "create_app", "run_server", "trace_scores", "uvicorn_options"]

log = logging.getLogger(__name__)

TOKENIZER_THREADS = 2
"""Threads that tokenise requests: one long trace leaves the other free for small ones."""
SMALL_BODY = 2**20
"""Bytes of a body read before it needs room under ``max_buffered_bytes``: smaller bodies never
wait for room and are parsed alongside others; larger ones wait their turn for both."""


@dataclass
class ServeSettings(ServeOptions):
    """Everything ``create_app`` needs: the shared options and what the command resolved
    (the key's value, the model's name and kind, the policy's tokenizer, the Host names)."""

    api_key: str | None = None
    model_name: str = "betaprm"  # shown by /v1/models: a name, never a file path
    model_kind: str = "beta"  # betaprm.model.model_kind: beta, standard or zero-shot; shown by /v1/models
    # /get_reward: the policy's tokenizer (a folder or hub name, or a tokenizer object) whose
    # chat template rendered the prompts; None: the PRM's tokenizer's template.
    policy_tokenizer: object | None = None
    trust_remote_code: bool = False  # for loading policy_tokenizer
    # Host header values accepted ("name" any port, "name:port" that port; "*" any host);
    # None: the loopback names with the port (default_allowed_hosts).
    allowed_hosts: tuple[str, ...] | None = None
    port: int = 8000  # for the default allowed_hosts
    # Characters one token can stand for at most; None: from the tokenizer's longest token.
    max_chars_per_token: int | None = None


def trace_scores(s: StepScores, lam: float, tau: float | None) -> dict:
    """The selectors' scores of one trace (``rb`` only with a sigma threshold)."""
    methods = [m for m in METHODS if m != "rb" or tau is not None]
    return {m: float(candidate_scores([s], m, lam, tau)[0]) for m in methods}


def uvicorn_options(settings: ServeOptions) -> dict:
    """``uvicorn.run``'s keyword arguments for serving with ``settings``: the header timeout
    (``http_protocol``), at most ``max_connections`` connections, and SIGTERM answering the
    requests in flight (up to 60 s) before the server stops."""
    return {
        "http": http_protocol(settings),
        "limit_concurrency": settings.max_connections,
        "log_level": "warning",
        "timeout_graceful_shutdown": 60,
    }


class _Batcher:
    """Gathers queued encoded traces into batches; one worker thread scores each batch, so
    the event loop only answers requests and the scorer only runs the model."""

    def __init__(self, prm, settings: ServeSettings, on_batch=None):
        self.prm = prm
        self.settings = settings
        self.on_batch = on_batch  # called with each scored batch's number of traces
        self.limit = max_positions(prm)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="betaprm-score")
        self.tokenizers = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="betaprm-tokenize")
        self.batches = 0
        self.traces = 0
        if prm.processor is None:
            # One call now: a tokenizer whose saved settings pad or truncate resets them on its
            # first call, which must not happen while another tokenizer thread is encoding.
            self.encode([("q", ["a"])], ["warm-up"])

    def encode(self, traces: list[tuple], names: list[str]) -> list:
        """Token ids per trace (in a tokenizer thread), or the RequestError of a trace over
        the model's positions, which then never reaches the scorer."""
        c = self.prm.config
        try:
            ids = encode_traces(self.prm.tokenizer, c.marker_id, traces, c.trace_format)
        except BetaPRMInputError as e:
            raise RequestError(400, str(e)) from None
        return [
            RequestError(
                413, f"{name}: {len(x)} tokens, more than the model's {self.limit} positions; send a shorter trace"
            )
            if self.limit is not None and len(x) > self.limit
            else x
            for name, x in zip(names, ids)
        ]

    async def score(self, traces: list[tuple], names: list[str]) -> list[StepScores]:
        loop = asyncio.get_running_loop()
        if self.prm.processor is None:
            items = await loop.run_in_executor(self.tokenizers, self.encode, traces, names)
            for r in items:
                if isinstance(r, RequestError):
                    raise r
        else:  # vision-language: the processor encodes text and images together, in the scorer
            items = traces
        futures = [loop.create_future() for _ in items]
        for t, n, f in zip(items, names, futures):
            self.queue.put_nowait((t, n, f))
        # Every future is awaited (no "exception never retrieved"); the first error answers.
        results = await asyncio.gather(*futures, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)

    def _score(self, batch) -> list:
        """StepScores per item: token ids, or a vision-language trace."""
        if self.prm.processor is not None:  # vision-language: batches of traces, images decoded
            return score_multimodal(self.prm, [t for t, _, _ in batch])
        return score_token_ids(self.prm, [t for t, _, _ in batch], max_batch_tokens=self.settings.max_batch_tokens)

    def _score_alone(self, item):
        try:
            return self._score([item])[0]
        except Exception as e:
            return e

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.settings.max_wait_ms / 1000
        # Up to about four forward batches' worth of tokens, which the worker packs by
        # padded tokens like the offline scorer (vision traces: by characters, a low bound).
        budget = 4 * self.settings.max_batch_tokens
        while True:
            batch = [await self.queue.get()]
            size = request_size(batch[0][0])
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
                size += request_size(item[0])
            # A cancelled request (its client went away) needs no scores.
            batch = [b for b in batch if not b[2].done()]
            if not batch:
                continue
            try:
                results = await loop.run_in_executor(self.pool, self._score, batch)
            except Exception:
                # One trace the model chokes on must not fail the others that shared its
                # batch: score them one by one, each with its own outcome.
                results = [await loop.run_in_executor(self.pool, self._score_alone, b) for b in batch]
            self.batches += 1
            self.traces += len(batch)
            if self.on_batch is not None:
                self.on_batch(len(batch))
            for (_, _, f), r in zip(batch, results):
                if not f.done():
                    f.set_exception(r) if isinstance(r, Exception) else f.set_result(r)


def create_app(prm, settings: ServeSettings | None = None):
    """The FastAPI app serving ``prm`` (see the module docstring)."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, Response
    from starlette.requests import ClientDisconnect

    settings = settings or ServeSettings()
    bad = settings.option_problems()
    if bad:
        raise BetaPRMInputError("; ".join(bad))
    metrics = ServerMetrics(queue_depth=lambda: batcher.queue.qsize())
    batcher = _Batcher(prm.eval(), settings, on_batch=metrics.batch)
    reader = reward_reader(prm, settings)
    vision = prm.processor is not None  # images come as data URLs in /v1/score
    if vision:
        from PIL import Image

        # PIL's own bomb check (a warning, made an error in image_from_url) at the server's cap, so
        # a cap raised above PIL's default is honoured too.
        Image.MAX_IMAGE_PIXELS = settings.max_image_pixels
    limit = batcher.limit
    per_token = settings.max_chars_per_token or max(16, 2 * longest_token_chars(prm.tokenizer))
    max_chars = None if limit is None else limit * per_token
    repeat = prm.config.trace_format.marker_repeat

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.run())
        yield
        task.cancel()
        batcher.tokenizers.shutdown(wait=True)
        batcher.pool.shutdown(wait=True)

    app = FastAPI(title="betaprm", lifespan=lifespan)
    app.add_middleware(Guard, settings=settings)

    @app.exception_handler(RequestError)
    async def _refused(request, exc: RequestError):
        # 408, 503: a body that stopped coming, or was never given room; nothing more is read
        # on its connection. (After a 413 the rest of a body still coming is read and dropped,
        # not kept, so that the client reads the answer rather than a reset; the header timeout
        # bounds how long.)
        headers = {"Connection": "close"} if exc.status in (408, 503) else {}
        if exc.status == 503:
            headers["Retry-After"] = "1"
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)

    room = asyncio.Condition()  # wakes the large bodies waiting for room when one gives its room back
    reserved = 0  # bytes given to large bodies being read or parsed (the event loop's own count: no lock)

    async def raw_body(request: Request, held: list[int]) -> bytearray:
        """The body, read as it streams in: refused at ``max_request_bytes`` (413) or when it
        has not arrived whole within ``body_timeout`` (408). Past its first ``SMALL_BODY``
        bytes a body waits, unread, until the large bodies held at once leave room for it
        under ``max_buffered_bytes`` (for its declared length, or ``max_request_bytes`` when
        it is sent in chunks; alone, it always has room): 503 when none came within
        ``body_timeout``. ``held[0]``: the room it was given, for the caller to give back."""
        nonlocal reserved
        cap = settings.max_request_bytes
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > cap:
            raise RequestError(413, f"request body of {length} bytes is over the server's {cap}")
        size = int(length) if length and length.isdigit() else cap
        body, n, waiting = bytearray(), 0, False  # one buffer, not pieces joined (a copy) at the end

        async def read() -> None:
            nonlocal body, n, reserved, waiting
            # Stopped at the cap as it streams in: a chunked body has no length to check.
            async for chunk in request.stream():
                if n + len(chunk) > cap:
                    raise RequestError(413, f"request body of more than {cap} bytes is over the server's {cap}")
                if n + len(chunk) > SMALL_BODY and not held[0]:
                    # Waiting, its connection is not read: the client's sending stalls, and
                    # costs nothing here.
                    waiting = True
                    async with room:
                        await room.wait_for(lambda: reserved == 0 or reserved + size <= settings.max_buffered_bytes)
                        reserved += size
                        held[0] = size
                    waiting = False
                    # From here one block of the body's whole length: a buffer grown step by step
                    # leaves the blocks of bodies that came and went scattered in the process's
                    # memory, which then grows past what the bodies hold at any one time.
                    whole = bytearray(size)
                    whole[:n] = body
                    body = whole
                if held[0]:
                    body[n : n + len(chunk)] = chunk
                else:
                    body.extend(chunk)
                n += len(chunk)

        try:
            await asyncio.wait_for(read(), settings.body_timeout)
        except (asyncio.TimeoutError, TimeoutError):
            what = "waited for room" if waiting else "did not arrive"
            log.warning(
                "%s: %s's body %s within --body-timeout %g s (%d bytes came): %d",
                peer(request.client),
                request.url.path,
                what,
                settings.body_timeout,
                n,
                503 if waiting else 408,
            )
            if waiting:
                raise RequestError(
                    503,
                    f"no room for a body of {size} bytes within {settings.body_timeout:g} s: other large requests "
                    f"hold the server's {settings.max_buffered_bytes} bytes for bodies; send it again shortly",
                ) from None
            raise RequestError(
                408, f"the request body did not arrive whole within {settings.body_timeout:g} s; send it faster"
            ) from None
        except ClientDisconnect:
            # One line, not the traceback of an unhandled error: a client may hang up.
            log.warning(
                "%s went away before %s's body arrived (%d bytes came)", peer(request.client), request.url.path, n
            )
            raise RequestError(400, "the client went away before its body arrived") from None
        del body[n:]  # a body sent in chunks was given room for the cap
        return body

    large = asyncio.Semaphore(1)

    async def parsed_body(request: Request, parse):
        """``parse(raw)`` of the body, in a worker thread; a large body's room is held until
        then. Bodies over ``SMALL_BODY`` are parsed one at a time: however many come at once,
        the threads and the interpreter lock stay free enough for small requests."""
        nonlocal reserved
        held = [0]
        try:
            raw = await raw_body(request, held)
            if len(raw) <= SMALL_BODY:
                return await asyncio.to_thread(parse, raw)
            async with large:
                return await asyncio.to_thread(parse, raw)
        finally:
            if held[0]:
                async with room:
                    reserved -= held[0]
                    room.notify_all()

    def parse_body(raw: bytes):
        """The JSON, once its values are counted (a cheap scan): a body of millions of tiny
        values is refused before one of them is built."""
        cap = settings.max_json_values
        n = json_values(raw, cap)
        if n > cap:
            raise RequestError(
                413,
                f"the body holds more than {cap} JSON values (array elements and object members), more than the "
                "server reads in one request; send fewer items or steps per request",
            )
        return parse_json(raw)

    def check_count(n: int) -> None:
        if n > settings.max_items:
            raise RequestError(
                413, f"{n} traces in one request, more than the server's {settings.max_items}; send fewer per request"
            )

    def check(traces: list[tuple], names: list[str]) -> None:
        """Refusals that need no tokenizer: too many items, the marker, and traces too long
        to fit whatever their tokens (more characters or steps than positions can hold)."""
        check_count(len(traces))
        marker = prm.config.marker
        for name, (q, steps, *_) in zip(names, traces):
            if marker in q or any(marker in x for x in steps):
                raise RequestError(
                    400,
                    f"{name} contains the marker text {marker!r}, which would add a scoring position that belongs to "
                    "no step; remove it",
                )
            if limit is None:
                continue
            if len(steps) * repeat > limit:
                raise RequestError(
                    413,
                    f"{name}: {len(steps)} steps, more than the model's {limit} positions can score; send fewer steps",
                )
            n = trace_chars((q, steps))
            if n > max_chars:
                raise RequestError(
                    413,
                    f"{name}: {n} characters, more than the model's {limit} positions can hold (at most {per_token} "
                    "characters a token); send a shorter trace",
                )

    def parse_score(raw: bytes):
        """In a worker thread: the JSON, and images decoded, off the event loop."""
        body = parse_body(raw)
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object: one trace {question, steps} or {items: [...]}")
        single = "items" not in body
        items = [body] if single else body["items"]
        if not isinstance(items, list) or not items:
            raise RequestError(400, "field 'items' must be a non-empty list of {question, steps} objects")
        lam = number_field(body, "lam", settings.lam, -MAX_LAM, MAX_LAM, f"in [-{MAX_LAM:g}, {MAX_LAM:g}]")
        tau = number_field(body, "tau", settings.tau, 0.0, math.inf, ">= 0 (a sigma threshold)")
        names = ["the trace" if single else f"items[{i}]" for i in range(len(items))]
        check_count(len(items))  # before any image is decoded
        traces = [parse_trace(it, n, vision, settings.max_image_pixels) for it, n in zip(items, names)]
        check(traces, names)
        return single, traces, names, lam, tau

    def parse_reward(raw: bytes):
        body = parse_body(raw)
        if not isinstance(body, dict) or not isinstance(body.get("query"), list):
            raise RequestError(
                400,
                'the body must be {"query": [texts], "prompts": [texts], "labels": [...]} (OpenRLHF\'s remote '
                "reward model)",
            )
        reliability = body.get("return_reliability", settings.step_reliability)
        if not isinstance(reliability, bool):
            raise RequestError(
                400, f"field 'return_reliability' must be true or false, got {type(reliability).__name__}"
            )
        if not body["query"]:  # OpenRLHF's client sends empty lists to spare servers
            return [], [], reliability
        check_count(len(body["query"]))  # before any query is read
        try:
            traces = reward_traces(
                body["query"], body.get("prompts"), reader, settings.step_separator, settings.allow_no_prompts
            )
        except BetaPRMInputError as e:
            raise RequestError(400, str(e)) from None
        names = [f"query[{i}]" for i in range(len(traces))]
        check(traces, names)
        return traces, names, reliability

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

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/score")
    async def score(request: Request):
        single, traces, names, lam, tau = await parsed_body(request, parse_score)
        request.state.items = len(traces)
        scores = await batcher.score(traces, names)
        results = [{**s.to_dict(), "scores": trace_scores(s, lam, tau)} for s in scores]
        # A ready response: FastAPI's encoder would walk every float of every list again.
        return JSONResponse(results[0] if single else {"results": results})

    @app.post("/get_reward")
    async def get_reward(request: Request):
        traces, names, reliability = await parsed_body(request, parse_reward)
        request.state.items = len(traces)
        scores = await batcher.score(traces, names) if traces else []
        agg = [trace_scores(s, settings.lam, settings.tau)[settings.aggregate] for s in scores]
        # OpenRLHF reads "rewards", and "scores" (dynamic filtering) when present; it ignores
        # other keys, so the steps' kappa and sigma go beside "step_rewards" when asked for.
        answer = {"rewards": agg, "scores": agg, "step_rewards": [s.mu.tolist() for s in scores]}
        if reliability:
            answer["step_kappa"] = [s.kappa.tolist() for s in scores]
            answer["step_sigma"] = [s.sigma.tolist() for s in scores]
        return JSONResponse(answer)

    # Outermost, added last: every request is counted and timed, those Guard refuses too.
    routes = [r.path for r in app.routes if getattr(r, "path", None)]
    app.add_middleware(Observe, metrics=metrics, paths=routes, access=settings.access_log)
    return app


def run_server(app, sock, settings: ServeOptions, on_started=None) -> bool:
    """Serve ``app`` with uvicorn on the bound socket ``sock`` (``serve_requests.listen_socket``)
    until SIGTERM or SIGINT (the requests in flight are answered first). ``on_started()`` is
    called once the socket accepts connections. False when the server never started (the
    app's startup failed)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and on_started is not None:
                on_started()

    server = Server(uvicorn.Config(app, **uvicorn_options(settings)))
    server.run(sockets=[sock])
    return server.started
