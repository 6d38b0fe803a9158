"""betaprm serve: a real server process on 127.0.0.1 with a tiny BetaPRM."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from betaprm import BetaPRM
from betaprm.reward import StepRewards
from betaprm.scoring import score_pool_file, score_traces

from .chat_templates import chat_tokenizer
from .helpers import make_lm_dir, wait_healthy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc) -> None:
    """SIGTERM (the server finishes in-flight requests), then SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Server:
    """``betaprm serve`` in its own process; waits until /health answers (asked with
    ``poll_headers``: the key, a Host the server accepts)."""

    def __init__(self, model, *extra, env=None, poll_headers=None):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "betaprm",
                "serve",
                "--model",
                str(model),
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        wait_healthy(self.proc, lambda m, p: self.request(m, p, headers=poll_headers), self.proc.stderr.read)

    def request(self, method, path, body=None, headers=None, raw: bytes | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        out = resp.status, json.loads(resp.read() or b"null")
        conn.close()
        return out

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    import torch

    d = tmp_path_factory.mktemp("serve")
    prm = BetaPRM.from_backbone(str(make_lm_dir(d / "lm")))
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    prm.save_pretrained(d / "prm")
    return d / "prm"


@pytest.fixture(scope="module")
def server(prm_dir):
    s = Server(prm_dir, "--max-items", "64", "--max-wait-ms", "20", "--tau", "0.2", "--max-request-bytes", "1000000")
    yield s
    s.stop()


TRACES = [
    ("what is 3 + 4 ?", ["3 + 4 = 7", "so the answer is 7"]),
    ("compute 12 * 3", ["12 * 3 = 36"]),
    ("add 1 and 2", ["1 + 2 = 3", "3 + 0 = 3", "the answer is 3"]),
]


def test_score_endpoint_equals_betaprm_score(server, prm_dir, tmp_path):
    pools = tmp_path / "pools.jsonl"
    pools.write_text(json.dumps({"id": "p", "question": "q", "candidates": [{"steps": s} for _, s in TRACES]}) + "\n")
    prm = BetaPRM.from_pretrained(prm_dir)
    score_pool_file(prm, pools, tmp_path / "scored.jsonl", show_progress=False)
    offline = json.loads((tmp_path / "scored.jsonl").read_text())["candidates"]
    status, res = server.request("POST", "/v1/score", {"items": [{"question": "q", "steps": s} for _, s in TRACES]})
    assert status == 200 and len(res["results"]) == 3
    for r, c in zip(res["results"], offline):
        for k in ("mu", "kappa", "sigma"):
            np.testing.assert_allclose(r[k], c[k], rtol=1e-5, atol=1e-6)
        mu, sigma = np.array(c["mu"]), np.array(c["sigma"])
        assert r["scores"]["mean"] == pytest.approx(mu.mean(), abs=1e-6) and r["scores"]["min"] == pytest.approx(
            mu.min(), abs=1e-6
        )
        assert r["scores"]["lin"] == pytest.approx((mu - 0.5 * sigma).mean(), abs=1e-6)
        assert r["scores"]["rb"] == pytest.approx(mu.mean() - 0.5 * (sigma > 0.2).mean(), abs=1e-6)
    # One trace, and a request's own lambda.
    status, one = server.request("POST", "/v1/score", {"question": "q", "steps": TRACES[0][1], "lam": 1.0})
    assert status == 200 and one["mu"] == pytest.approx(res["results"][0]["mu"], abs=1e-6)
    assert one["scores"]["lin"] == pytest.approx(
        float(np.mean(np.array(one["mu"]) - np.array(one["sigma"]))), abs=1e-6
    )


def test_get_reward_is_openrlhfs_contract(server, prm_dir):
    prompts = [q for q, _ in TRACES]
    queries = [q + "\n\n".join(s) for q, s in TRACES]
    status, res = server.request("POST", "/get_reward", {"query": queries, "prompts": prompts})
    assert status == 200 and len(res["rewards"]) == 3
    local = score_traces(BetaPRM.from_pretrained(prm_dir), TRACES)
    for reward, steps, s in zip(res["rewards"], res["step_rewards"], local):
        assert steps == pytest.approx(s.mu.tolist(), abs=1e-5) and reward == pytest.approx(s.mu.mean(), abs=1e-5)


# OpenRLHF's rollouts: a conversation (rendered with the policy's chat template), the
# steps the policy wrote and what follows them in the query (end of turn, eos, padding).
SYSTEM = {"role": "system", "content": "You are a careful math tutor."}
EARLIER = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello! Ask me a math question."},
]
ROLLOUTS = [
    ([SYSTEM, *EARLIER, {"role": "user", "content": "what is 3 + 4 ?\nShow your steps."}], TRACES[0][1], "<|im_end|>"),
    ([{"role": "user", "content": "compute 12 * 3"}], TRACES[1][1], "<|im_end|><|endoftext|>"),
    ([SYSTEM, {"role": "user", "content": "add 1 and 2"}], TRACES[2][1], "<|im_end|>"),
]


