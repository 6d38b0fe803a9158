"""betaprm serve for the people who run it: the port bound before anything says "serving",
the access log, Prometheus metrics at /metrics, and /get_reward's opt-in kappa and sigma,
on real servers on 127.0.0.1 with the tests' tiny BetaPRM."""

import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from betaprm import BetaPRM

from .helpers import wait_healthy
from .test_serve import free_port, prm_dir, stop_process  # noqa: F401  (prm_dir: the tiny BetaPRM, a module fixture)

KEY = {"Authorization": "Bearer k-ops"}
TRACES = [("what is 3 + 4 ?", ["3 + 4 = 7", "so the answer is 7"]), ("compute 12 * 3", ["12 * 3 = 36"])]
REWARD_BODY = {"query": [q + "\n\n".join(s) for q, s in TRACES], "prompts": [q for q, _ in TRACES]}
ACCESS = re.compile(r"^127\.0\.0\.1:\d+ (GET|POST) (\S+) (\d{3}) (\d+\.\d) ms items=(\S+)$")


def http_request(port, method, path, body=None, headers=None):
    """(status, headers, raw body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, dict(resp.getheaders()), resp.read()
    conn.close()
    return out


class OpsServer:
    """``betaprm serve`` with a key and ``extra`` flags, its stdout and stderr in files that
    can be read while it runs; waits until /health answers."""

    def __init__(self, model, out_dir, *extra):
        self.port = free_port()
        self.stdout_path, self.stderr_path = out_dir / "stdout.txt", out_dir / "stderr.txt"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "betaprm", "serve", "--model", str(model), "--port", str(self.port)]
                + ["--device", "cpu", "--api-key-env", "BETAPRM_OPS_KEY", *extra],
                stdout=out,
                stderr=err,
                env={**os.environ, "BETAPRM_OPS_KEY": "k-ops"},
            )
        wait_healthy(self.proc, self.request, self.stderr_path.read_text)

    def request(self, method, path, body=None, key=True):
        return http_request(self.port, method, path, body, KEY if key else None)

    def access_lines(self, n: int) -> list[tuple]:
        """The first ``n`` access-log lines, parsed (written just after each answer is sent)."""
        deadline = time.time() + 10
        while True:
            found = [m.groups() for m in map(ACCESS.match, self.stdout_path.read_text().splitlines()) if m]
            if len(found) >= n or time.time() > deadline:
                return found

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="module")
def ops(prm_dir, tmp_path_factory):  # noqa: F811
    s = OpsServer(prm_dir, tmp_path_factory.mktemp("ops"), "--access-log", "--max-wait-ms", "20")
    yield s
    s.stop()


def test_a_port_in_use_stops_the_command_before_anything_says_serving(prm_dir):  # noqa: F811
    """Another server listens on the port: exit 2 with one message naming the address and
    the fix, before the model loads, and no "serving on" line. Fails on the code before this
    change: it loaded the model, printed "serving ... on http://127.0.0.1:PORT", then uvicorn
    failed to bind and the process exited 3."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.time()
        run = subprocess.run(
            [sys.executable, "-m", "betaprm", "serve", "--model", str(prm_dir), "--port", str(port)]
            + ["--device", "cpu"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        seconds = time.time() - started
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert f"127.0.0.1:{port} is already in use" in run.stderr and "--port" in run.stderr
    assert "serving" not in run.stdout + run.stderr and "Traceback" not in run.stderr
    assert seconds < 60  # a hang guard: it stops at the bind, before torch or the model


def test_serving_is_said_once_the_port_answers(ops):
    """The "serving on" line comes from the started server: the URL with its real port."""
    lines = ops.stdout_path.read_text().splitlines()
    assert sum("serving" in line for line in lines) == 1
    assert f"on http://127.0.0.1:{ops.port}" in next(line for line in lines if "serving" in line)


def test_the_access_log_has_one_line_per_request(ops):
    """--access-log: one stdout line per request, refused ones included: client, method,
    path, status, milliseconds and the traces it carried. Fails on the code before this
    change: there was no --access-log (uvicorn's own log was set to warnings only)."""
    before = len(ops.access_lines(0))
    items = {"items": [{"question": q, "steps": s} for q, s in TRACES] + [{"question": "q", "steps": ["a"]}]}
    assert ops.request("POST", "/v1/score", items)[0] == 200
    assert ops.request("POST", "/get_reward", REWARD_BODY)[0] == 200
    assert ops.request("GET", "/health")[0] == 200
    assert ops.request("POST", "/v1/score", {"question": "q", "steps": ["a"]}, key=False)[0] == 401
    assert ops.request("POST", "/v1/score", {"question": "q"})[0] == 400
    lines = ops.access_lines(before + 5)[before:]
    assert [(m, p, s, i) for m, p, s, _, i in lines] == [
        ("POST", "/v1/score", "200", "3"),
        ("POST", "/get_reward", "200", "2"),
        ("GET", "/health", "200", "-"),
        ("POST", "/v1/score", "401", "-"),
        ("POST", "/v1/score", "400", "-"),
    ]
    assert all(float(ms) >= 0 for _, _, _, ms, _ in lines)


def scrape(server) -> dict:
    """/metrics read with prometheus_client's own parser: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    status, headers, raw = server.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(raw.decode())
        for s in family.samples
    }


def test_metrics_are_prometheus_text_and_move_with_requests(ops):
    """/metrics is Prometheus' text format (read back by prometheus_client's parser):
    requests by route and status, errors, latency, scored batch sizes and the queue, behind
    the key like every route. Fails on the code before this change: /metrics was a 404."""
    status, _, raw = ops.request("GET", "/metrics", key=False)
    assert status == 401 and b"API key" in raw
    before = scrape(ops)
    ok = (("path", "/v1/score"), ("status", "200"))
    score = (("path", "/v1/score"),)
    assert ops.request("POST", "/v1/score", {"question": "q", "steps": ["a", "b"]})[0] == 200
    assert ops.request("POST", "/v1/score", {"items": [{"question": "q", "steps": ["a"]}] * 2})[0] == 200
    assert ops.request("POST", "/v1/score", {"question": 5, "steps": ["a"]})[0] == 400
    assert ops.request("GET", "/nowhere")[0] == 404
    after = scrape(ops)

    def moved(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert moved("betaprm_requests_total", ok) == 2
    assert moved("betaprm_requests_total", (("path", "/v1/score"), ("status", "400"))) == 1
    assert moved("betaprm_request_errors_total", (("kind", "refused"), ("path", "/v1/score"))) == 1
    assert moved("betaprm_requests_total", (("path", "other"), ("status", "404"))) == 1  # no series per path
    assert moved("betaprm_request_duration_seconds_count", score) == 3
    assert moved("betaprm_request_duration_seconds_sum", score) > 0
    assert moved("betaprm_batch_traces_sum") == 3  # three traces scored, in one or more batches
    assert 1 <= moved("betaprm_batch_traces_count") <= 2
    assert after[("betaprm_queue_traces", ())] == 0  # nothing waits between requests
    assert after[("betaprm_requests_in_progress", ())] == 1  # the scrape itself


def test_get_reward_adds_kappa_and_sigma_only_when_asked(ops):
    """OpenRLHF's /get_reward answers mu only; "return_reliability": true adds each step's
    kappa and sigma (those of /v1/score) under keys OpenRLHF ignores, and leaves the rest of
    the answer byte for byte as it is without them. Fails on the code before this change: no
    request could have kappa or sigma from /get_reward."""
    status, _, plain = ops.request("POST", "/get_reward", REWARD_BODY)
    assert status == 200 and list(json.loads(plain)) == ["rewards", "scores", "step_rewards"]
    assert ops.request("POST", "/get_reward", {**REWARD_BODY, "return_reliability": False})[2] == plain
    status, _, raw = ops.request("POST", "/get_reward", {**REWARD_BODY, "return_reliability": True})
    assert status == 200 and raw.startswith(plain[:-1] + b',"step_kappa":[')
    res = json.loads(raw)
    for (q, steps), kappa, sigma in zip(TRACES, res["step_kappa"], res["step_sigma"]):
        _, _, one = ops.request("POST", "/v1/score", {"question": q, "steps": steps})
        want = json.loads(one)
        assert kappa == pytest.approx(want["kappa"], rel=1e-5) and sigma == pytest.approx(want["sigma"], abs=1e-6)
        assert len(kappa) == len(steps)
    status, _, raw = ops.request("POST", "/get_reward", {"query": [], "prompts": [], "return_reliability": True})
    assert status == 200 and json.loads(raw) == {k: [] for k in ("rewards", "scores", "step_rewards")} | {
        "step_kappa": [],
        "step_sigma": [],
    }
    status, _, raw = ops.request("POST", "/get_reward", {**REWARD_BODY, "return_reliability": "yes"})
    assert status == 400 and b"return_reliability" in raw


def test_step_reliability_flag_and_apps_side_by_side(prm_dir):  # noqa: F811
    """--step-reliability turns kappa and sigma on for every /get_reward answer (a request's
    false turns them off); two apps in one process keep their own metrics (a registry each,
    not prometheus_client's global one); without --access-log no access line is written."""
    import uvicorn

    from betaprm import serve

    prm = BetaPRM.from_pretrained(prm_dir)
    port = free_port()
    other = serve.create_app(prm, serve.ServeSettings(port=port))  # would clash on a global registry
    app = serve.create_app(prm, serve.ServeSettings(port=port, step_reliability=True))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("betaprm.access").addHandler(handler)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        while not srv.started:
            time.sleep(0.05)
        status, _, raw = http_request(port, "POST", "/get_reward", REWARD_BODY)
        res = json.loads(raw)
        assert status == 200 and [len(k) for k in res["step_kappa"]] == [len(s) for _, s in TRACES]
        assert all(0 < x <= 0.5 for row in res["step_sigma"] for x in row)
        status, _, raw = http_request(port, "POST", "/get_reward", {**REWARD_BODY, "return_reliability": False})
        assert status == 200 and list(json.loads(raw)) == ["rewards", "scores", "step_rewards"]
        status, _, raw = http_request(port, "GET", "/metrics")
        assert status == 200 and b'betaprm_requests_total{path="/get_reward",status="200"} 2.0' in raw
        assert records == []
        assert other is not app
    finally:
        logging.getLogger("betaprm.access").removeHandler(handler)
        srv.should_exit = True
        thread.join(30)
