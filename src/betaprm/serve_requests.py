"""What the reward server checks of a request before anything reaches the model, from the
address it listens on (``listen_socket``, bound first: a port in use is one message) to how long
a connection takes to send its headers (``http_protocol``, uvicorn's protocol with a header
timeout), the ``Host`` header, the key and the content type of every request (``Guard``, an
ASGI wrapper), and the JSON body: how many values it holds before it is parsed
(``json_values``), its text, numbers and images (``parse_json``, ``parse_trace``,
``image``). A refusal is a ``RequestError``: a 4xx status and a message for the client.

Over 400 lines because these checks are the order a request meets them in, from its
connection to its images, and each is short; split, they would import each other.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hmac
import json
import logging
import math
import os
import re
import socket
from dataclasses import dataclass

import numpy as np

from .errors import BetaPRMInputError
from .image_files import ImageRefused, decode_image
from .numeric import NumberRefused, json_float, number
from .options import DEFAULT_MAX_BATCH_TOKENS
from .options import opt as _f
from .selection import METHODS, method_problems

log = logging.getLogger(__name__)

MAX_LAM = 100.0
"""|lam| at most: S_lin and S_RB weigh sigma (at most 0.5) and a fraction against mu in [0, 1]."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
"""Pixels of one image at most, checked before it is decoded."""


@dataclass
class ServeOptions:
    """How the reward server batches and what it accepts: the settings ``betaprm serve``
    takes as flags and ``serve.ServeSettings`` holds, declared once."""

    max_batch_tokens: int = _f(
        DEFAULT_MAX_BATCH_TOKENS, "tokens per scoring batch (requests arriving together are scored together)"
    )
    max_wait_ms: float = _f(5.0, "how long the first queued trace waits for others to join its batch")
    max_items: int = _f(256, "traces per request at most (413 above)")
    max_request_bytes: int = _f(16 * 2**20, "request body size at most, in bytes (413 above)")
    max_json_values: int = _f(
        2**18,
        "JSON values (array elements and object members) in one request body at most, counted before the body is "
        "parsed (413 above): bounds the memory and time a body's parse can take",
    )
    header_timeout: float = _f(
        10.0,
        "seconds a connection may take to send a request's headers, from when it opens or from its previous "
        "answer; then it is closed (idle sockets that never send a byte included)",
    )
    body_timeout: float = _f(
        30.0, "seconds a request's body may take to arrive whole once its headers are in (408 and closed after)"
    )
    max_connections: int = _f(
        512, "connections open at once at most: a request arriving while that many are open gets 503"
    )
    max_buffered_bytes: int = _f(
        256 * 2**20,
        "bytes of large request bodies (over 1 MiB) held in memory at once, all requests together: past its first "
        "MiB a body waits, unread, until there is room for its length (503 when none came within --body-timeout)",
    )
    max_image_pixels: int = _f(
        DEFAULT_MAX_IMAGE_PIXELS,
        "pixels per image at most, checked before decoding (vision-language models; 400 above)",
    )
    lam: float = _f(0.5, "lambda of S_lin and S_RB (a request may give its own 'lam')")
    tau: float | None = _f(
        None, "S_RB's sigma threshold (a request may give its own 'tau'); without it S_RB is not computed"
    )
    aggregate: str = _f(
        "mean",
        f"/get_reward's reward, a selector's trace score: {', '.join(METHODS)} (betaprm.selection; rb needs --tau)",
        choices=METHODS,
    )
    step_separator: str = _f("\n\n", "/get_reward: the text between two steps of a response")
    allow_no_prompts: bool = _f(
        False,
        "/get_reward: accept requests without 'prompts', reading the question and the response from the "
        "chat-templated query alone (the response starts after the template's last generation prompt)",
    )
    step_reliability: bool = _f(
        False,
        "/get_reward: also answer each step's kappa and sigma, as 'step_kappa' and 'step_sigma' beside "
        "'step_rewards' (OpenRLHF reads neither); a request may ask for them with \"return_reliability\": true, "
        "or leave them out with false",
    )
    access_log: bool = _f(
        False,
        "write one line per request on stdout: client, method, path, status, milliseconds and the traces it "
        "carried (items=N)",
    )

    def option_problems(self) -> list[str]:
        """Every setting out of range, worded with its flag; empty when all are fine."""
        bad = []
        if min(self.max_batch_tokens, self.max_items, self.max_request_bytes, self.max_image_pixels) < 1:
            bad.append("--max-batch-tokens, --max-items, --max-request-bytes and --max-image-pixels must be >= 1")
        if not (math.isfinite(self.lam) and abs(self.lam) <= MAX_LAM):
            bad.append(f"--lam must be a number in [-{MAX_LAM:g}, {MAX_LAM:g}], got {self.lam}")
        if self.tau is not None and not (math.isfinite(self.tau) and self.tau >= 0):
            bad.append(f"--tau must be a number >= 0 (a sigma threshold), got {self.tau}")
        if not (math.isfinite(self.max_wait_ms) and self.max_wait_ms >= 0):
            bad.append(f"--max-wait-ms must be a number >= 0, got {self.max_wait_ms}")
        bad += method_problems(self.aggregate, self.tau, "--aggregate")
        if not self.step_separator:
            bad.append("--step-separator must not be empty")
        if min(self.max_json_values, self.max_connections, self.max_buffered_bytes) < 1:
            bad.append("--max-json-values, --max-connections and --max-buffered-bytes must be >= 1")
        for flag, seconds in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout)):
            if not 0 < seconds < math.inf:  # a comparison: math.isfinite overflows on a huge integer
                bad.append(f"{flag} must be a number of seconds > 0, got {seconds}")
        return bad