def openrlhf_body(tok, rollouts, pad="", cut=0):
    """The body OpenRLHF's client posts: each prompt rendered with ``apply_chat_template(...,
    tokenize=False, add_generation_prompt=True)``, each query ``decode(prompt_ids +
    response_ids, skip_special_tokens=False)``; ``pad``: the padding around queries of
    OpenRLHF <= 0.7.5; ``cut``: prompt tokens left-truncated off the query."""
    prompts, queries = [], []
    for messages, steps, tail in rollouts:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False)["input_ids"][cut:]
        ids += tok("\n\n".join(steps) + tail, add_special_tokens=False)["input_ids"]
        prompts.append(prompt)
        queries.append(pad * 2 + tok.decode(ids, skip_special_tokens=False) + pad)
    return {"query": queries, "prompts": prompts, "labels": [""] * len(rollouts)}


def assert_rewards_are_v1_scores(server, res, rollouts):
    """``/get_reward``'s rewards (and scores) are ``/v1/score``'s mean on the plain question
    (the last user message) and the steps; its step rewards the steps' mu."""
    assert len(res["rewards"]) == len(rollouts) and res["scores"] == res["rewards"]
    for reward, step_rewards, (messages, steps, _) in zip(res["rewards"], res["step_rewards"], rollouts):
        status, want = server.request("POST", "/v1/score", {"question": messages[-1]["content"], "steps": steps})
        assert status == 200
        assert reward == pytest.approx(want["scores"]["mean"], abs=1e-6)
        assert step_rewards == pytest.approx(want["mu"], abs=1e-6)


@pytest.fixture(scope="module")
def smollm2_server(prm_dir, smollm2_tokenizer, tmp_path_factory):
    """The tiny BetaPRM, told the policy is SmolLM2-135M-Instruct (--policy-tokenizer)."""
    d = tmp_path_factory.mktemp("smollm2") / "tok"
    smollm2_tokenizer.save_pretrained(d)
    s = Server(prm_dir, "--policy-tokenizer", str(d))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    """A tiny BetaPRM whose own tokenizer has Qwen2.5-Instruct's chat template and special
    tokens (no --policy-tokenizer), started with --allow-no-prompts."""
    import torch

    from betaprm.tiny import tiny_causal_lm

    d = tmp_path_factory.mktemp("qwen")
    tok = chat_tokenizer("qwen2.5")
    tiny_causal_lm(len(tok), arch="qwen2", hidden_size=32).save_pretrained(d / "lm")
    tok.save_pretrained(d / "lm")
    prm = BetaPRM.from_backbone(str(d / "lm"))
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    prm.save_pretrained(d / "prm")
    s = Server(d / "prm", "--allow-no-prompts")
    s.tokenizer = tok
    yield s
    s.stop()


def test_get_reward_reads_openrlhf_chat_prompts_with_a_policy_tokenizer(smollm2_server, smollm2_tokenizer):
    """OpenRLHF's exact request (SmolLM2's chat template, a system message, earlier turns,
    responses ending with <|im_end|> and eos): the rewards are /v1/score's on the last user
    message and the steps, one request per rollout (OpenRLHF today) or all in one (0.8-0.9).
    Fails on the previous code: it scored the rendered prompt, role tags and all, as the
    question and kept <|im_end|> in the last step."""
    for rollout in ROLLOUTS:
        status, res = smollm2_server.request("POST", "/get_reward", openrlhf_body(smollm2_tokenizer, [rollout]))
        assert status == 200, res
        assert_rewards_are_v1_scores(smollm2_server, res, [rollout])
    status, res = smollm2_server.request("POST", "/get_reward", openrlhf_body(smollm2_tokenizer, ROLLOUTS))
    assert status == 200, res
    assert_rewards_are_v1_scores(smollm2_server, res, ROLLOUTS)


