"""Several servers of one model (replicas): which one takes the next call, and which are
set aside for a while.

``--base-url`` may name several OpenAI-compatible servers that serve the same model (say
one ``vllm serve`` per GPU). Each call goes to the replica with the fewest calls in flight,
ties taken in turn (round-robin), so a slow replica gets less. A call that fails there
(no connection, a timeout, 429 or 5xx) goes to another replica at once; when every
replica has failed it in one round, the next round starts after the backoff
(``OpenAIGenerator.post_json``). A replica that fails ``fail_limit`` calls in a row is set
aside for ``cool_down`` seconds: calls go to the others meanwhile, and only when every
replica is set aside are they tried anyway (the one back soonest first), so a short
outage of all of them costs retries, not the run. After its cool-down a replica is on
probation: its next failure sets it aside again, a success clears it.

Standard library only; one lock guards the counters (calls run on a thread pool).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import BetaPRMInputError, redact_url

logger = logging.getLogger(__name__)

FAIL_LIMIT = 3
"""Failed calls in a row that set a replica aside."""

COOL_DOWN = 30.0
"""Seconds a replica stays aside before it is tried again."""


def split_urls(text: str | Sequence[str], flag: str = "--base-url") -> list[str]:
    """The base URLs in ``text``: one, or several separated by commas (a list is taken as
    it is); blank pieces (``a,,b``, a trailing comma) are dropped, and the same URL twice is
    refused, naming it. (A comma inside a URL would have to be written %2C; a base URL has
    none, and a password in one is never sent: keys go through ``--api-key-env``.)"""
    pieces = text.split(",") if isinstance(text, str) else [str(u) for u in text]
    urls = [p.strip() for p in pieces if p.strip()]
    if not urls:
        raise BetaPRMInputError(f"{flag} is empty; give the server's base URL, e.g. http://127.0.0.1:8000/v1")
    seen = set()
    for u in urls:
        key = u.rstrip("/")
        if key in seen:
            raise BetaPRMInputError(
                f"{flag} names {redact_url(u)!r} twice; give each server once (several URLs: replicas of one model)"
            )
        seen.add(key)
    return urls


@dataclass
class _Replica:
    url: str
    in_flight: int = 0
    failures_in_row: int = 0
    aside_until: float = 0.0
    calls: int = 0
    failed: int = 0
    set_aside: int = 0


class Replicas:
    """The replicas of one model and their state. ``acquire(avoid)`` picks one for a call
    (an index; None when every replica outside ``avoid`` is set aside while another is not,
    or when ``avoid`` holds them all), ``release(i, error)`` ends the call and records how
    it went. ``stats()``: per URL, calls, failures and times set aside."""

    def __init__(
        self,
        urls: Sequence[str],
        fail_limit: int = FAIL_LIMIT,
        cool_down: float = COOL_DOWN,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not urls:
            raise ValueError("at least one replica URL is needed")
        self.replicas = [_Replica(u) for u in urls]
        self.fail_limit = max(1, fail_limit)
        self.cool_down = cool_down
        self.clock = clock
        self._lock = threading.Lock()
        self._turn = 0

    def __len__(self) -> int:
        return len(self.replicas)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def acquire(self, avoid: set[int] | frozenset[int] = frozenset(), only: int | None = None) -> int | None:
        """A replica for one call, counted in flight until ``release``; ``only``: that
        replica whatever its state (a last try on one the call has not reached)."""
        with self._lock:
            if only is not None:
                self.replicas[only].in_flight += 1
                self.replicas[only].calls += 1
                return only
            now = self.clock()
            n = len(self.replicas)
            up = [i for i in range(n) if self.replicas[i].aside_until <= now]
            if up:
                pool = [i for i in up if i not in avoid]
                if not pool:
                    return None
                least = min(self.replicas[i].in_flight for i in pool)
                # Among the least busy, the first at or after the turn: round-robin on ties.
                i = min(
                    (i for i in pool if self.replicas[i].in_flight == least),
                    key=lambda i: (i - self._turn) % n,
                )
                self._turn = (i + 1) % n
            else:  # every replica is set aside: try the one back soonest rather than give up
                pool = [i for i in range(n) if i not in avoid]
                if not pool:
                    return None
                i = min(pool, key=lambda i: self.replicas[i].aside_until)
            r = self.replicas[i]
            r.in_flight += 1
            r.calls += 1
            return i

    def release(self, i: int, error: str | None = None) -> None:
        """The call on replica ``i`` ended: answered (``error`` None) or failed, for
        ``error``'s reason (a failure worth another try: no connection, a timeout, 429, 5xx)."""
        with self._lock:
            r = self.replicas[i]
            r.in_flight -= 1
            if error is None:
                r.failures_in_row = 0
                return
            r.failed += 1
            r.failures_in_row += 1
            if r.failures_in_row < self.fail_limit:
                return
            # Set aside; back on probation afterwards: one more failure sets it aside again.
            now = self.clock()
            fresh = r.aside_until <= now  # calls sent before it was set aside fail late
            r.aside_until = now + self.cool_down
            r.failures_in_row = self.fail_limit - 1
            r.set_aside += fresh
            others = len(self.replicas) > 1
            others_up = any(x.aside_until <= now for x in self.replicas if x is not r)
        if fresh and others:  # one server alone is tried anyway: nothing is set aside
            logger.warning(
                "%s keeps failing (last: %s): set aside for %g s, %s",
                redact_url(r.url),
                error,
                self.cool_down,
                "calls go to the other servers meanwhile" if others_up else "as are the others (calls still try them)",
            )

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {
                redact_url(r.url): {"calls": r.calls, "failed": r.failed, "set_aside": r.set_aside}
                for r in self.replicas
            }
