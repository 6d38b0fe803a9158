"""The OpenAI-compatible client against real local HTTP servers that misbehave: redirects
are refused and nothing reaches the redirect target, an API key is sent only when
--api-key-env names where it is (the same in label, aca and eval-bon), a server that
drips bytes cannot stretch a call past its deadline, and an oversized answer fails
cleanly."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationError, GenerationRequest
from betaprm.generation.factory import BackendOptions, build_generator
from betaprm.generation.openai import OpenAIGenerator

KEY_ENV = "BETAPRM_TEST_KEY"
CHAT = {
    "choices": [{"message": {"role": "assistant", "content": "yes, the answer is \\boxed{7}"}}],
    "usage": {"completion_tokens": 5},
}


class _Server:
    """A real HTTP server on 127.0.0.1: ``reply(handler)`` answers every request, each
    recorded as (method, path, headers)."""

    def __init__(self, reply):
        self.requests = []
        server = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                server.requests.append((self.command, self.path, dict(self.headers)))
                try:
                    reply(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_POST = do_GET = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _send(h, code, data: bytes, length=True, headers=()):
    h.send_response(code)
    h.send_header("Content-Type", "application/json")
    if length:
        h.send_header("Content-Length", str(len(data)))
    for k, v in headers:
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def _ok(h):
    _send(h, 200, json.dumps(CHAT).encode())


def _redirect_to(url):
    def reply(h):
        _send(h, 302, b"", headers=[("Location", url + "/chat/completions")])

    return reply


def _client(url, **kw):
    return OpenAIGenerator(url, "m", backoff=0.01, **kw)


def _pools(path, n=20):
    """Pools already scored (mu, kappa, sigma), so eval-bon only checks answers."""
    steps = [["3 + 5 = 8", "The answer is \\boxed{8}"], ["3 + 4 = 7", "The answer is \\boxed{7}"]]
    recs = [
        {
            "id": f"p{i}",
            "question": f"q{i}",
            "answer": "7",
            "candidates": [
                {"steps": s, "mu": [0.5, 0.6 + 0.1 * j], "kappa": [4, 4], "sigma": [0.1, 0.1]}
                for j, s in enumerate(steps)
            ],
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# ---------------------------------------------------------------- redirects


def test_generation_refuses_a_redirect_and_nothing_reaches_its_target():
    """Fails before this change: urllib followed the 302 to the other server, as a GET that
    still carried the Authorization header, and took that server's reply as the answer."""
    with _Server(_ok) as elsewhere, _Server(_redirect_to(elsewhere.url)) as srv:
        t0 = time.perf_counter()
        with pytest.raises(
            BetaPRMInputError, match=r"HTTP 302, a redirect to .*127\.0\.0\.1.*redirects are not followed.*--base-url"
        ) as e:
            _client(srv.url, api_key="secret-key").generate([GenerationRequest("q", [], 1)])
        assert srv.url in str(e.value) and elsewhere.url in str(e.value)
        assert len(srv.requests) == 1  # refused at once, not retried
        assert elsewhere.requests == []
        assert time.perf_counter() - t0 < 60  # only a hang: not retried is checked by the count above


def test_judge_refuses_a_redirect_exit_2_and_the_key_stays_home(tmp_path, monkeypatch, capsys):
    """Fails before this change: eval-bon sent OPENAI_API_KEY to the judge URL, followed its
    302 with the key to the other host, and read that host's reply as the verdict."""
    monkeypatch.setenv(KEY_ENV, "secret-key")
    pools = _pools(tmp_path / "bench.jsonl")
    with _Server(_ok) as elsewhere, _Server(_redirect_to(elsewhere.url)) as judge:
        rc = main(
            [
                "eval-bon",
                "--pools",
                str(pools),
                "--judge-url",
                judge.url,
                "--judge-model",
                "j",
                "--api-key-env",
                KEY_ENV,
            ]
        )
        assert rc == 2
        err = capsys.readouterr().err
        assert "redirect to" in err and elsewhere.url in err and "--judge-url" in err and "Traceback" not in err
        assert elsewhere.requests == []
        assert judge.requests and all(h.get("Authorization") == "Bearer secret-key" for _, _, h in judge.requests)


