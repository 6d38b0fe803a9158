"""`score`, `eval-steps`, `eval-bon` (and `eval-calibration`) shared by two real processes (torchrun, gloo on CPU):
one output in input order with one sidecar, byte for byte the single process's (the same
forward passes, dealt out by tokens, one thread per process as torchrun sets it); a run
killed mid-way resumes under another number of processes, scoring each record once."""

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm import BetaPRM
from betaprm.cli import main
from betaprm.distributed import balanced_shares
from betaprm.provenance import meta_path, part_files, part_path

from .helpers import make_counts, make_lm_dir

ROOT = Path(__file__).resolve().parents[1]
WORKER = str(Path(__file__).parent / "multiprocess_worker.py")  # runs commands; KILL_AFTER kills it mid-run
N_POOLS, N_CANDS, N_ITEMS = 90, 6, 60  # 540 candidates: three chunks of pools (256 candidates each at most)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_pools(path, rng):
    with open(path, "w") as f:
        for i in range(N_POOLS):
            cands = []
            for _ in range(N_CANDS):
                a, b = rng.randint(0, 9), rng.randint(0, 9)
                c = a + b + rng.choice([0, 0, 1])
                steps = [f"{a} + {b} = {c}" + " so" * rng.randint(0, 12) for _ in range(rng.randint(1, 5))]
                cands.append({"steps": steps + [f"The answer is {c}."], "correct": c == a + b})
            question = f"problem {i}" + " word" * rng.randint(0, 25)
            f.write(json.dumps({"id": f"p{i}", "question": question, "answer": "7", "candidates": cands}) + "\n")


def _write_processbench(path, rng):
    with open(path, "w") as f:
        for i in range(N_ITEMS):
            steps = [f"{rng.randint(0, 9)} + {rng.randint(0, 9)} = {rng.randint(0, 18)}" + " so" * rng.randint(0, 15)]
            steps += [f"then {rng.randint(0, 9)}" for _ in range(rng.randint(2, 5))]
            label = -1 if i % 3 == 0 else rng.randrange(len(steps))
            row = {"id": f"gsm8k-{i}", "problem": f"What is {i} + {i}?" + " word" * rng.randint(0, 20)}
            f.write(json.dumps({**row, "steps": steps, "label": label}) + "\n")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mp")
    prm = BetaPRM.from_backbone(str(make_lm_dir(d / "lm")))
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)  # kappa that varies with the trace
    prm.save_pretrained(d / "prm")
    rng = random.Random(0)
    _write_pools(d / "pools.jsonl", rng)
    _write_processbench(d / "gsm8k.jsonl", rng)
    make_counts(d / "counts.jsonl", n=40)
    return d


def _score(d, out):
    return ["score", "--model", str(d / "prm"), "--input", str(d / "pools.jsonl"),
            "--output", str(out / "scored.jsonl"),
            "--max-batch-tokens", "2048", "--device", "cpu", "--disable-tqdm"]  # fmt: skip


def _eval_steps(d, out):
    return ["eval-steps", "--model", str(d / "prm"), "--data", str(d / "gsm8k.jsonl"), "--out", str(out / "pb.json"),
            "--max-batch-tokens", "1024", "--device", "cpu", "--disable-tqdm"]  # fmt: skip


def _eval_bon(d, out):
    return ["eval-bon", "--pools", str(d / "pools.jsonl"), "--model", str(d / "prm"), "--out", str(out / "bon.json"),
            "--max-batch-tokens", "2048", "--device", "cpu", "--disable-tqdm"]  # fmt: skip


def _eval_calibration(d, out):
    """Without --out: the scores travel to rank 0 in memory, and its table is printed."""
    return ["eval-calibration", "--model", str(d / "prm"), "--data", str(d / "counts.jsonl"),
            "--max-batch-tokens", "512", "--device", "cpu", "--disable-tqdm"]  # fmt: skip


def _one_process(argv) -> int:
    """A command in this process, with one thread as each torchrun process has it (torch's
    results then agree to the bit)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main(argv)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(files):
    """The commands' outputs from one process: what two processes must write."""
    one = files / "one"
    for argv in (_score(files, one), _eval_steps(files, one), _eval_bon(files, one)):
        assert _one_process(argv) == 0
    return one


