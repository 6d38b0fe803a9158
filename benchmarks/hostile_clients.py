"""The reward server under slow and hostile clients: small requests' latency and the server's memory.

    python benchmarks/hostile_clients.py [--git-rev COMMIT | --before-src DIR] [--seconds 40]

For each code tree (the one before, from ``--git-rev`` checked out into a temporary ``git
worktree``, or ``--before-src``; then this checkout's ``src``), and for each phase, a fresh
``betaprm serve`` (its default settings; the tests' tiny BetaPRM: hidden 32, 2 layers, 1,024
positions) runs on 127.0.0.1 while ``--small-clients`` clients send one short trace per
request, one request after another, and hostile clients run alongside:

- ``slow-bodies``: ``--slow-clients`` clients each send the headers and ``--slow-mb`` MB of a
  body declared a little longer, then stop sending and wait; answered or closed, each waits
  1 s (a Retry-After) and starts again;
- ``idle-sockets``: ``--idle`` connections that never send a byte, each reopened once the
  server closes it;
- ``amplifying-json``: ``--amplifiers`` clients each posting, again and again, a body just
  under the 16 MiB cap of ``{"items": [{}, {}, ...]}`` (5.6 million dicts once parsed);
- ``near-prompts``: ``--near-clients`` clients each posting, again and again, a
  ``/get_reward`` query that is a ``--near-mib`` MiB run of a special token, with a prompt
  equal to its first half but for one character in the middle;
- ``all``: every one of them at once.

Measured per phase: the small requests' count, how many were not answered 200, their
p50/p99/max latency (a request still waiting when the phase ends counts with the time it
waited), the server's peak memory (VmHWM, its resident set at most) and what the hostile
clients got. Every loop is bounded by ``--seconds`` and a count; traffic goes to 127.0.0.1
only. Prints a table and writes ``benchmarks/results/hostile_clients/run.json`` (or
``--json``).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PHASES = ("slow-bodies", "idle-sockets", "amplifying-json", "near-prompts", "all")
MAX_ROUNDS = 100_000  # any client's requests or reconnections in one phase, whatever the time
SMALL = json.dumps({"question": "what is 3 + 4 ?", "steps": ["3 + 4 = 7", "so the answer is 7"]}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb(pid: int, field: str) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def start_server(model: str, src: str, log_path: str, threads: int):
    """``betaprm serve`` from the source tree ``src`` at its default settings, its output in
    ``log_path``; (process, port) once /health answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "OMP_NUM_THREADS": str(threads)}
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "betaprm", "serve", "--model", model, "--port", str(port), "--device", "cpu"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    with open(log_path) as f:
        raise SystemExit(f"the server did not start: {f.read()[-2000:]}")


