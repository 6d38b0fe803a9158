"""What the reward server tells about itself: Prometheus metrics (``GET /metrics``) and,
with ``--access-log``, one line per request.

``ServerMetrics`` holds its own ``CollectorRegistry`` (never prometheus_client's global
one), so several apps in one process (tests, a server restarted in place) keep apart.
``Observe`` is the outermost ASGI wrapper: it times every HTTP request, refused ones
included (a wrong key, a bad Host), counts it by route and status, and writes the access
line. A route says how many traces a request carried by setting ``request.state.items``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "Observe", "ServerMetrics"]

access_log = logging.getLogger("betaprm.access")

OTHER = "other"
"""The ``path`` label of a request to no known route: scanners' paths never become series."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServerMetrics:
    """The server's metrics, in a registry of its own. ``queue_depth``: how many encoded
    traces wait for the scorer, read at each scrape."""

    def __init__(self, queue_depth: Callable[[], int]):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "betaprm_requests", "HTTP requests answered, by route and status", ["path", "status"], registry=r
        )
        self.errors = Counter(
            "betaprm_request_errors",
            "requests answered with an error, by route and kind: refused (4xx) or failed (5xx)",
            ["path", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            "betaprm_request_duration_seconds",
            "time from a request's arrival to the end of its answer, by route",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_progress = Gauge("betaprm_requests_in_progress", "HTTP requests being answered", registry=r)
        self.batch_traces = Histogram(
            "betaprm_batch_traces",
            "traces per scored batch (what arrived within --max-wait-ms, up to about four forwards of "
            "--max-batch-tokens)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue = Gauge("betaprm_queue_traces", "encoded traces waiting for the scorer", registry=r)
        self.queue.set_function(lambda: float(queue_depth()))

    def batch(self, traces: int) -> None:
        self.batch_traces.observe(traces)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


def _client(scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


class Observe:
    """ASGI middleware around everything else: request counts, errors and latency by route
    (``paths``: the routes; any other path is ``other``), and the access line
    ``CLIENT METHOD PATH STATUS MS ms items=N`` (``items=-`` where no traces were read)
    when ``access`` is set."""

    def __init__(self, app, metrics: ServerMetrics, paths: Iterable[str], access: bool = False):
        self.app = app
        self.metrics = metrics
        self.paths = frozenset(paths)
        self.access = access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # an exception before an answer started: the server answers 500
        scope.setdefault("state", {})

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_progress.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_progress.dec()
            seconds = time.perf_counter() - start
            path = scope.get("path", "")
            label = path if path in self.paths else OTHER
            m = self.metrics
            m.requests.labels(label, str(status)).inc()
            m.latency.labels(label).observe(seconds)
            if status >= 400:
                m.errors.labels(label, "refused" if status < 500 else "failed").inc()
            if self.access:
                items = scope["state"].get("items")
                # The path as it came on the request line (no decoded line breaks), cut short.
                raw = scope.get("raw_path") or path.encode("utf-8", "backslashreplace")
                access_log.info(
                    "%s %s %s %d %.1f ms items=%s",
                    _client(scope),
                    scope.get("method", "-"),
                    raw.decode("latin-1")[:200],
                    status,
                    seconds * 1000,
                    "-" if items is None else items,
                )
