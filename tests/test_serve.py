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
from .helpers import make_lm_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``betaprm serve`` in its own process; waits until /health answers."""

    def __init__(self, model, *extra, env=None):
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
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not come up")

    def request(self, method, path, body=None, headers=None, raw: bytes | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        out = resp.status, json.loads(resp.read() or b"null")
        conn.close()
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


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
    s = Server(prm_dir, "--max-items", "64", "--max-wait-ms", "20", "--tau", "0.2")
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
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 1000\r\n\r\n{"question": '
    )
    s.close()  # gone before its body arrived
    s2 = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"items": [{"question": "q", "steps": ["a b c"] * 20}] * 64}).encode()
    s2.sendall(
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
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
    srv = Server(prm_dir, "--api-key-env", "BETAPRM_SERVE_KEY", "--max-wait-ms", "50", env={"BETAPRM_SERVE_KEY": "k1"})
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