def head(port: int, path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def status_of(answer: bytes) -> str:
    parts = answer.split(b" ", 2)
    return parts[1].decode() if answer.startswith(b"HTTP/") and len(parts) > 1 else "closed"


# ---------------------------------------------------------------- the clients


def small_client(port: int, stop_at: float, out: list) -> None:
    """Short traces, one after another on a keep-alive connection: (seconds, status)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=stop_at - time.time() + 30)
    for _ in range(MAX_ROUNDS):
        if time.time() >= stop_at:
            return
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v1/score", SMALL, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            status = str(resp.status)
        except Exception as e:  # counted, not raised: the table reports it
            status = type(e).__name__
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=max(1.0, stop_at - time.time() + 30))
        out.append((time.perf_counter() - t0, status))


def slow_body_client(port: int, stop_at: float, body: bytes, declared: int, out: list) -> None:
    """Sends the headers and ``body`` (short of ``declared`` bytes), then waits: (outcome,
    seconds held after the body was sent)."""
    for _ in range(MAX_ROUNDS):
        if time.time() >= stop_at:
            return
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError as e:
            out.append((type(e).__name__, 0.0))
            time.sleep(1)
            continue
        with s:
            try:
                s.sendall(head(port, "/v1/score", declared) + body)
            except OSError:
                pass  # refused while sending: its answer is waiting
            t0 = time.perf_counter()
            answer = b""
            try:
                s.settimeout(max(0.1, stop_at - time.time()))
                answer = s.recv(4096)
                outcome = status_of(answer)
            except socket.timeout:
                outcome = "still held"
            except OSError:
                outcome = "reset"
            out.append((outcome, time.perf_counter() - t0))
        time.sleep(1)  # as a Retry-After asks


def idle_sockets(port: int, stop_at: float, n: int, out: dict) -> None:
    """``n`` connections that never send a byte, each reopened when the server closes it:
    how long each lived, and how many are open at the end, their ages."""
    opened: dict[socket.socket, float] = {}

    def open_one() -> None:
        try:
            opened[socket.create_connection(("127.0.0.1", port), timeout=5)] = time.time()
        except OSError:
            out["failed_to_open"] = out.get("failed_to_open", 0) + 1

    for _ in range(n):
        open_one()
    for _ in range(MAX_ROUNDS):
        if time.time() >= stop_at or not opened:
            break
        readable, _, _ = select.select(list(opened), [], [], min(0.2, max(0.0, stop_at - time.time())))
        for s in readable:
            try:
                data = s.recv(1024)
            except OSError:
                data = b""
            if not data:  # closed by the server
                out.setdefault("lifetimes", []).append(time.time() - opened.pop(s))
                s.close()
                open_one()
    now = time.time()
    out["open_at_end"] = len(opened)
    out["oldest_open_s"] = max((now - t for t in opened.values()), default=0.0)
    for s in opened:
        s.close()


def repeat_post(port: int, stop_at: float, path: str, body: bytes, out: list) -> None:
    """Posts ``body`` again and again: (status, seconds)."""
    for _ in range(MAX_ROUNDS):
        if time.time() >= stop_at:
            return
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=max(1.0, stop_at - time.time() + 30))
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            status = str(resp.status)
            conn.close()
        except Exception as e:  # counted, not raised
            status = type(e).__name__
        out.append((status, time.perf_counter() - t0))


# ---------------------------------------------------------------- one phase


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def counted(pairs: list) -> str:
    """``status xN (median s)`` for each status of (status, seconds) pairs."""
    by: dict[str, list[float]] = {}
    for status, secs in pairs:
        by.setdefault(status, []).append(secs)
    return ", ".join(f"{k} x{len(v)} ({percentile(v, 50):.1f} s)" for k, v in sorted(by.items())) or "none"


def run_phase(phase: str, model: str, src: str, args, bodies: dict, log_path: str) -> dict:
    proc, port = start_server(model, src, log_path, args.threads)
    warm: list = []
    small_client(port, time.time() + 1, warm)  # the first forwards are slow: not part of the phase
    base_rss = memory_mb(proc.pid, "VmRSS")
    load = os.getloadavg()[0]  # the machine's load as the phase starts (other work on it shows here)
    stop_at = time.time() + args.seconds
    small: list = []
    hostile: dict = {}
    threads = [threading.Thread(target=small_client, args=(port, stop_at, small)) for _ in range(args.small_clients)]
    kinds = PHASES[:-1] if phase == "all" else (phase,)
    if "slow-bodies" in kinds:
        for _ in range(args.slow_clients):
            hostile.setdefault("slow-bodies", [])
            out: list = []
            hostile["slow-bodies"].append(out)
            body, declared = bodies["slow"]
            threads.append(threading.Thread(target=slow_body_client, args=(port, stop_at, body, declared, out)))
    if "idle-sockets" in kinds:
        hostile["idle-sockets"] = {}
        threads.append(threading.Thread(target=idle_sockets, args=(port, stop_at, args.idle, hostile["idle-sockets"])))
    for kind, path, n in (
        ("amplifying-json", "/v1/score", args.amplifiers),
        ("near-prompts", "/get_reward", args.near_clients),
    ):
        if kind in kinds:
            hostile[kind] = []
            threads += [
                threading.Thread(target=repeat_post, args=(port, stop_at, path, bodies[kind], hostile[kind]))
                for _ in range(n)
            ]
    for t in threads:
        t.daemon = True
        t.start()
    time.sleep(max(0.0, stop_at - time.time()) + 2)  # 2 s for the last small requests to come back
    peak = memory_mb(proc.pid, "VmHWM")
    proc.kill()  # what is still waiting ends now, with the time it waited
    proc.wait(60)
    for t in threads:
        t.join(30)
    lat = [s * 1000 for s, _ in small]
    res = {
        "small_requests": len(small),
        "small_not_200": sum(1 for _, st in small if st != "200"),
        "small_statuses": dict(Counter(st for _, st in small)),
        "small_ms_p50": percentile(lat, 50),
        "small_ms_p99": percentile(lat, 99),
        "small_ms_max": max(lat, default=float("nan")),
        "rss_at_start_mb": base_rss,
        "load_at_start": load,
        "peak_rss_mb": peak,
        "hostile": {},
    }
    for kind, got in hostile.items():
        if kind == "slow-bodies":
            pairs = [p for per_client in got for p in per_client]
            res["hostile"][kind] = {
                "outcomes": counted(pairs),
                "longest_held_s": max((s for _, s in pairs), default=0),
            }
        elif kind == "idle-sockets":
            life = got.get("lifetimes", [])
            res["hostile"][kind] = {
                "closed_by_server": len(life),
                "median_lifetime_s": percentile(life, 50) if life else None,
                "open_at_end": got.get("open_at_end"),
                "oldest_open_s": got.get("oldest_open_s"),
            }
        else:
            res["hostile"][kind] = {"answers": counted(got), "requests": len(got)}
    with open(log_path) as f:
        log = f.read()
    res["log_lines"] = log.count("\n")
    res["log_tracebacks"] = log.count("Traceback (most recent call last)")
    return res


def describe(h: dict) -> str:
    parts = []
    for kind, r in h.items():
        if kind == "slow-bodies":
            parts.append(f"slow: {r['outcomes']}")
        elif kind == "idle-sockets":
            life = "" if r["median_lifetime_s"] is None else f", living {r['median_lifetime_s']:.1f} s"
            parts.append(
                f"idle: {r['closed_by_server']} closed{life}, {r['open_at_end']} open at the end "
                f"(oldest {r['oldest_open_s']:.0f} s)"
            )
        else:
            parts.append(f"{'amplifying' if kind == 'amplifying-json' else 'near'}: {r['answers']}")
    return "; ".join(parts)


# ---------------------------------------------------------------- the run


def make_bodies(prm_dir: str, args) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(prm_dir)
    token = tok.eos_token or tok.pad_token  # a special token the server removes
    run = token * int(args.near_mib * 2**20 / len(token))
    half = len(run) // 2
    near = run[: half - 1000] + "X" + run[half - 999 : half]
    cap = 16 * 2**20  # the server's default --max-request-bytes, both trees
    n_dicts = int(min(args.amplifier_mb * 2**20, cap - 64) // 3)
    slow = b'{"question": "q", "steps": ["' + b"a" * int(args.slow_mb * 2**20)
    return {
        "slow": (slow, min(cap, len(slow) + 4096)),
        "amplifying-json": b'{"items": [' + b"{}," * n_dicts + b"{}]}",
        "near-prompts": json.dumps({"query": [run], "prompts": [near]}).encode(),
    }


def git_worktree(rev: str, into: str) -> str:
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", into, rev], check=True, capture_output=True)
    return os.path.join(into, "src")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git-rev", help="the code before: this commit, checked out into a temporary git worktree")
    ap.add_argument("--before-src", help="the code before: its source tree (its src folder)")
    ap.add_argument("--after-src", default=os.path.join(ROOT, "src"), help="the code after (default this checkout's)")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}")
    ap.add_argument("--seconds", type=float, default=40.0, help="how long each phase runs")
    ap.add_argument("--small-clients", type=int, default=4)
    ap.add_argument("--slow-clients", type=int, default=40)
    ap.add_argument("--slow-mb", type=float, default=15.0, help="MiB each slow client sends before it stops")
    ap.add_argument("--idle", type=int, default=50, help="connections that never send a byte")
    ap.add_argument("--amplifiers", type=int, default=4)
    ap.add_argument("--amplifier-mb", type=float, default=16.0, help="MiB of {} per body (kept under the 16 MiB cap)")
    ap.add_argument("--near-clients", type=int, default=2)
    ap.add_argument("--near-mib", type=float, default=4.0, help="MiB of the special-token run in each query")
    ap.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "hostile_clients", "run.json"))
    args = ap.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    bad = [p for p in phases if p not in PHASES]
    if bad or min(args.seconds, args.small_clients) <= 0:
        ap.error(f"--phases must name some of {', '.join(PHASES)} and --seconds, --small-clients be > 0")

    sys.path.insert(0, HERE)
    from serve_load import make_prm  # the tests' tiny model, as serve_load --stall uses

    tmp = tempfile.mkdtemp(prefix="hostile-")
    model = os.path.join(tmp, "prm")
    make_prm(model, tiny=True)
    bodies = make_bodies(model, args)
    trees = []
    if args.git_rev:
        trees.append((f"before ({args.git_rev[:10]})", git_worktree(args.git_rev, os.path.join(tmp, "before"))))
    elif args.before_src:
        trees.append(("before", args.before_src))
    trees.append(("after", args.after_src))
    rows: dict = {}
    try:
        for phase in phases:
            for name, src in trees:
                log = os.path.join(tmp, f"{name.split()[0]}-{phase}.log")
                print(f"{phase}: {name} ...", flush=True)
                rows.setdefault(phase, {})[name] = run_phase(phase, model, src, args, bodies, log)
    finally:
        if args.git_rev:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", os.path.join(tmp, "before")])
    head_rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"\n{args.small_clients} small clients (one short trace a request) for {args.seconds:g} s a phase, a fresh "
        "server (default settings, the tests' tiny BetaPRM) for each"
    )
    print("| hostile clients | code | small requests | not 200 | p50 ms | p99 ms | max ms | peak RSS MB | they got |")
    print("|---|---|---|---|---|---|---|---|---|")
    for phase, by_tree in rows.items():
        for name, r in by_tree.items():
            print(
                f"| {phase} | {name} | {r['small_requests']} | {r['small_not_200']} | {r['small_ms_p50']:.0f} | "
                f"{r['small_ms_p99']:,.0f} | {r['small_ms_max']:,.0f} | {r['peak_rss_mb']:,.0f} | "
                f"{describe(r['hostile'])} |"
            )
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {"args": vars(args), "after_commit": head_rev.stdout.strip(), "trees": dict(trees), "results": rows},
            f,
            indent=2,
        )
    print("written", args.json)


if __name__ == "__main__":
    main()