def test_get_reward_reads_qwen_prompts_with_the_prms_own_template(qwen_server):
    """Qwen2.5-Instruct's template (its default system prompt where none is given) from the
    PRM's own tokenizer: rewards equal /v1/score's, also for queries padded as OpenRLHF <=
    0.7.5 sent them and for prompts left-truncated in the query. Fails on the previous code:
    the question was the rendered prompt, and <|im_end|> and the padding stayed in the
    steps (a padded query did not even start with its prompt)."""
    tok = qwen_server.tokenizer
    for body in (
        openrlhf_body(tok, ROLLOUTS),
        openrlhf_body(tok, ROLLOUTS, pad="<|endoftext|>"),
        openrlhf_body(tok, ROLLOUTS, cut=4),
    ):
        status, res = qwen_server.request("POST", "/get_reward", body)
        assert status == 200, res
        assert_rewards_are_v1_scores(qwen_server, res, ROLLOUTS)


def test_get_reward_without_prompts_is_a_400_unless_allowed(smollm2_server, smollm2_tokenizer, qwen_server):
    """Without "prompts" the server says what is missing (400) unless started with
    --allow-no-prompts: then the question and the response come from the query alone.
    Fails on the previous code: the whole query, prompt and all, silently became step 1."""
    body = openrlhf_body(smollm2_tokenizer, ROLLOUTS[:1])
    del body["prompts"]
    status, res = smollm2_server.request("POST", "/get_reward", body)
    assert status == 400 and "'prompts' is missing" in res["error"] and "--allow-no-prompts" in res["error"]
    body = openrlhf_body(qwen_server.tokenizer, ROLLOUTS)
    del body["prompts"]
    status, res = qwen_server.request("POST", "/get_reward", body)
    assert status == 200, res
    assert_rewards_are_v1_scores(qwen_server, res, ROLLOUTS)
    status, res = qwen_server.request("POST", "/get_reward", {"query": ["what is 3 + 4 ? 3 + 4 = 7"]})
    assert status == 400 and "no generation prompt" in res["error"]


def test_get_reward_answers_empty_lists(server):
    """OpenRLHF's client splits a batch over its servers and can send one empty lists: the
    answer is empty lists. Fails on the previous code: an empty 'query' was a 400, which
    OpenRLHF retries and then drops the whole batch's rewards."""
    status, res = server.request("POST", "/get_reward", {"query": [], "prompts": [], "labels": []})
    assert status == 200 and res == {"rewards": [], "scores": [], "step_rewards": []}


def test_health_and_models(server):
    status, h = server.request("GET", "/health")
    assert status == 200 and h["status"] == "ok"
    status, m = server.request("GET", "/v1/models")
    assert status == 200 and m["data"][0]["marker"] == "<prm>" and m["data"][0]["max_positions"] == 1024


@pytest.mark.parametrize(
    "body,raw,status,message",
    [
        (None, b"{not json", 400, "not valid JSON"),
        (None, b'{"question": "q", "steps": [NaN]}', 400, "not valid JSON"),
        ({"question": "q"}, None, 400, "'steps' must be a non-empty list"),
        ({"question": 5, "steps": ["a"]}, None, 400, "'question' must be a string"),
        ({"question": "q", "steps": ["a <prm> b"]}, None, 400, "contains the marker text"),
        ({"question": "q", "steps": ["word " * 2000]}, None, 413, "more than the model's 1024 positions"),
        ({"items": [{"question": "q", "steps": ["a"]}] * 65}, None, 413, "more than the server's 64"),
        ({"question": "q", "steps": ["a"], "images": ["x.png"]}, None, 400, "text-only"),
        ({"question": "q", "steps": ["a"], "lam": "x"}, None, 400, "'lam' must be a finite number"),
    ],
)
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, body, raw, status, message):
    got, res = server.request("POST", "/v1/score", body, raw=raw)
    assert got == status and message in res["error"], res
    assert server.request("POST", "/v1/score", {"question": "q", "steps": ["a"]})[0] == 200


