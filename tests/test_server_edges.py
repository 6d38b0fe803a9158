"""betaprm serve against slow and hostile clients (a real server process on 127.0.0.1 with
the tests' tiny BetaPRM, small timeouts and caps set by its flags), and the chat reader
against role-marker text inside a question."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from betaprm.chat import ChatTemplateReader

from .chat_templates import chat_tokenizer
from .helpers import wait_healthy
from .test_serve import free_port, prm_dir, stop_process  # noqa: F401  (prm_dir: the tiny BetaPRM, a module fixture)

HEADER_TIMEOUT, BODY_TIMEOUT, MAX_CONNECTIONS, MAX_BUFFERED = 2, 3, 8, 8 * 2**20

if os.name != "posix":  # pragma: no cover - /proc and signals
    pytestmark = pytest.mark.skip("POSIX only")


class LoggedServer:
    """``betaprm serve`` in its own process, its stderr in a file that can be read while it
    runs; waits until /health answers."""

    def __init__(self, model, log_path, *extra):
        self.port = free_port()
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "betaprm", "serve", "--model", str(model), "--port", str(self.port)]
            + ["--device", "cpu", *extra],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )
        wait_healthy(self.proc, self.request, self.log)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def request(self, method, path, body=None, raw: bytes | None = None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        is_json = resp.getheader("content-type", "").startswith("application/json")
        out = resp.status, json.loads(data) if is_json else data.decode(), dict(resp.getheaders())
        conn.close()
        return out

    def head(self, path: str, length: int) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n"
        ).encode()

    def peak_rss_reset(self) -> bool:
        """Reset the process's peak memory (VmHWM); False where Linux does not let us."""
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def memory_mb(self, field: str) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        raise AssertionError(field)

    def stop(self):
        stop_process(self.proc)
        self._log.close()