# ---------------------------------------------------------------- API keys


def test_eval_bon_judge_gets_a_key_only_with_api_key_env(tmp_path, monkeypatch):
    """Fails before this change: eval-bon read OPENAI_API_KEY by itself and sent it to any
    --judge-url, and had no --api-key-env."""
    monkeypatch.setenv("OPENAI_API_KEY", "ambient-key")
    monkeypatch.setenv(KEY_ENV, "chosen-key")
    pools = _pools(tmp_path / "bench.jsonl")
    with _Server(_ok) as judge:
        assert (
            main(
                [
                    "eval-bon",
                    "--pools",
                    str(pools),
                    "--judge-url",
                    judge.url,
                    "--judge-model",
                    "j",
                    "--out",
                    str(tmp_path / "a.json"),
                ]
            )
            == 0
        )
        assert judge.requests and all("Authorization" not in h for _, _, h in judge.requests)
        n = len(judge.requests)
        assert (
            main(
                [
                    "eval-bon",
                    "--pools",
                    str(pools),
                    "--judge-url",
                    judge.url,
                    "--judge-model",
                    "j",
                    "--api-key-env",
                    KEY_ENV,
                    "--out",
                    str(tmp_path / "b.json"),
                ]
            )
            == 0
        )
        assert len(judge.requests) > n and all(
            h.get("Authorization") == "Bearer chosen-key" for _, _, h in judge.requests[n:]
        )


def test_openai_backend_gets_a_key_only_with_api_key_env(tmp_path, monkeypatch):
    """Fails before this change: the openai backend read OPENAI_API_KEY when no variable
    was named (--api-key-env defaulted to it), so a key went out unasked."""
    monkeypatch.setenv("OPENAI_API_KEY", "ambient-key")
    monkeypatch.setenv(KEY_ENV, "chosen-key")
    with _Server(_ok) as srv:
        build_generator(BackendOptions(backend="openai", policy="m", base_url=srv.url)).generate(
            [GenerationRequest("q", [], 1)]
        )
        assert len(srv.requests) == 1 and "Authorization" not in srv.requests[0][2]
        # Through the CLI: `betaprm label --backend openai --api-key-env NAME`.
        src = tmp_path / "traces.jsonl"
        src.write_text(
            json.dumps({"id": "a", "question": "q", "answer": "7", "steps": ["3 + 4 = 7", "The answer is 7"]}) + "\n"
        )
        rc = main(
            [
                "label",
                "--backend",
                "openai",
                "--policy",
                "m",
                "--base-url",
                srv.url,
                "--input",
                str(src),
                "--out",
                str(tmp_path / "l.jsonl"),
                "--n",
                "2",
                "--api-key-env",
                KEY_ENV,
            ]
        )
        assert rc == 0
        assert len(srv.requests) > 1 and all(
            h.get("Authorization") == "Bearer chosen-key" for _, _, h in srv.requests[1:]
        )


@pytest.mark.parametrize("value", [None, ""])
@pytest.mark.parametrize("command", ["label", "aca", "eval-bon"])
def test_unset_key_variable_exits_2_naming_it(tmp_path, monkeypatch, capsys, command, value):
    """Fails before this change: an unset variable silently sent no key (label, aca), and
    eval-bon had no --api-key-env at all (argparse exit 2 without naming a variable)."""
    if value is None:
        monkeypatch.delenv(KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(KEY_ENV, value)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "answer": "7", "steps": ["The answer is 7"]}) + "\n")
    out = str(tmp_path / "o.jsonl")
    argv = {
        "label": ["label", "--backend", "openai", "--policy", "m", "--input", str(src), "--out", out],
        "aca": [
            "aca",
            "--backend",
            "openai",
            "--policy",
            "m",
            "--problems",
            str(src),
            "--model",
            str(tmp_path),
            "--out",
            out,
        ],
        "eval-bon": [
            "eval-bon",
            "--pools",
            str(_pools(tmp_path / "bench.jsonl")),
            "--judge-url",
            "http://127.0.0.1:9/v1",
            "--judge-model",
            "j",
        ],
    }[command]
    assert main(argv + ["--api-key-env", KEY_ENV]) == 2
    err = capsys.readouterr().err
    assert (
        f"--api-key-env {KEY_ENV}: the environment variable {KEY_ENV} is unset or empty" in err
        and "Traceback" not in err
    )