def _torchrun(args, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


def _assert_same_records(got, want, rescored=()):
    """``got`` holds ``want``'s lines in its order: byte for byte, but for the records of
    ``rescored`` ids, scored in other forward passes than ``want``'s (scores within float32
    rounding there)."""
    got, want = got.read_bytes().splitlines(), want.read_bytes().splitlines()
    assert [json.loads(x)["id"] for x in got] == [json.loads(x)["id"] for x in want]
    for a, b in zip(got, want):
        ra, rb = json.loads(a), json.loads(b)
        if ra["id"] not in rescored:
            assert a == b, ra["id"]
            continue
        for ca, cb in zip(ra["candidates"], rb["candidates"]):
            assert ca.keys() == cb.keys()
            for k in ("mu", "kappa", "sigma"):
                np.testing.assert_allclose(ca[k], cb[k], rtol=1e-6, atol=1e-7)


def _assert_close(a, b, where="result"):
    """Equal JSON, numbers within float32 rounding (results from scores made in other
    forward passes)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), where
    else:
        assert a == b, where


def _settings(path):
    return json.loads(meta_path(path).read_text())["settings"]


def test_two_processes_write_what_one_process_writes(files, reference, capsys):
    capsys.readouterr()
    assert _one_process(_eval_calibration(files, files / "one")) == 0
    calibration = capsys.readouterr().out
    two = files / "two"
    commands = [_score(files, two), _eval_steps(files, two), _eval_bon(files, two), _eval_calibration(files, two)]
    res = _torchrun([WORKER, json.dumps(commands)])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "prm (beta), 2 processes" in res.stdout and res.stdout.count("90 pools, 0 already in") == 1
    # One output, in input order, byte for byte the single process's; one sidecar, no part
    # files, locks or kept scores left in either folder.
    assert (two / "scored.jsonl").read_bytes() == (reference / "scored.jsonl").read_bytes()
    assert [json.loads(x)["id"] for x in open(two / "scored.jsonl")] == [f"p{i}" for i in range(N_POOLS)]
    assert _settings(two / "scored.jsonl") == _settings(reference / "scored.jsonl")
    expected = ["bon.json", "pb.json", "scored.jsonl", "scored.jsonl.meta.json"]
    assert sorted(os.listdir(two)) == sorted(os.listdir(reference)) == expected
    # The metrics, computed once by rank 0 from every item's scores, are the single process's.
    for name in ("pb.json", "bon.json"):
        assert json.loads((two / name).read_text()) == json.loads((reference / name).read_text()), name
    assert "labelled steps" in calibration and calibration in res.stdout  # printed once, by rank 0


def test_a_killed_score_run_resumes_in_one_process(files, reference, capsys):
    """Rank 1 dies (SIGKILL) after writing its first chunk; torchrun stops rank 0. Each kept
    its records in its part file; one process finishes the rest and merges them."""
    out = files / "killed_score"
    res = _torchrun([WORKER, json.dumps([_score(files, out)])], {"KILL_AFTER": "1:1"})
    assert res.returncode != 0 and "SIGKILL" in res.stderr + res.stdout
    parts = part_files(out / "scored.jsonl")
    assert [p.name for p in parts][-1] == "scored.jsonl.part1"  # rank 1 had a share of its own
    kept = sum(len(p.read_text().splitlines()) for p in parts)
    assert 0 < kept < N_POOLS and not (out / "scored.jsonl").exists()  # nothing merged yet
    capsys.readouterr()
    assert _one_process(_score(files, out)) == 0
    said = capsys.readouterr().out
    assert f"{N_POOLS} pools, {kept} already in" in said and f"{N_POOLS - kept} scored" in said  # none twice
    assert (out / "scored.jsonl").read_bytes() == (reference / "scored.jsonl").read_bytes()
    assert sorted(os.listdir(out)) == ["scored.jsonl", "scored.jsonl.meta.json"]


def test_a_killed_eval_steps_run_resumes_in_one_process(files, reference, caplog):
    """Both ranks die after two forward passes each; their scores are kept beside --out
    (PB.json.scores.part0/1) and one process scores the other items only."""
    out = files / "killed_steps"
    res = _torchrun([WORKER, json.dumps([_eval_steps(files, out)])], {"KILL_AFTER": "2"})
    assert res.returncode != 0
    state = out / "pb.json.scores"
    kept = [json.loads(x)["id"] for p in part_files(state) for x in p.read_text().splitlines()]
    assert len(part_files(state)) == 2 and 0 < len(kept) < N_ITEMS and len(set(kept)) == len(kept)
    assert not (out / "pb.json").exists()
    with open(part_files(state)[0], "a") as f:  # and a kill in the middle of a write
        f.write('{"id": "7", "mu": [0.1')
    with caplog.at_level("INFO"):
        assert _one_process(_eval_steps(files, out)) == 0
    assert (
        f"{len(kept)} of {N_ITEMS} traces scored by an interrupted run; scoring the other {N_ITEMS - len(kept)}"
        in (caplog.text)
    )
    _assert_close(json.loads((out / "pb.json").read_text()), json.loads((reference / "pb.json").read_text()))
    assert os.listdir(out) == ["pb.json"]  # the kept scores go once the results are written


def test_a_killed_eval_bon_run_resumes_in_one_process(files, reference, caplog):
    """Rank 0 dies after its first forward pass and torchrun stops rank 1: the scores of that
    pass and whatever rank 1 wrote are kept; one process scores the rest, and its metrics are
    the reference's."""
    out = files / "killed_bon"
    res = _torchrun([WORKER, json.dumps([_eval_bon(files, out)])], {"KILL_AFTER": "1:0"})
    assert res.returncode != 0
    kept = [json.loads(x)["id"] for p in part_files(out / "bon.json.scores") for x in p.read_text().splitlines()]
    assert 0 < len(kept) < N_POOLS * N_CANDS and len(set(kept)) == len(kept)
    with caplog.at_level("INFO"):
        assert _one_process(_eval_bon(files, out)) == 0
    assert f"{len(kept)} of {N_POOLS * N_CANDS} traces scored by an interrupted run" in caplog.text
    _assert_close(json.loads((out / "bon.json").read_text()), json.loads((reference / "bon.json").read_text()))
    assert os.listdir(out) == ["bon.json"]


@pytest.mark.slow
def test_one_process_killed_then_two_processes_finish(files, reference):
    """A single process's output cut where a kill leaves it (whole records and a torn last
    line: tests/test_score.py kills a real one); two processes score the rest into part files
    and rank 0 appends them after the records already there, in input order. The records
    scored now share forward passes with others than in the reference run: their scores
    agree within float32 rounding, as a lone process's resume does."""
    out = files / "one_then_two"
    out.mkdir()
    lines = (reference / "scored.jsonl").read_bytes().splitlines(keepends=True)
    (out / "scored.jsonl").write_bytes(b"".join(lines[:40]) + lines[40][:50])
    meta_path(out / "scored.jsonl").write_bytes(meta_path(reference / "scored.jsonl").read_bytes())
    res = _torchrun(["-m", "betaprm", *_score(files, out)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{N_POOLS} pools, 40 already in" in res.stdout and f"{N_POOLS - 40} scored" in res.stdout
    _assert_same_records(out / "scored.jsonl", reference / "scored.jsonl", {f"p{i}" for i in range(40, N_POOLS)})
    assert sorted(os.listdir(out)) == ["scored.jsonl", "scored.jsonl.meta.json"]


# ---------------------------------------------------------------------- in one process
def test_balanced_shares_deal_tokens_not_lines():
    """Two long traces and six short ones in length order: halves by count would give one
    process 202 tokens and the other 4; dealt by tokens each gets 103."""
    weights = [100, 100, 1, 1, 1, 1, 1, 1]
    shares = balanced_shares(weights, 2)
    assert shares == [[0, 2, 4, 6], [1, 3, 5, 7]]
    skewed = [500, 3, 2, 400, 1, 1, 90, 5, 5]
    shares = balanced_shares(skewed, 3)
    assert sorted(i for s in shares for i in s) == list(range(len(skewed)))  # each once, in index order
    assert all(s == sorted(s) for s in shares)
    assert sorted(sum(skewed[i] for i in s) for s in shares) == [107, 400, 500]
    assert balanced_shares([3, 3], 4) == [[0], [1], [], []]  # more processes than work


def test_a_merge_killed_half_way_finishes_without_duplicates(files, reference, capsys):
    """Part files whose records rank 0 had begun to append (the output holds the first 20
    and a torn 21st), one part with a torn last line of its own: a lone process finishes the
    merge, scores the torn record again, and writes each record once, in input order."""
    out = files / "merge"
    out.mkdir()
    lines = (reference / "scored.jsonl").read_bytes().splitlines(keepends=True)
    meta_path(out / "scored.jsonl").write_bytes(meta_path(reference / "scored.jsonl").read_bytes())
    part_path(out / "scored.jsonl", 0).write_bytes(b"".join(lines[30:60] + lines[:30]))
    part_path(out / "scored.jsonl", 3).write_bytes(b"".join(lines[60:89]) + lines[89][:40])
    (out / "scored.jsonl").write_bytes(b"".join(lines[:20]) + lines[20][:10])
    assert _one_process(_score(files, out)) == 0
    assert f"{N_POOLS} pools, {N_POOLS - 1} already in" in capsys.readouterr().out
    _assert_same_records(out / "scored.jsonl", reference / "scored.jsonl", rescored={"p89"})
    assert sorted(os.listdir(out)) == ["scored.jsonl", "scored.jsonl.meta.json"]


def test_part_files_of_other_settings_are_refused(files, reference, capsys):
    """The settings are checked for the records of the part files as for the output's: a
    resume under another dtype stops, naming it, and leaves the parts as they were; parts
    without their sidecar are taken only with --adopt-output."""
    out = files / "other_settings"
    out.mkdir()
    lines = (reference / "scored.jsonl").read_bytes().splitlines(keepends=True)
    part = part_path(out / "scored.jsonl", 1)
    part.write_bytes(b"".join(lines[:10]))
    capsys.readouterr()
    assert _one_process(_score(files, out)) == 2
    assert "--adopt-output" in capsys.readouterr().err
    meta_path(out / "scored.jsonl").write_bytes(meta_path(reference / "scored.jsonl").read_bytes())
    assert _one_process([*_score(files, out), "--dtype", "bfloat16"]) == 2
    assert "--dtype: '<not recorded>' before, 'bfloat16' now" in capsys.readouterr().err
    assert part.read_bytes() == b"".join(lines[:10]) and not (out / "scored.jsonl").exists()


# ---------------------------------------------------------------------- aca and search
N_PROBLEMS = 12


def _aca(d, out):
    return ["aca", "--model", str(d / "prm"), "--n-problems", str(N_PROBLEMS), "--budget", "6", "--n0", "2", "--m",
            "2", "--final", "lin", "--device", "cpu", "--disable-tqdm", "--out", str(out / "aca.jsonl")]  # fmt: skip


def _search(d, out):
    return ["search", "--model", str(d / "prm"), "--n-problems", "8", "--n", "4", "--width", "2", "--device", "cpu",
            "--disable-tqdm", "--out", str(out / "search.jsonl")]  # fmt: skip


def _records(path):
    """A loop's records by problem id: a single process appends each problem as it finishes,
    rank 0 merges the parts in problem order."""
    return sorted((json.loads(x) for x in path.read_text().splitlines()), key=lambda r: r["id"])


def test_aca_and_search_shared_by_two_processes_and_resumed(files):
    """ACA and search deal their problems out to two processes, each appending its finished
    problems to its part file; rank 0 writes one output in problem order with one sidecar,
    the single process's records (scores within float32 rounding: the candidates share
    forward passes with other problems' than in one process). A run killed after rank 1's
    first problem resumes in one process, which solves only the problems not kept."""
    one, two = files / "loops_one", files / "loops_two"
    for argv in (_aca(files, one), _search(files, one)):
        assert _one_process(argv) == 0
    res = _torchrun([WORKER, json.dumps([_aca(files, two), _search(files, two)])])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count(f"aca: {N_PROBLEMS} problems") == 1 and "2 processes" in res.stdout  # rank 0 reports
    for name in ("aca.jsonl", "search.jsonl"):
        _assert_close(_records(two / name), _records(one / name), name)
        merged = [json.loads(x)["id"] for x in (two / name).read_text().splitlines()]
        assert merged == sorted(merged, key=lambda i: int(i.removeprefix("test"))), name  # problem order
        assert _settings(two / name) == _settings(one / name)
    assert sorted(os.listdir(two)) == ["aca.jsonl", "aca.jsonl.meta.json", "search.jsonl", "search.jsonl.meta.json"]

    out = files / "loops_killed"
    res = _torchrun([WORKER, json.dumps([_aca(files, out)])], {"KILL_AFTER": "1:1"})
    assert res.returncode != 0 and not (out / "aca.jsonl").exists()
    parts = part_files(out / "aca.jsonl")
    kept = [r["id"] for p in parts for r in _records(p)]
    assert 0 < len(kept) < N_PROBLEMS and len(set(kept)) == len(kept)
    for p in parts:  # marked, to show that the resumed run copies them and does not solve them again
        p.write_text("".join(json.dumps({**r, "kept": True}) + "\n" for r in _records(p)))
    assert _one_process(_aca(files, out)) == 0
    got = _records(out / "aca.jsonl")
    assert sorted(r["id"] for r in got if r.pop("kept", False)) == sorted(kept)
    _assert_close(got, _records(one / "aca.jsonl"))
    assert sorted(os.listdir(out)) == ["aca.jsonl", "aca.jsonl.meta.json"]