def default_allowed_hosts(port: int) -> tuple[str, ...]:
    """The Host values a loopback server accepts: ``127.0.0.1``, ``localhost`` and
    ``[::1]`` with the port (without it too on port 80, where clients leave it out)."""
    names = ("127.0.0.1", "localhost", "[::1]")
    return tuple(f"{n}:{port}" for n in names) + (names if port == 80 else ())


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` for uvicorn to listen on (``Server.run(sockets=
    [...])``), bound before anything else starts so that an address in use stops the command
    at once (exit 2, saying so), before the model loads and before anything says "serving"."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as e:
        raise BetaPRMInputError(f"--host {host!r} is not an address or a name this machine resolves ({e})") from None
    sock = socket.socket(family, kind, proto)
    if os.name == "posix":  # a restart may reuse a port whose closed connections linger (TIME_WAIT)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        where = f"{host or '*'}:{port}"
        if e.errno == errno.EADDRINUSE:
            why = f"{where} is already in use (another server listens there); stop it or choose another --port"
        elif e.errno == errno.EACCES:
            why = f"no permission to listen on {where} (ports below 1024 need privileges); choose another --port"
        elif e.errno == errno.EADDRNOTAVAIL:
            why = f"--host {host} is not an address of this machine; use one of its addresses or 127.0.0.1"
        else:
            why = f"cannot listen on {where}: {e.strerror or e}"
        raise BetaPRMInputError(why) from None
    return sock


class RequestError(Exception):
    """A request the server refuses: ``status`` and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def trace_chars(trace: tuple) -> int:
    return len(trace[0]) + sum(len(x) for x in trace[1])


def request_size(item) -> int:
    return len(item) if isinstance(item, list) else trace_chars(item)


def text_field(obj: dict, key: str, where: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str):
        raise RequestError(400, f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    return v


def number_field(obj: dict, key: str, default, low: float, high: float, rule: str):
    """``obj[key]`` (``default`` when absent) as a float in [low, high] (``math.inf``: no
    bound), checked by ``numeric.number`` (an integer by its size first); 400 otherwise."""
    v = obj.get(key, default)
    if v is None:
        return None
    try:
        x = number(
            v,
            f"field {key!r}",
            low=None if low == -math.inf else low,
            high=None if high == math.inf else high,
            what=f"a finite number {rule}",
        )
    except NumberRefused as e:
        raise RequestError(400, str(e)) from None
    return float(x)


# A \\uD800-\\uDFFF escape: the only way JSON text can carry a surrogate, which no tokenizer encodes.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate(obj, where: str) -> str | None:
    """Where in ``obj`` a string holds a lone surrogate (not UTF-8 encodable), or None."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        found = lone_surrogate(v, f"{where}[{k!r}]" if isinstance(k, str) else f"{where}[{k}]")
        if found:
            return found
    return None


def parse_json(raw: bytes):
    try:
        body = json.loads(
            raw,
            parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")),
            parse_float=json_float,  # 1e400 refused here, as in input files, not read as infinity
        )
    except NumberRefused as e:
        raise RequestError(400, f"the body holds the number {e.got}, beyond float range (about 1.8e308)") from None
    except (ValueError, RecursionError) as e:
        raise RequestError(400, f"the body is not valid JSON: {e}") from None
    if _SURROGATE_ESCAPE.search(raw):
        where = lone_surrogate(body, "body")
        if where:
            raise RequestError(
                400, f"{where} holds a lone surrogate escape (\\ud800-\\udfff without its pair): not text; remove it"
            )
    return body


_COUNTED_CHUNK = 2**18


def json_values(raw: bytes, stop: int) -> int:
    """How many values the JSON text ``raw`` holds in its arrays and objects (its ``,``,
    ``{`` and ``[`` outside strings: elements and members, an empty container counting
    one), counted without parsing it, a piece at a time, stopping once past ``stop`` (the
    count returned is then more than ``stop``, not the whole). A body of 16 MiB holds
    millions of ``{}``, tens of bytes each once parsed: the count refuses it within its
    first pieces, in milliseconds, and reads a body of long strings in about 20 ms."""
    # First those characters anywhere, strings' too (bytes.count, in C): most bodies end here.
    upper = 0
    for i in range(0, len(raw), _COUNTED_CHUNK):
        j = i + _COUNTED_CHUNK
        upper += raw.count(b",", i, j) + raw.count(b"{", i, j) + raw.count(b"[", i, j)
        if upper > stop:
            break
    else:
        return upper
    # Then outside strings, in numpy. A piece ends after a character that is not a backslash,
    # so every escape lies inside one; with its escapes out (backslash pairs, then
    # backslash-quotes, left to right as JSON reads them), each quote left opens or closes a
    # string, and a running count of quotes tells what is inside one.
    n, inside, i = 0, 0, 0
    while i < len(raw) and n <= stop:
        j = min(len(raw), i + _COUNTED_CHUNK)
        while j < len(raw) and raw[j - 1] == ord("\\"):
            j += 1
        piece = raw[i:j]
        if b"\\" in piece:
            piece = piece.replace(b"\\\\", b"").replace(b'\\"', b"")
        c = np.frombuffer(piece, np.uint8)
        parity = (np.cumsum(c == ord('"'), dtype=np.uint8) + inside) & 1  # 1 inside a string (mod 256 is enough)
        structural = (c == ord(",")) | (c == ord("{")) | (c == ord("["))
        n += int(np.count_nonzero(structural & (parity == 0)))
        inside = int(parity[-1]) if len(c) else inside
        i = j
    return n


MAX_IMAGES = 16
"""Images per trace at most."""


def image_from_url(url, where: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS):
    """A ``data:image/...;base64,`` URL as an RGB PIL image (the server reads no files or
    URLs), checked by ``image_files.decode_image`` (pixel cap before decoding, bombs refused)."""
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise RequestError(400, f"{where}: an image must be a data URL, 'data:image/png;base64,...'")
    try:
        raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError) as e:
        raise RequestError(400, f"{where}: not a readable image ({e})") from None
    try:
        im = decode_image(raw, max_pixels, formats=None)
    except ImageRefused as e:
        if e.reason == "pixels":
            w, h = e.size
            raise RequestError(
                400,
                f"{where}: a {w}x{h} image ({w * h} pixels) is over the server's {max_pixels} pixels per image; send "
                "a smaller one",
            ) from None
        if e.reason == "bomb":
            raise RequestError(
                400, f"{where}: an image too large to decode ({e}); send one of at most {max_pixels} pixels"
            ) from None
        raise RequestError(400, f"{where}: not a readable image ({e})") from None
    with im:
        return im.convert("RGB")


def parse_trace(obj, where: str, vision: bool = False, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple:
    if not isinstance(obj, dict):
        raise RequestError(400, f"{where}: must be an object with 'question' and 'steps'")
    question = text_field(obj, "question", where)
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
    return question, steps, [image_from_url(u, f"{where}.images[{i}]", max_pixels) for i, u in enumerate(images)]


def split_host(host: str) -> tuple[str, str | None]:
    """``(name, port or None)`` of a Host value: ``"[::1]:8000"`` -> ``("[::1]", "8000")``."""
    host = host.strip().lower()
    if host.rfind(":") > host.rfind("]") and (host.startswith("[") or host.count(":") == 1):
        name, port = host.rsplit(":", 1)
        return name, port
    return host, None


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """An entry with a port accepts that host and port; one without, the host on any port."""
    if "*" in allowed:
        return True
    name, port = split_host(host)
    for a in allowed:
        a_name, a_port = split_host(a)
        if a_name == name and (a_port is None or a_port == port):
            return True
    return False


class Guard:
    """ASGI middleware run before every route (404s, FastAPI's own pages included): the
    Host header (400), the key (401) and a POST's content type (415)."""

    def __init__(self, app, settings):
        self.app = app
        self.key = None if settings.api_key is None else f"Bearer {settings.api_key}".encode()
        hosts = settings.allowed_hosts or default_allowed_hosts(settings.port)
        self.allowed = tuple(h.strip().lower() for h in hosts if h.strip())

    def problem(self, scope) -> tuple[int, str] | None:
        headers: dict[bytes, list[bytes]] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.lower(), []).append(v)
        hosts = headers.get(b"host", [])
        host = hosts[0].decode("latin-1") if len(hosts) == 1 else None
        if host is None or not host_allowed(host, self.allowed):
            shown = "no Host header" if not hosts else f"Host {', '.join(h.decode('latin-1')[:100] for h in hosts)!r}"
            return 400, (
                f"{shown} is not one this server answers to ({', '.join(self.allowed)}); start it with "
                "--allowed-hosts naming the host clients use (e.g. behind a reverse proxy), or '*' for any"
            )
        if self.key is not None:
            got = (headers.get(b"authorization") or [b""])[0]
            if not hmac.compare_digest(got, self.key):
                return 401, "missing or wrong API key: send 'Authorization: Bearer KEY'"
        if scope.get("method") == "POST":
            ctype = (headers.get(b"content-type") or [b""])[0].decode("latin-1")
            if ctype.split(";", 1)[0].strip().lower() != "application/json":
                return 415, (
                    f"Content-Type {ctype[:100]!r} is not accepted: send the JSON body with "
                    "'Content-Type: application/json'"
                )
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refused = self.problem(scope)
            if refused is not None:
                from fastapi.responses import JSONResponse

                await JSONResponse({"error": refused[1]}, status_code=refused[0])(scope, receive, send)
                return
        await self.app(scope, receive, send)


MAX_HEADER_BYTES = 64 * 2**10
"""Bytes a request's line and headers may take; a connection sending more is closed."""


def peer(client) -> str:
    """A client's address for the log: ``host:port``."""
    return f"{client[0]}:{client[1]}" if client else "a client"


def http_protocol(settings: ServeOptions):
    """uvicorn's HTTP protocol (httptools when installed, else h11, as uvicorn picks) that
    closes a connection whose request line and headers have not arrived within
    ``header_timeout`` seconds of its opening or of its previous answer (the rest of a
    refused body included), or pass ``MAX_HEADER_BYTES``. uvicorn has no such timeout: its
    keep-alive timer starts only after an answer and stops at the next byte, so a socket
    that never sends one, or sends its headers a byte a minute, stayed open for good; and
    httptools gathers a header of any size (h11 stops at 16 KiB by itself)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    counts_headers = hasattr(AutoHTTPProtocol, "on_headers_complete")  # httptools' parser callbacks

    class Protocol(AutoHTTPProtocol):
        _headers_due = None
        _header_bytes = 0
        _headers_done = 0  # requests whose headers were complete
        _in_body = False

        def _awaiting_headers(self) -> bool:
            # uvicorn starts a request's cycle when its headers are complete.
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
            self._headers_due = self.loop.call_later(settings.header_timeout, self._headers_late)

        def _headers_late(self) -> None:
            if self._awaiting_headers() and not self.transport.is_closing():
                log.warning(
                    "closed the connection of %s: no request headers within --header-timeout %g s",
                    peer(self.client),
                    settings.header_timeout,
                )
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def on_headers_complete(self) -> None:
            self._headers_done += 1
            self._in_body = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_body = False
            super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            done, was_in_body = self._headers_done, self._in_body
            super().data_received(data)
            if not counts_headers or self.transport.is_closing():
                return
            if self._headers_done != done:  # a request's headers ended in these bytes
                self._header_bytes = 0
            elif not was_in_body and not self._in_body:  # header bytes, and only they
                self._header_bytes += len(data)
                if self._header_bytes > MAX_HEADER_BYTES:
                    log.warning(
                        "closed the connection of %s: request headers over %d bytes",
                        peer(self.client),
                        MAX_HEADER_BYTES,
                    )
                    self.transport.close()

    return Protocol


def longest_token_chars(tokenizer) -> int:
    """Characters of the tokenizer's longest vocabulary entry: no token stands for more
    text (a byte-level entry has one character per byte, a SentencePiece one per character
    or more), so a trace with more characters than this times the positions cannot fit."""
    try:
        return max(len(t) for t in tokenizer.get_vocab())
    except Exception:  # a tokenizer without a readable vocabulary: a bound no real one exceeds
        return 256