def test_concurrent_requests_are_batched_and_answered_in_order(server, prm_dir):
    """32 clients at once: every answer is its own trace's, and traces shared forwards."""
    local = score_traces(BetaPRM.from_pretrained(prm_dir), [("q", [f"{i} + 1 = {i + 1}", "done"]) for i in range(32)])
    before = server.request("GET", "/health")[1]
    answers = [None] * 32

    def client(i):
        answers[i] = server.request("POST", "/v1/score", {"question": "q", "steps": [f"{i} + 1 = {i + 1}", "done"]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (status, res), s in zip(answers, local):
        assert status == 200 and res["mu"] == pytest.approx(s.mu.tolist(), abs=1e-5)
    after = server.request("GET", "/health")[1]
    assert after["traces"] - before["traces"] == 32 and after["batches"] - before["batches"] < 32


def test_a_client_killed_mid_request_does_not_disturb_others(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(
        f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n".encode()
        + b'Content-Length: 1000\r\n\r\n{"question": '
    )
    s.close()  # gone before its body arrived
    s2 = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"items": [{"question": "q", "steps": ["a b c"] * 20}] * 64}).encode()
    s2.sendall(
        f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n".encode()
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    s2.close()  # gone while its traces are scored
    for _ in range(3):
        assert server.request("POST", "/v1/score", {"question": "q", "steps": ["a"]})[0] == 200


def test_step_rewards_local_and_remote_agree(server, prm_dir):
    """search-and-learn's interface: score(questions, outputs) -> rewards per step."""
    questions = ["what is 3 + 4 ?", "compute 12 * 3"]
    outputs = [["3 + 4 = 7\n\nso the answer is 7", "3 + 4 = 8\n\nthe answer is 8"], ["12 * 3 = 36"]]
    local = StepRewards(prm=BetaPRM.from_pretrained(prm_dir), value="lin").score(questions, outputs)
    remote = StepRewards(url=f"http://127.0.0.1:{server.port}", value="lin").score(questions, outputs)
    assert [[len(r) for r in q] for q in local] == [[2, 2], [1]]
    for lq, rq in zip(local, remote):
        for lr, rr in zip(lq, rq):
            assert rr == pytest.approx(lr, abs=1e-5)


def test_api_key_and_graceful_shutdown(prm_dir):
    """With --api-key-env a request without the key is 401; on SIGTERM the requests in
    flight are answered before the process exits (0)."""
    srv = Server(
        prm_dir,
        "--api-key-env",
        "BETAPRM_SERVE_KEY",
        "--max-wait-ms",
        "50",
        env={"BETAPRM_SERVE_KEY": "k1"},
        poll_headers={"Authorization": "Bearer k1"},
    )
    try:
        status, res = srv.request("POST", "/v1/score", {"question": "q", "steps": ["a"]})
        assert status == 401 and "API key" in res["error"]
        auth = {"Authorization": "Bearer k1"}
        assert srv.request("POST", "/v1/score", {"question": "q", "steps": ["a"]}, headers=auth)[0] == 200
        big = {"items": [{"question": "q", "steps": [f"step {j} " * 20 for j in range(12)]}] * 64}
        answers = []
        threads = [
            threading.Thread(
                target=lambda: answers.append((srv.request("POST", "/v1/score", big, headers=auth)[0], time.time()))
            )
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the requests are in, being scored
        signalled = time.time()
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert [a for a, _ in answers] == [200] * 8
        assert any(t > signalled for _, t in answers)  # some were answered after the signal: drained
        # uvicorn ends by re-raising the signal it handled, once the requests are done.
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        srv.stop()


def test_a_vision_language_betaprm_is_served_with_data_url_images(tmp_path):
    """A tiny Qwen2.5-VL BetaPRM behind `betaprm serve`: images as data URLs give the
    scores of the offline scorer on the same image files; a text-only server refuses them."""
    import base64

    from PIL import Image

    from betaprm.tiny import save_vlm_dir, tiny_vlm

    model, proc = tiny_vlm("qwen2_5_vl")
    save_vlm_dir(model, proc, tmp_path / "vlm")
    prm = BetaPRM.from_backbone(str(tmp_path / "vlm"))
    prm.save_pretrained(tmp_path / "prm")
    rng = np.random.default_rng(0)
    paths = []
    for i, (w, h) in enumerate([(40, 30), (28, 56)]):
        paths.append(tmp_path / f"i{i}.png")
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(paths[-1])
    url = [f"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}" for p in paths]
    traces = [
        ("what is in the picture ?", ["a square", "the answer is square"], [str(paths[0])]),
        ("compare them", ["the first is wider"], [str(paths[0]), str(paths[1])]),
        ("no image", ["1 + 1 = 2"], []),
    ]
    want = score_traces(prm.eval(), traces)
    s = Server(tmp_path / "prm")
    try:
        items = [{"question": q, "steps": st, "images": url[: len(im)]} for q, st, im in traces]
        status, body = s.request("POST", "/v1/score", {"items": items})
        assert status == 200, body
        for got, w in zip(body["results"], want):
            np.testing.assert_allclose(got["mu"], w.mu, atol=1e-5)
            np.testing.assert_allclose(got["kappa"], w.kappa, rtol=1e-5)
        status, body = s.request(
            "POST", "/v1/score", {"question": "q", "steps": ["a"], "images": ["file:///etc/passwd"]}
        )
        assert status == 400 and "data URL" in body["error"]
        status, body = s.request(
            "POST", "/v1/score", {"question": "q", "steps": ["a"], "images": ["data:image/png;base64,AAAA"]}
        )
        assert status == 400 and "not a readable image" in body["error"]
        assert s.request("GET", "/health")[0] == 200  # still serving
    finally:
        s.stop()


# ---------------------------------------------------------------- nothing the user did not ask for


def raw_http(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict]:
    """Send ``head`` (request line and headers, no blank line) and ``body`` as they are; the
    status and the JSON answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1] or b"null")


@pytest.fixture(scope="module")
def guarded(prm_dir):
    """A server with a key, --served-model-name and --allowed-hosts (as behind a proxy)."""
    s = Server(
        prm_dir,
        "--api-key-env",
        "BETAPRM_SERVE_KEY",
        "--served-model-name",
        "rm-1",
        "--allowed-hosts",
        "rm.internal:5000, localhost",
        env={"BETAPRM_SERVE_KEY": "k2"},
        poll_headers={"Authorization": "Bearer k2", "Host": "rm.internal:5000"},
    )
    yield s
    s.stop()


def test_the_key_is_required_on_every_route(guarded):
    """With a key set, every route answers 401 without it (FastAPI's own pages and unknown
    paths too). Fails on the code before this change: /health, /v1/models, /docs and
    /openapi.json answered without the key."""
    host = {"Host": "rm.internal:5000"}
    for path in ("/health", "/v1/models", "/docs", "/openapi.json", "/nowhere"):
        status, res = guarded.request("GET", path, headers=host)
        assert status == 401 and "API key" in res["error"], (path, res)
        status, res = guarded.request("GET", path, headers={**host, "Authorization": "Bearer wrong"})
        assert status == 401, path
    assert guarded.request("GET", "/health", headers={**host, "Authorization": "Bearer k2"})[0] == 200


def test_models_shows_a_name_never_a_path(server, guarded, prm_dir):
    """/v1/models names the model by its folder's base name (or --served-model-name), and
    no answer holds the server's file paths. Fails on the code before this change: the id
    was the absolute path the server was started with."""
    status, m = server.request("GET", "/v1/models")
    assert status == 200 and m["data"][0]["id"] == prm_dir.name
    assert str(prm_dir.parent) not in json.dumps(m)
    auth = {"Host": "rm.internal:5000", "Authorization": "Bearer k2"}
    status, m = guarded.request("GET", "/v1/models", headers=auth)
    assert status == 200 and m["data"][0]["id"] == "rm-1"


def test_a_post_that_is_not_json_is_415(server):
    """A POST must say 'Content-Type: application/json' (a text/plain POST is a "simple"
    request a web page can send to a key-less localhost server without a CORS preflight).
    Fails on the code before this change: a text/plain body was scored (200)."""
    body = json.dumps({"question": "q", "steps": ["a"]}).encode()
    before = server.request("GET", "/health")[1]["traces"]
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, res = server.request("POST", "/v1/score", raw=body, headers={"Content-Type": ctype})
        assert status == 415 and "application/json" in res["error"], (ctype, res)
    head = f"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Length: {len(body)}".encode()
    status, res = raw_http(server.port, head, body)  # no Content-Type at all
    assert status == 415 and "application/json" in res["error"]
    assert server.request("GET", "/health")[1]["traces"] == before  # nothing was scored
    ok = {"Content-Type": "Application/JSON; charset=utf-8"}
    assert server.request("POST", "/v1/score", raw=body, headers=ok)[0] == 200


def test_the_host_header_is_checked(server, guarded, prm_dir, capsys):
    """A loopback server answers only Host 127.0.0.1, localhost or [::1] with its port (a
    DNS-rebinding page sends its own name); --allowed-hosts lists others ('name:port', or
    'name' on any port, '*' any), and --host 0.0.0.0 without it stops with exit 2. Fails on
    the code before this change: any Host was answered and --allowed-hosts did not exist."""
    from betaprm.cli import main
    from betaprm.serve_requests import host_allowed as _host_allowed

    body = {"question": "q", "steps": ["a"]}
    for host in (f"localhost:{server.port}", f"[::1]:{server.port}", f"127.0.0.1:{server.port}"):
        assert server.request("POST", "/v1/score", body, headers={"Host": host})[0] == 200, host
    for host in (f"evil.example:{server.port}", "127.0.0.1", f"localhost:{server.port + 1}", "localhost.evil.example"):
        status, res = server.request("GET", "/health", headers={"Host": host})
        assert status == 400 and "--allowed-hosts" in res["error"], (host, res)
    head = b"GET /health HTTP/1.0"  # no Host header at all
    status, res = raw_http(server.port, head)
    assert status == 400 and "no Host header" in res["error"]
    key = {"Authorization": "Bearer k2"}
    assert guarded.request("GET", "/health", headers={**key, "Host": "rm.internal:5000"})[0] == 200
    assert guarded.request("GET", "/health", headers={**key, "Host": "localhost:1234"})[0] == 200
    assert guarded.request("GET", "/health", headers={**key, "Host": "rm.internal:5001"})[0] == 400
    assert guarded.request("GET", "/health", headers={**key, "Host": f"127.0.0.1:{guarded.port}"})[0] == 400
    assert _host_allowed("anything.example:1", ("*",))
    assert main(["serve", "--model", str(prm_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--allowed-hosts" in err and "Traceback" not in err


def test_a_trace_that_cannot_fit_is_413_before_it_is_tokenised(server):
    """More characters than the model's positions could hold whatever the tokens, or more
    steps than positions: 413 at once, and the trace never reaches the scorer. Fails on the
    code before this change: such a trace was tokenised in the scoring thread (a 15 MB one
    for 43 s) before its 413 said "tokens"."""
    before = server.request("GET", "/health")[1]["traces"]
    status, res = server.request("POST", "/v1/score", {"question": "q", "steps": ["word " * 12000]})
    assert status == 413 and "characters, more than the model's 1024 positions" in res["error"], res
    status, res = server.request("POST", "/v1/score", {"question": "q", "steps": ["a"] * 1025})
    assert status == 413 and "1025 steps" in res["error"], res
    status, res = server.request("POST", "/get_reward", {"query": ["q" + "\n\n".join(["a"] * 1100)], "prompts": ["q"]})
    assert status == 413 and "steps" in res["error"], res
    # Within the bound but over the positions: tokenised, refused before the scorer.
    status, res = server.request("POST", "/v1/score", {"question": "q", "steps": ["word " * 2000]})
    assert status == 413 and "tokens, more than the model's 1024 positions" in res["error"]
    assert server.request("GET", "/health")[1]["traces"] == before


def test_a_long_tokenisation_does_not_hold_up_small_requests(prm_dir, monkeypatch):
    """While one request's traces are being tokenised (held here until released), a small
    request is tokenised and scored: tokenising runs in its own threads, not in the one
    scoring thread nor on the event loop. Fails on the code before this change: the scoring
    thread tokenised, so the small request waited for the long one."""
    import uvicorn

    from betaprm import serve

    entered, release = threading.Event(), threading.Event()
    original = serve.encode_traces

    def held(tokenizer, marker_id, traces, fmt):
        if any(t[0] == "hold" for t in traces):
            entered.set()
            release.wait(60)
        return original(tokenizer, marker_id, traces, fmt)

    monkeypatch.setattr(serve, "encode_traces", held)
    port = free_port()
    app = serve.create_app(BetaPRM.from_pretrained(prm_dir), serve.ServeSettings(port=port))
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        while not srv.started:
            time.sleep(0.05)

        def post(body, timeout):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            conn.request("POST", "/v1/score", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())

        slow = []
        t = threading.Thread(target=lambda: slow.append(post({"question": "hold", "steps": ["a b"]}, 120)))
        t.start()
        assert entered.wait(30)
        try:
            status, res = post({"question": "q", "steps": ["a"]}, 20)  # a hang guard, not a speed check
            assert status == 200 and len(res["mu"]) == 1
        finally:
            release.set()
        t.join(60)
        assert slow and slow[0][0] == 200
    finally:
        release.set()
        srv.should_exit = True
        thread.join(30)


def test_a_chunked_body_over_the_cap_is_refused_while_it_streams(server):
    """A chunked body (no Content-Length to check) is read as it arrives and refused (413)
    at the cap, without waiting for the rest. Fails on the code before this change: the
    whole body was buffered first (a 50 MB one in memory) and --max-request-bytes did not
    exist."""
    import select

    total, sent, chunk = 30 * 2**20, 0, b"[" + b" " * 65534 + b"]"
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(
            f"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        try:
            while sent < total and not select.select([s], [], [], 0)[0]:
                s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: its answer is waiting
        answer = s.recv(65536)
        while not answer.endswith(b"}") and (more := s.recv(65536)):
            answer += more
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over the server's 1000000" in answer
    assert sent < total // 2  # refused long before the end of the body
    assert server.request("POST", "/v1/score", {"question": "q", "steps": ["a"]})[0] == 200


def test_unencodable_text_is_a_400(server):
    """A lone surrogate escape ("\\ud800") in a step, the question or a query is a 400
    naming where it is; a proper pair (an emoji) is scored. Fails on the code before this
    change: the tokenizer's TypeError was a 500."""
    for raw, where in (
        (b'{"question": "q", "steps": ["a \\ud800 b"]}', "body['steps'][0]"),
        (b'{"question": "\\udfff", "steps": ["a"]}', "body['question']"),
        (b'{"items": [{"question": "q", "steps": ["a", "b\\uDC00"]}]}', "body['items'][0]['steps'][1]"),
    ):
        status, res = server.request("POST", "/v1/score", raw=raw)
        assert status == 400 and f"{where} holds a lone surrogate" in res["error"], (raw, res)
    status, res = server.request("POST", "/get_reward", raw=b'{"query": ["q\\n\\n\\ud800"], "prompts": ["q"]}')
    assert status == 400 and "body['query'][0]" in res["error"], res
    assert server.request("POST", "/v1/score", raw=b'{"question": "q", "steps": ["a \\ud83d\\ude00"]}')[0] == 200


@pytest.mark.parametrize(
    "field,value,ok",
    [("lam", 1e308, False), ("lam", -101, False), ("lam", 100, True), ("tau", -0.1, False), ("tau", 0, True)],
)
def test_request_values_are_range_checked(server, field, value, ok):
    """``lam`` must be finite with |lam| <= 100 and ``tau`` finite and >= 0, else 400 naming
    the field. Fails on the code before this change: lam 1e308 and a negative tau were
    scored (200)."""
    status, res = server.request("POST", "/v1/score", {"question": "q", "steps": ["a"], field: value})
    if ok:
        assert status == 200, res
    else:
        assert status == 400 and f"field {field!r} must be a finite number" in res["error"], res


def test_images_over_the_pixel_cap_are_refused_before_they_are_decoded():
    """An 11 KB PNG of 9500x9500 pixels (270 MB decoded) is a 400 naming its size, read from
    its header: nothing is decoded; a smaller cap applies as given. Fails on the code
    before this change: PIL only warned and the image was decoded."""
    import base64
    import io

    from PIL import Image

    from betaprm.serve_requests import RequestError
    from betaprm.serve_requests import image_from_url as _image

    buf = io.BytesIO()
    Image.new("1", (9500, 9500)).save(buf, "PNG")
    assert len(buf.getvalue()) < 50_000
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with pytest.raises(RequestError, match=r"items\[0\].images\[0\]: an image too large .*90250000 pixels") as e:
        _image(url, "items[0].images[0]")
    assert e.value.status == 400
    buf = io.BytesIO()
    Image.new("RGB", (300, 200)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    assert _image(url, "x").size == (300, 200)
    with pytest.raises(RequestError, match=r"300x200 image \(60000 pixels\) is over the server's 50000 pixels"):
        _image(url, "x", max_pixels=50_000)


def test_an_unreadable_images_message_shows_no_memory_address():
    """Fails on the code before this change: the 400 read "cannot identify image file
    <_io.BytesIO object at 0x7f...>", an object's repr."""
    import base64

    from betaprm.serve_requests import RequestError
    from betaprm.serve_requests import image_from_url as _image

    url = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
    with pytest.raises(RequestError, match="not a readable image") as e:
        _image(url, "the trace.images[0]")
    assert "0x" not in str(e.value) and "object at" not in str(e.value) and "the trace.images[0]" in str(e.value)
