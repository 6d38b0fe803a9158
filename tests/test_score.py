"""betaprm score: streamed, resumable (also after a real kill), bad records handled."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from betaprm import BetaPRM
from betaprm.errors import BetaPRMInputError
from betaprm.scoring import score_pool_file

from .helpers import make_lm_dir


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("prm")
    lm = make_lm_dir(d / "lm")
    prm = BetaPRM.from_backbone(str(lm))
    import torch

    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    prm.save_pretrained(d / "prm")
    return d / "prm"


def write_pools(path, n, seed=0, n_cands=4):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            cands = [
                {
                    "steps": [
                        f"{rng.randint(0, 9)} + {rng.randint(0, 9)} = {rng.randint(0, 18)}"
                        for _ in range(rng.randint(1, 6))
                    ]
                }
                for _ in range(n_cands)
            ]
            f.write(json.dumps({"id": f"p{i}", "question": f"problem {i}", "answer": "7", "candidates": cands}) + "\n")
    return path


def read_out(path):
    return [json.loads(x) for x in open(path)]


def test_scores_every_candidate_like_the_api(tmp_path, prm_dir):
    prm = BetaPRM.from_pretrained(prm_dir)
    pools = write_pools(tmp_path / "pools.jsonl", 9)
    stats = score_pool_file(prm, pools, tmp_path / "out.jsonl", batch_size=5, chunk_candidates=10, show_progress=False)
    assert stats == {"records": 9, "already_done": 0, "scored": 9, "rejected": 0, "candidates": 36}
    out = read_out(tmp_path / "out.jsonl")
    assert [r["id"] for r in out] == [f"p{i}" for i in range(9)] and out[0]["answer"] == "7"
    for rec in out:
        api = prm.score(rec["question"], rec["candidates"])
        for cand, s in zip(rec["candidates"], api):
            assert len(cand["mu"]) == len(cand["kappa"]) == len(cand["sigma"]) == len(cand["steps"])
            np.testing.assert_allclose(cand["mu"], s.mu, atol=1e-6)
            np.testing.assert_allclose(cand["kappa"], s.kappa, rtol=1e-5)


def test_resume_skips_done_ids_and_drops_a_partial_line(tmp_path, prm_dir, capsys, caplog):
    prm = BetaPRM.from_pretrained(prm_dir)
    pools = write_pools(tmp_path / "pools.jsonl", 10)
    score_pool_file(prm, pools, tmp_path / "full.jsonl", show_progress=False)
    full = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(full[:4]) + full[4][:37])  # 4 whole records and a torn one
    stats = score_pool_file(prm, pools, part, show_progress=False)
    assert stats["already_done"] == 4 and stats["scored"] == 6
    # a logging warning: on stderr from the CLI, in the log records under pytest
    assert "removing a partial last line" in capsys.readouterr().err + caplog.text
    got = read_out(part)
    assert [r["id"] for r in got] == [f"p{i}" for i in range(10)]  # no duplicates, none lost
    for a, b in zip(got, read_out(tmp_path / "full.jsonl")):
        for ca, cb in zip(a["candidates"], b["candidates"]):
            np.testing.assert_allclose(ca["mu"], cb["mu"], atol=1e-6)


def test_killed_process_resumes_without_loss_or_duplicates(tmp_path, prm_dir):
    pools = write_pools(tmp_path / "pools.jsonl", 400, n_cands=8)
    out = tmp_path / "out.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "betaprm",
        "score",
        "--model",
        str(prm_dir),
        "--input",
        str(pools),
        "--output",
        str(out),
        "--batch-size",
        "8",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.stat().st_size > 0:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(out.read_text().splitlines()) if out.exists() else 0
    assert 0 < n_before < 400, f"the kill should land mid-run, found {n_before} records"
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    ids = [r["id"] for r in read_out(out)]
    assert sorted(ids, key=lambda s: int(s[1:])) == [f"p{i}" for i in range(400)] and len(set(ids)) == 400
    assert f"{n_before} already in" in res.stdout or "already in" in res.stdout


def test_bad_pool_records(tmp_path, prm_dir):
    prm = BetaPRM.from_pretrained(prm_dir)
    pools = write_pools(tmp_path / "pools.jsonl", 3)
    with open(pools, "a") as f:
        f.write(json.dumps({"id": "bad", "question": "q", "candidates": [{"steps": ["has <prm> inside"]}]}) + "\n")
    with pytest.raises(BetaPRMInputError, match=r":4: field 'candidates\[0\].steps\[0\]'"):
        score_pool_file(prm, pools, tmp_path / "o.jsonl", show_progress=False)
    assert not (tmp_path / "o.jsonl").exists()  # nothing written before the check
    stats = score_pool_file(
        prm, pools, tmp_path / "o.jsonl", on_error="skip", rejects=tmp_path / "rej.jsonl", show_progress=False
    )
    assert stats["scored"] == 3 and stats["rejected"] == 1
    assert json.loads((tmp_path / "rej.jsonl").read_text())["record"]["id"] == "bad"


# ---------------------------------------------------------------------- packed scoring
def _mixed_traces(n=40, seed=3):
    rng = random.Random(seed)
    return [
        (
            f"problem {i} " + "word " * rng.randint(0, 30),
            [
                f"{rng.randint(0, 9)} + {rng.randint(0, 9)} = {rng.randint(0, 18)} " + "so " * rng.randint(0, 8)
                for _ in range(rng.randint(1, 8))
            ],
        )
        for i in range(n)
    ]


def test_packed_scoring_gives_the_padded_scores(prm_dir):
    from betaprm.formatting import encode_traces
    from betaprm.scoring import score_token_ids

    prm = BetaPRM.from_pretrained(prm_dir)
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, _mixed_traces(), prm.config.trace_format)
    padded = score_token_ids(prm, ids, pack=False, max_batch_tokens=2048)
    packed = score_token_ids(prm, ids, pack=True, max_batch_tokens=2048)
    assert prm._betaprm_packing_checked  # some batch really held two traces in one row
    for a, b in zip(packed, padded):
        assert len(a.mu) == len(b.mu)
        np.testing.assert_allclose(a.mu, b.mu, atol=1e-5)
        np.testing.assert_allclose(a.kappa, b.kappa, rtol=1e-5)


def test_packed_scoring_falls_back_to_padding_when_attention_ignores_position_ids(prm_dir, tmp_path, caplog):
    """A real backbone whose attention masks causally over the whole row (packed traces would
    see each other): the first packed batch is checked, packing is turned off for that model
    with a warning, and every score is the padded one."""
    from betaprm.formatting import encode_traces
    from betaprm.scoring import score_token_ids

    from .helpers import leaky_attention_copy

    leaky = leaky_attention_copy(prm_dir, tmp_path / "leaky")
    prm = BetaPRM.from_pretrained(leaky)
    assert prm.backbone.config._attn_implementation == "causal_over_row"
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, _mixed_traces(), prm.config.trace_format)
    padded = score_token_ids(prm, ids, pack=False, max_batch_tokens=2048)
    with caplog.at_level("WARNING"):
        got = score_token_ids(prm, ids, max_batch_tokens=2048)
    assert "does not keep packed traces apart" in caplog.text and prm._betaprm_packing is False
    for a, b in zip(got, padded):
        np.testing.assert_allclose(a.mu, b.mu, atol=1e-6)


def test_an_output_from_before_a_setting_existed_resumes_at_its_default(tmp_path, prm_dir, capsys):
    """--dtype came after outputs users hold: their OUT.meta.json has no dtype. At its default
    (what they were made with) they resume; another dtype is told apart, by name."""
    import json

    from betaprm.cli import main

    pools = write_pools(tmp_path / "pools.jsonl", 6)
    out = tmp_path / "out.jsonl"
    assert main(["score", "--model", str(prm_dir), "--input", str(pools), "--out", str(out)]) == 0
    from betaprm.provenance import meta_path

    settings = json.loads(meta_path(out).read_text())["settings"]
    assert "dtype" not in settings  # at its default it is not recorded
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]))  # an older run, stopped half way
    assert main(["score", "--model", str(prm_dir), "--input", str(pools), "--out", str(out)]) == 0
    assert [r["id"] for r in read_out(out)] == [f"p{i}" for i in range(6)]
    out.write_text("".join(lines[:3]))
    capsys.readouterr()
    bad = ["score", "--model", str(prm_dir), "--input", str(pools), "--out", str(out), "--dtype", "bfloat16"]
    assert main(bad) == 2
    assert "--dtype: '<not recorded>' before, 'bfloat16' now" in capsys.readouterr().err