@pytest.fixture(scope="module")
def edge(prm_dir, tmp_path_factory):  # noqa: F811
    s = LoggedServer(
        prm_dir,
        tmp_path_factory.mktemp("edge") / "server.log",
        *("--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT)),
        *("--max-connections", str(MAX_CONNECTIONS), "--max-buffered-bytes", str(MAX_BUFFERED)),
    )
    yield s
    s.stop()


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes ``sock`` (reading what it sends meanwhile), or None."""
    t0 = time.perf_counter()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return None
    except OSError:  # reset: closed too
        pass
    return time.perf_counter() - t0


def wait_for_log(server: LoggedServer, text: str, seconds: float = 20) -> str:
    deadline = time.time() + seconds
    while text not in (log := server.log()) and time.time() < deadline:
        time.sleep(0.1)
    return log


SMALL = {"question": "q", "steps": ["a b"]}


def test_idle_and_slow_header_sockets_are_closed_and_free_the_connection_cap(edge):
    """Sockets that never send a byte, or send half a request line and stop, are closed after
    --header-timeout, one log line each; while they are open, --max-connections holds
    (a request past it gets 503), and once they are closed requests are answered again.
    Fails on the code before this change: there was no header timeout (50 idle sockets were
    still open 30 s later) and no cap on connections (the flags did not exist)."""
    idle = [socket.create_connection(("127.0.0.1", edge.port)) for _ in range(MAX_CONNECTIONS - 1)]
    idle[0].sendall(b"POST /v1/score HTTP/1.1\r\nHo")
    time.sleep(0.2)
    status, res, _ = edge.request("POST", "/v1/score", SMALL)
    assert status == 503, res  # uvicorn's own answer past the cap
    for s in idle:
        took = closed_within(s, HEADER_TIMEOUT + 15)  # 15: slack for a busy machine, not the timeout
        assert took is not None, "an idle connection was left open"
        s.close()
    assert edge.request("POST", "/v1/score", SMALL)[0] == 200
    log = wait_for_log(edge, "no request headers within --header-timeout")
    assert log.count(f"no request headers within --header-timeout {HEADER_TIMEOUT} s") >= MAX_CONNECTIONS - 1
    assert "Traceback" not in log


def test_a_body_that_stops_gets_408_and_its_connection_closes(edge):
    """A body that stops arriving is answered 408 after --body-timeout, the connection
    closed and one line logged. Fails on the code before this change: the server waited for
    the rest for as long as the socket stayed open (40 such clients held 640 MB)."""
    with socket.create_connection(("127.0.0.1", edge.port)) as s:
        s.sendall(edge.head("/v1/score", 1000) + b'{"question": "q", ')
        t0 = time.perf_counter()
        s.settimeout(BODY_TIMEOUT + 15)
        answer = b""
        while chunk := s.recv(65536):  # to the end: the server closes the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in answer.lower() and b"within 3 s" in answer
    assert time.perf_counter() - t0 >= BODY_TIMEOUT - 0.5
    log = wait_for_log(edge, "body did not arrive within --body-timeout")
    assert "/v1/score's body did not arrive within --body-timeout 3 s (18 bytes came): 408" in log


def test_a_client_that_hangs_up_is_one_log_line(edge):
    """A client gone in the middle of its body is logged in one line. Fails on the code
    before this change: each one logged a ~60-line ClientDisconnect traceback."""
    for path in ("/v1/score", "/get_reward"):
        s = socket.create_connection(("127.0.0.1", edge.port))
        s.sendall(edge.head(path, 1000) + b'{"qu')
        time.sleep(0.2)
        s.close()
    log = wait_for_log(edge, "went away before /get_reward's body arrived")
    assert "went away before /v1/score's body arrived (4 bytes came)" in log
    assert "went away before /get_reward's body arrived (4 bytes came)" in log
    assert "Traceback" not in log and "ClientDisconnect" not in log
    assert edge.request("POST", "/v1/score", SMALL)[0] == 200


def test_a_large_body_waits_for_room_while_small_requests_pass(edge):
    """While a slow client holds room for a 7 MiB body (6 MiB sent), a 3 MiB body waits past
    its first MiB, unread, under --max-buffered-bytes (8 MiB); a small request is answered
    meanwhile, and the large one once the slow client has gone. Fails on the code before
    this change: every body was read and held whatever the others (the flag did not exist)."""
    big = json.dumps({**SMALL, "padding": "x" * (3 * 2**20)}).encode()
    got = {}

    def post_big():
        t0 = time.perf_counter()
        got["status"] = edge.request("POST", "/v1/score", raw=big)[0]
        got["seconds"] = time.perf_counter() - t0

    with socket.create_connection(("127.0.0.1", edge.port)) as slow:
        slow.sendall(edge.head("/v1/score", 7 * 2**20) + b" " * (6 * 2**20))
        time.sleep(0.3)  # read by the server: its room taken
        waiting = threading.Thread(target=post_big)
        waiting.start()
        time.sleep(0.5)
        assert edge.request("POST", "/v1/score", SMALL)[0] == 200
        assert not got, got  # the large one still waits
    waiting.join(30)  # the slow client gone, its room given back
    assert got["status"] == 200 and got["seconds"] > 0.5, got
    assert "Traceback" not in wait_for_log(edge, "went away before /v1/score's body arrived")


def test_a_large_body_without_room_in_time_is_503(edge):
    """A body declared over --max-buffered-bytes has room only alone: while other large
    bodies hold theirs past its --body-timeout, it gets 503 with Retry-After, its connection
    closed. Fails on the code before this change: the flag did not exist."""
    first = socket.create_connection(("127.0.0.1", edge.port))  # room for 6 MiB until its 408 at ~3 s
    first.sendall(edge.head("/v1/score", 6 * 2**20) + b" " * (5 * 2**20))
    time.sleep(0.3)
    alone = socket.create_connection(("127.0.0.1", edge.port))  # 9 MiB: waits for no other; times out at ~3.3 s
    alone.sendall(edge.head("/v1/score", 9 * 2**20) + b" " * (2**20 + 4096))
    time.sleep(1.2)
    second = socket.create_connection(("127.0.0.1", edge.port))  # 1.5 MiB: fits beside the first, held to ~4.5 s
    second.sendall(edge.head("/v1/score", 3 * 2**19) + b" " * (2**20 + 4096))
    try:
        alone.settimeout(BODY_TIMEOUT + 15)
        answer = b""
        while chunk := alone.recv(65536):  # to the end: the server closes the connection
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 503") and b"no room for a body of 9437184 bytes" in answer, answer[:300]
        assert b"retry-after: 1" in answer.lower() and b"connection: close" in answer.lower()
        log = wait_for_log(edge, "'s body waited for room within --body-timeout 3 s")
        assert "bytes came): 503" in log.split("'s body waited for room within --body-timeout 3 s", 1)[1]
    finally:
        for s in (first, alone, second):
            s.close()


def test_headers_over_64_kib_close_the_connection_and_bodies_do_not_count(edge):
    """A request whose line and headers pass 64 KiB is closed (one log line), before the
    server has gathered much of it; a body is no header, however it arrives: its last
    200 KiB in one read are answered. Fails on the code before this change: httptools
    gathered a header of any size (200 MB in 45 s, growing, on one connection)."""
    with socket.create_connection(("127.0.0.1", edge.port)) as s:
        s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{edge.port}\r\nX-Pad: ".encode())
        sent = 0
        try:
            while sent < 8 * 2**20:
                s.sendall(b"a" * 2**16)
                sent += 2**16
        except OSError:
            pass  # closed
        assert closed_within(s, 15) is not None and sent < 8 * 2**20
    assert "request headers over 65536 bytes" in wait_for_log(edge, "request headers over 65536 bytes")
    body = json.dumps({**SMALL, "padding": "x" * 2**20}).encode()
    with socket.create_connection(("127.0.0.1", edge.port)) as s:
        s.sendall(edge.head("/v1/score", len(body)) + body[: -200 * 2**10])
        time.sleep(0.3)  # read: the rest comes in one piece
        s.sendall(body[-200 * 2**10 :])
        s.settimeout(30)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")


def test_a_body_of_millions_of_tiny_values_is_refused_before_it_is_parsed(edge):
    """A 7 MiB ``{"items": [{}, {}, ...]}`` (2.4 million dicts once parsed) and a
    ``/get_reward`` query list of 7 MiB of empty lists are refused (413, naming
    --max-json-values' count) by a scan of the bytes: the server's peak memory grows by far
    less than parsing them would take. Fails on the code before this change: the body was
    parsed whole first (~780 MB for 16 MiB), and then refused for its item count."""
    n = 7 * 2**20 // 3
    bodies = {
        "/v1/score": b'{"items": [' + b"{}," * n + b"{}]}",
        "/get_reward": b'{"query": [' + b"[]," * n + b'[]], "prompts": []}',
    }
    for path, raw in bodies.items():
        reset = edge.peak_rss_reset()
        before = edge.memory_mb("VmRSS")
        t0 = time.perf_counter()
        status, res, _ = edge.request("POST", path, raw=raw)
        assert status == 413 and "JSON values" in res["error"] and "262144" in res["error"], res
        assert time.perf_counter() - t0 < 10  # a hang guard: the scan takes ~0.1 s
        if reset:  # parsed, these bodies take 150-300 MB; the bytes themselves 7 MiB, held twice at most
            assert edge.memory_mb("VmHWM") - before < 60, path


def test_get_reward_checks_max_items_before_any_query_is_read(edge):
    """300 queries (over --max-items 256) are refused at once, before the queries are
    read: even when query 299 is unreadable, the answer is the 413. Fails on the code
    before this change: every query was split first (980,000 tiny ones took 3.5 s), so the
    unreadable one gave 400."""
    queries = ["q\n\na"] * 299 + [7]
    status, res, _ = edge.request("POST", "/get_reward", {"query": queries, "prompts": ["q"] * 300})
    assert status == 413 and "300 traces in one request, more than the server's 256" in res["error"], res


def test_get_reward_prompt_matching_is_linear(edge):
    """A query that is a 4 MiB run of a special token and a prompt equal to its first half
    but for one character: answered (400: the query does not start with its prompt) in
    about 0.15 s. Fails on the code before this change: the prompt was compared at every
    token of the run (quadratic: 1.2 s at 1 MiB, 9.5 s at 4 MiB, 15 s at 3.7 MiB on a
    busier machine)."""
    query = "<|endoftext|>" * (4 * 2**20 // 13)
    half = len(query) // 2
    prompt = query[: half - 1000] + "X" + query[half - 999 : half]
    t0 = time.perf_counter()
    status, res, _ = edge.request("POST", "/get_reward", {"query": [query], "prompts": [prompt]})
    took = time.perf_counter() - t0
    assert status == 400 and "does not start with its prompt" in res["error"], res
    assert took < 3, took  # ~0.15 s, with room for a busy machine; the quadratic match took 9.5 s


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--header-timeout", "0", "--header-timeout must be a number of seconds > 0"),
        ("--body-timeout", "nan", "--body-timeout must be a number of seconds > 0"),
        ("--body-timeout", "inf", "--body-timeout must be a number of seconds > 0"),
        ("--max-connections", "0", "--max-connections and --max-buffered-bytes must be >= 1"),
        ("--max-json-values", "-1", "--max-json-values, --max-connections"),
    ],
)
def test_bad_limits_exit_2(prm_dir, capsys, flag, value, expected):  # noqa: F811
    """Fails on the code before this change: the flags did not exist."""
    from betaprm.cli import main

    assert main(["serve", "--model", str(prm_dir), flag, value]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


# ---------------------------------------------------------------- role-marker text in a question

ROLE_COLON = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    "template,question,clean",
    [
        (ROLE_COLON, "A user: asked 2+3", "A user: asked 2+3"),
        (ROLE_COLON, "two user: markers, user: here", "two user: markers, user: here"),
        (CHATML, "see <|im_start|>user\nasked 2+3", "see user\nasked 2+3"),
        (CHATML, "<|im_start|>user\nasked 2+3", "user\nasked 2+3"),
    ],
)
def test_role_marker_text_inside_a_question_does_not_cut_it(template, question, clean):
    """The text a template writes before a user message, inside the user's own text, is
    not where the message starts: only an occurrence that the template's opening (after
    any padding) or an earlier message's end leads up to is. Single-turn, after earlier
    turns, with and without the generation prompt, left-padded. (The special tokens are
    removed from a question, as before.) Fails on the code before this change: the
    question was cut at the last occurrence ("A user: asked 2+3" became "asked 2+3")."""
    tok = chat_tokenizer("qwen2")  # ChatML's special tokens; the template set here
    tok.chat_template = template
    reader = ChatTemplateReader(tok)
    assert reader.has_template
    earlier = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    for conversation in ([], earlier):
        messages = [*conversation, {"role": "user", "content": question}]
        for gen in (True, False):
            prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert reader.question(prompt) == clean, (prompt, gen)
            assert reader.question(tok.pad_token * 3 + prompt) == clean
    # A whole turn inside a user's text cannot be told from a real one: that stays a cut.
    two = tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False)
    assert reader.question(two) == "b"


def test_a_padded_query_is_read_in_linear_time():
    """The response of a left-padded query: one comparison however long the padding (the
    previous code compared the prompt at every pad token), and the same answer as before
    on real rollouts (tests/test_chat.py)."""
    tok = chat_tokenizer("qwen2.5")
    reader = ChatTemplateReader(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    pad = tok.pad_token
    assert reader.response(pad * 5 + prompt + "r1<|im_end|>", prompt) == "r1<|im_end|>"
    run = pad * 200_000
    near = run[: len(run) // 2 - 100] + "X" + run[len(run) // 2 - 99 : len(run) // 2]
    t0 = time.perf_counter()
    assert reader.response(run + prompt + "r2", prompt) == "r2"
    assert reader.response(run + prompt + "r2", near) == "r2"  # not its prompt: cut after the generation prompt
    assert time.perf_counter() - t0 < 2  # ~0.1 s; quadratic, the near-match alone took 5 s


def test_server_edges_run_concurrently_without_errors(edge):
    """Small requests answered while a slow body, idle sockets and a refused amplifying
    body are in flight at once (the benchmark's mix, small and bounded here)."""
    stop = time.time() + 4
    statuses, errors = [], []

    def small():
        while time.time() < stop:
            try:
                statuses.append(edge.request("POST", "/v1/score", SMALL, timeout=30)[0])
            except Exception as e:  # counted, not raised: the assertion names them
                errors.append(repr(e))

    idle = [socket.create_connection(("127.0.0.1", edge.port)) for _ in range(3)]
    slow = socket.create_connection(("127.0.0.1", edge.port))
    slow.sendall(edge.head("/v1/score", 2**20) + b"{")
    threads = [threading.Thread(target=small) for _ in range(2)]
    for t in threads:
        t.start()
    amp = edge.request("POST", "/v1/score", raw=b'{"items": [' + b"{}," * 10**6 + b"{}]}")[0]
    for t in threads:
        t.join(60)
    for s in [*idle, slow]:
        s.close()
    assert amp == 413 and not errors and statuses and set(statuses) == {200}, (errors, set(statuses))


# ---------------------------------------------------------------- benchmarks/hostile_clients.py

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "hostile_clients.py")


def test_the_hostile_clients_benchmark_explains_itself_and_refuses_bad_phases():
    """Its --help names the runs before and after; an unknown phase is exit 2 (argparse),
    before anything starts."""
    done = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--git-rev" in done.stdout and "--before-src" in done.stdout
    done = subprocess.run([sys.executable, BENCH, "--phases", "nap"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--phases must name some of" in done.stderr


@pytest.mark.slow
def test_the_hostile_clients_benchmark_runs_small(tmp_path):
    """Every hostile client at once against this checkout's server, small and short: the
    table and the JSON come out, small requests are answered 200, the log holds no
    traceback."""
    out = tmp_path / "run.json"
    argv = [sys.executable, BENCH, "--phases", "all", "--seconds", "3", "--small-clients", "2"]
    argv += ["--slow-clients", "2", "--slow-mb", "1.5", "--idle", "2", "--amplifiers", "1", "--amplifier-mb", "1"]
    argv += ["--near-clients", "1", "--near-mib", "0.2", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| all | after |" in done.stdout
    r = json.loads(out.read_text())["results"]["all"]["after"]
    assert r["small_requests"] > 0 and r["small_not_200"] == 0 and r["log_tracebacks"] == 0, r
    assert set(r["hostile"]) == {"slow-bodies", "idle-sockets", "amplifying-json", "near-prompts"}