# ---------------------------------------------------------------- deadlines and size


def _drip(what):
    """Answer one byte every 0.2 s: the status line and headers too (``what="all"``), or
    only the body after prompt headers (``what="body"``)."""

    def reply(h):
        data = json.dumps(CHAT).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        if what == "body":
            h.wfile.write(head)
            h.wfile.flush()
            head = b""
        for b in head + data:
            h.wfile.write(bytes([b]))
            h.wfile.flush()
            time.sleep(0.2)

    return reply


@pytest.mark.parametrize("what", ["all", "body"])
def test_a_dripping_server_cannot_stretch_the_call_past_its_deadline(what):
    """Fails before this change: the timeout bounded each read, so a server sending a byte
    every 0.2 s held a 1-second call for as long as it kept dripping (here ~20 s)."""
    with _Server(_drip(what)) as srv:
        t0 = time.perf_counter()
        with pytest.raises(GenerationError, match=r"no answer within 1 s after 1 attempts"):
            _client(srv.url, timeout=1.0, max_retries=0).generate([GenerationRequest("q", [], 1)])
        assert time.perf_counter() - t0 < 10  # only the bug: a drip held the call ~20 s; 1 s is the deadline


@pytest.mark.parametrize("length", [True, False])
def test_an_oversized_answer_fails_cleanly(length):
    """Fails before this change: the client read any answer whole into memory, however
    large (there was no cap)."""

    def huge(h):
        data = json.dumps({**CHAT, "padding": "x" * 50_000}).encode()
        if not length:  # no Content-Length: the answer ends when the connection closes
            h.close_connection = True
        _send(h, 200, data, length=length)

    with _Server(huge) as srv:
        with pytest.raises(
            GenerationError, match=rf"{srv.url}/chat/completions sent an answer larger than 10000 bytes"
        ):
            _client(srv.url, max_response_bytes=10_000, max_retries=2).generate([GenerationRequest("q", [], 1)])
        assert len(srv.requests) == 1  # not retried
        # Within the cap, the same answer is read.
        (comps,) = _client(srv.url, max_response_bytes=1_000_000).generate([GenerationRequest("q", [], 1)])
        assert comps[0].n_tokens == 5


def test_a_base_url_that_is_not_http_is_an_input_error():
    """Fails before this change: a file:// or schemeless URL went to urllib and came back,
    after every retry, as "cannot connect"."""
    for url in ("file:///etc/passwd", "127.0.0.1:8000/v1"):
        with pytest.raises(BetaPRMInputError, match="not an http:// or https:// URL"):
            _client(url)


@pytest.mark.parametrize(
    "flag,value,expected",
    [
        ("--request-timeout", "nan", "--request-timeout must be a number of seconds > 0"),
        ("--request-timeout", "-5", "--request-timeout must be a number of seconds > 0"),
        ("--check-timeout", "nan", "--check-timeout must be a number of seconds > 0"),
        ("--base-url", "http://127.0.0.1:80000/v1", "has a bad port"),
    ],
)
def test_bad_http_and_check_options_exit_2(tmp_path, capsys, flag, value, expected):
    """Before: socket.settimeout(nan) and a port over 65535 raised ValueError tracebacks,
    and --check-timeout nan never killed a hung check."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "question": "q", "answer": "7", "steps": ["The answer is 7"]}) + "\n")
    argv = [
        "label",
        "--backend",
        "openai",
        "--policy",
        "m",
        "--input",
        str(src),
        "--out",
        str(tmp_path / "o.jsonl"),
        flag,
        value,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
