"""A plain causal LM given as --model is scored zero-shot by every command that scores (its
own Yes/No logits at each marker, kappa the constant ``ZERO_SHOT_KAPPA``), as the README
says (the earlier ``score``, ``aca`` and ``search`` refused it: "not a BetaPRM"); and
``--dtype`` loads the model in the dtype asked for, in every command that loads one."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm import BetaPRM
from betaprm.cli import COMMANDS, build_parser, main
from betaprm.formatting import encode_traces
from betaprm.model import ZERO_SHOT_KAPPA, load_prm
from betaprm.scoring import score_traces

from .helpers import make_counts, make_lm_dir
from .test_score import read_out, write_pools

TRACES = [("add these", ["1 + 2 = 3", "3 + 4 = 7", "The answer is 7."]), ("add these", ["2 + 2 = 5"])]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A plain causal LM and a BetaPRM made from it (kappa head drawn, so kappa varies)."""
    d = tmp_path_factory.mktemp("zs")
    lm = make_lm_dir(d / "lm")
    prm = BetaPRM.from_backbone(str(lm))
    torch.manual_seed(0)
    with torch.no_grad():
        prm.kappa_head.weight.normal_(0, 0.3)
    prm.save_pretrained(d / "prm")
    return lm, d / "prm"


def test_score_takes_a_plain_lm(models, tmp_path, capsys):
    lm, _ = models
    pools = write_pools(tmp_path / "pools.jsonl", 3)
    out = tmp_path / "scored.jsonl"
    assert main(["score", "--model", str(lm), "--input", str(pools), "--output", str(out), "--device", "cpu"]) == 0
    assert f"{lm} (zero-shot)" in capsys.readouterr().out
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["info"]["model_kind"] == "zero-shot"
    prm, kind = load_prm(lm, "cpu")
    assert kind == "zero-shot"
    for rec in read_out(out):
        api = score_traces(prm, [(rec["question"], c["steps"]) for c in rec["candidates"]])
        for c, s in zip(rec["candidates"], api):
            np.testing.assert_allclose(c["mu"], s.mu, rtol=1e-6)  # the command scores as the API does
            assert c["kappa"] == pytest.approx([ZERO_SHOT_KAPPA] * len(c["steps"]), rel=1e-6)
            mu = np.array(c["mu"])
            np.testing.assert_allclose(c["sigma"], np.sqrt(mu * (1 - mu) / (ZERO_SHOT_KAPPA + 1)), rtol=1e-5)
    assert len({round(m, 6) for r in read_out(out) for c in r["candidates"] for m in c["mu"]}) > 1


def test_zero_shot_mu_is_the_lms_yes_no_softmax_at_the_marker(models):
    """mu of a zero-shot model, against the wrapped LM's own full-vocabulary logits at each
    marker position (softmax over the Yes and No columns), computed here."""
    lm, _ = models
    prm, _ = load_prm(lm, "cpu")
    (scores,) = score_traces(prm, TRACES[:1])
    ids = encode_traces(prm.tokenizer, prm.config.marker_id, TRACES[:1], prm.config.trace_format)[0]
    with torch.no_grad():
        logits = prm.backbone(torch.tensor([ids])).logits[0]
    at = [i for i, t in enumerate(ids) if t == prm.config.marker_id]
    z = logits[at][:, list(prm.config.reward_token_ids)]
    np.testing.assert_allclose(scores.mu, torch.softmax(z, -1)[:, 0].numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cmd", ["aca", "search"])
def test_aca_and_search_take_a_plain_lm(cmd, models, tmp_path, capsys):
    lm, _ = models
    out = tmp_path / "out.jsonl"
    small = ["--n0", "2", "--budget", "4"] if cmd == "aca" else []
    assert main([cmd, "--model", str(lm), "--n-problems", "2", "--out", str(out), "--device", "cpu", *small]) == 0
    assert f"{lm} (zero-shot) scores the candidates" in capsys.readouterr().out
    assert json.loads(Path(str(out) + ".meta.json").read_text())["info"]["model_kind"] == "zero-shot"
    assert len(out.read_text().splitlines()) == 2


def test_eval_calibration_takes_a_plain_lm(models, tmp_path):
    lm, _ = models
    out = tmp_path / "cal.json"
    data = make_counts(tmp_path / "counts.jsonl", n=6)
    assert main(["eval-calibration", "--model", str(lm), "--data", str(data), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["model_kind"] == "zero-shot"


def test_bfloat16_loads_and_scores(models, tmp_path):
    """--dtype bfloat16 on CPU: the backbone's weights in bfloat16, the kappa head float32,
    scores near the float32 ones; a BetaPRM and a zero-shot LM alike, and the command records
    the dtype among the settings its output must match on resume."""
    lm, prm_dir = models
    for path in (prm_dir, lm):
        full, _ = load_prm(path, "cpu")
        half, _ = load_prm(path, "cpu", dtype="bfloat16")
        assert next(half.backbone.parameters()).dtype == torch.bfloat16
        assert next(full.backbone.parameters()).dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in half.kappa_head.parameters())
        for a, b in zip(score_traces(full, TRACES), score_traces(half, TRACES)):
            assert np.isfinite(b.mu).all() and np.isfinite(b.kappa).all()
            np.testing.assert_allclose(b.mu, a.mu, atol=0.03)
            np.testing.assert_allclose(b.kappa, a.kappa, rtol=0.05)
    pools = write_pools(tmp_path / "pools.jsonl", 2)
    out = tmp_path / "bf16.jsonl"
    args = ["score", "--model", str(prm_dir), "--input", str(pools), "--output", str(out), "--device", "cpu"]
    assert main([*args, "--dtype", "bfloat16"]) == 0
    assert json.loads(Path(str(out) + ".meta.json").read_text())["settings"]["dtype"] == "bfloat16"
    assert all(np.isfinite(c["mu"]).all() for r in read_out(out) for c in r["candidates"])
    assert main(args) == 2  # a float32 rerun does not append to bfloat16 scores


def test_the_options_are_in_every_commands_help():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    loads = {"score", "eval-steps", "eval-bon", "eval-calibration", "serve", "aca", "search"}
    draws = {"score", "eval-steps", "eval-bon", "eval-calibration", "aca", "search", "label", "train"}
    for name in COMMANDS:
        text = subparsers[name].format_help()
        assert ("--dtype {auto,float32,bfloat16,float16}" in text) == (name in loads), name
        assert ("--disable-tqdm" in text) == (name in draws), name
