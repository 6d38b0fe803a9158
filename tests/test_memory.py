"""Scoring memory is bounded by a token budget, not by the number of traces.

Fails before this change: scoring kept the autograd graph of every forward (no
``no_grad``) and padded batches of 16 traces to the longest; 64 traces of up to 2,000
tokens on this tiny model peaked at several GB above the model's own memory.
"""

import json
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from betaprm import BetaPRM
from betaprm.batching import token_batches
from betaprm.errors import BetaPRMInputError
from betaprm.formatting import encode_traces
from betaprm.scoring import fit_traces, score_token_ids, score_traces
from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

from .conftest import CORPUS

WORDS = "so then we add multiply the result is carry remainder therefore answer value step seven".split()


def long_traces(tok_len, n=64, lo=50, hi=2000, seed=0):
    """``n`` (question, steps) traces whose encoded lengths spread over [lo, hi] tokens."""
    rng = random.Random(seed)
    traces = []
    for i in range(n):
        target = lo + (hi - lo) * i // (n - 1)
        question = f"problem {i} :"
        steps = []
        while True:
            step = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            if tok_len(question, steps + [step]) > target and steps:
                break
            steps.append(step)
        traces.append((question, steps))
    rng.shuffle(traces)
    return traces


@pytest.fixture(scope="module")
def long_prm(tmp_path_factory):
    """A tiny Llama with 2,048 positions, saved as a BetaPRM checkpoint."""
    import torch

    tok = train_bytelevel_tokenizer(CORPUS + [" ".join(WORDS)] * 20, vocab_size=400)
    lm = tiny_causal_lm(len(tok), hidden_size=64, num_layers=2, num_heads=4, max_position_embeddings=2048)
    prm = BetaPRM.from_backbone(lm, tok)
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    d = tmp_path_factory.mktemp("longprm") / "prm"
    prm.save_pretrained(d)
    return d


def _len_fn(prm):
    def tok_len(q, steps):
        return len(encode_traces(prm.tokenizer, prm.config.marker_id, [(q, steps)], prm.config.trace_format)[0])

    return tok_len


def test_token_batches_respect_the_budget_and_cover_every_trace():
    rng = random.Random(1)
    lengths = [rng.randint(1, 3000) for _ in range(500)]
    batches = token_batches(lengths, 8192)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * width <= 8192
    assert all(len(b) <= 3 for b in token_batches(lengths, 8192, max_batch_size=3))
    # A trace over the budget is scored alone, never dropped.
    assert token_batches([10, 20000, 30], 100) == [[1], [2, 0]]


def test_long_traces_batched_by_tokens_equal_one_by_one(long_prm):
    prm = BetaPRM.from_pretrained(long_prm)
    traces = long_traces(_len_fn(prm))
    lengths = [_len_fn(prm)(q, s) for q, s in traces]
    assert min(lengths) <= 60 and 1900 <= max(lengths) <= 2048
    batched = score_traces(prm, traces, max_batch_tokens=8192)
    for (q, s), b in zip(traces, batched):
        one = score_traces(prm, [(q, s)], batch_size=1)[0]
        assert len(b) == len(s)
        np.testing.assert_allclose(b.mu, one.mu, atol=1e-5)
        np.testing.assert_allclose(b.kappa, one.kappa, rtol=1e-5, atol=1e-5)


MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    import torch
    torch.set_num_threads(2)
    from betaprm import BetaPRM
    from betaprm.scoring import score_traces

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20

    prm = BetaPRM.from_pretrained(sys.argv[1])
    traces = [tuple(t) for t in json.load(open(sys.argv[2]))]
    score_traces(prm, traces[:2], max_batch_tokens=int(sys.argv[3]))  # warm up kernels
    before = rss_mb()
    # Reset the kernel's peak-RSS mark (VmHWM), so the peak is the scoring's own and not
    # that of loading or importing.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    scores = score_traces(prm, traces, max_batch_tokens=int(sys.argv[3]))
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    print(json.dumps({"before_mb": before, "peak_mb": peak, "n": len(scores)}))
    """
)

# The budget's activations for this model: 8,192 tokens x (hidden 64 .. MLP 256) floats
# per layer plus SDPA's scores for at most 4 traces x 4 heads x 2,048^2 (about 250 MB if a
# kernel materialises them); measured: +100 MB. Fixed batches of 16 with a kept graph: +1,600 MB.
PEAK_ABOVE_BASELINE_MB = 400


def test_scoring_peak_memory_stays_under_a_bound(long_prm, tmp_path):
    prm = BetaPRM.from_pretrained(long_prm)
    traces = long_traces(_len_fn(prm))
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(traces))
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(long_prm), str(path), "8192"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["n"] == 64
    assert res["peak_mb"] - res["before_mb"] < PEAK_ABOVE_BASELINE_MB, res


def test_over_long_trace_is_an_error_or_cut_to_whole_steps(long_prm):
    """Fails before this change: a trace longer than the model's positions was scored
    silently (positions past the table were read as garbage or crashed)."""
    prm = BetaPRM.from_pretrained(long_prm)
    tok_len = _len_fn(prm)
    traces = long_traces(tok_len, n=2, lo=100, hi=3000)
    long_one = max(traces, key=lambda t: tok_len(*t))
    with pytest.raises(
        BetaPRMInputError, match=r"pool7: \d+ tokens, more than the model's 2048 positions; pass --truncate steps"
    ):
        score_traces(prm, [long_one], names=["pool7"])
    cut = score_traces(prm, [long_one], truncate="steps")[0]
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [long_one], prm.config.trace_format)
    fitted, kept = fit_traces(prm, ids, "steps")
    assert len(fitted[0]) <= 2048 and kept[0] == len(cut) < len(long_one[1])
    # The kept steps' scores are those of the same prefix scored whole (causal model).
    prefix = score_traces(prm, [(long_one[0], long_one[1][: len(cut)])])[0]
    np.testing.assert_allclose(cut.mu, prefix.mu, atol=1e-5)


def test_score_token_ids_keeps_no_graph(long_prm):
    """Fails before this change: the forward ran with autograd on, keeping every layer's
    activations until the batch was done (12.6 GB for SmolLM2-135M at batch size 1)."""
    import torch

    prm = BetaPRM.from_pretrained(long_prm)
    prm.train()
    seen = []
    hook = prm._decoder().register_forward_hook(
        lambda mod, args, out: seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
    )
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, [("q", ["a b", "c"])], prm.config.trace_format)
    with torch.enable_grad():
        s = score_token_ids(prm, ids)
    hook.remove()
    assert seen == [(False, True)]  # no graph, inference mode
    assert prm.training and len(s[0]) == 2 and np.isfinite(s[0].mu).all()


def test_score_cli_over_long_candidates(long_prm, tmp_path, capsys):
    """``betaprm score``: a candidate over the model's positions is exit 2 naming its
    record (default), or scored on the steps that fit with ``steps_scored`` under
    ``--truncate steps``, continuing the same output; it then validates as a scored pool.
    Fails before this change: an over-long trace was scored silently (positions past the
    model's table), with no flag to choose."""
    from betaprm.cli import main

    prm = BetaPRM.from_pretrained(long_prm)
    traces = long_traces(_len_fn(prm), n=2, lo=100, hi=3000)
    pools = tmp_path / "pools.jsonl"
    pools.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "question": q, "answer": "7", "candidates": [{"steps": s}]}) + "\n"
            for i, (q, s) in enumerate(traces)
        )
    )
    long_id = max(range(2), key=lambda i: _len_fn(prm)(*traces[i]))
    out = tmp_path / "scored.jsonl"
    assert main(["score", "--model", str(long_prm), "--input", str(pools), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"record 'p{long_id}' candidate 0: " in err and "more than the model's 2048 positions" in err
    assert not out.exists() or out.read_text() == ""
    assert (
        main(["score", "--model", str(long_prm), "--input", str(pools), "--output", str(out), "--truncate", "steps"])
        == 0
    )
    recs = {r["id"]: r["candidates"][0] for r in map(json.loads, open(out))}
    cut = recs[f"p{long_id}"]
    assert 1 <= cut["steps_scored"] == len(cut["mu"]) < len(cut["steps"])
    assert "steps_scored" not in recs[f"p{1 - long_id}"]
    assert main(["validate", str(out), "--kind", "pool"]) == 0
    # Rescoring a scored pool drops the old scores first: no stale steps_scored.
    from betaprm.scoring import StepScores, with_scores

    full = StepScores.from_mu_kappa(np.full(len(cut["steps"]), 0.5), np.ones(len(cut["steps"])))
    assert "steps_scored" not in with_scores(cut, full) and len(with_scores(cut, full)["mu"]) == len(cut["steps"])
