"""One length rule for train, its held-out data and scoring: --max-length defaults to the
model's positions, more than them is refused, and a trace trained on is one `score` accepts."""

from __future__ import annotations

import json

import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.formatting import encode_traces
from betaprm.train import train

from .helpers import train_config


@pytest.fixture(scope="module")
def short_lm(tmp_path_factory):
    """A tiny causal LM with 48 positions and its tokenizer."""
    from betaprm.tiny import tiny_causal_lm, train_bytelevel_tokenizer

    from .helpers import CORPUS

    d = tmp_path_factory.mktemp("short") / "lm"
    tok = train_bytelevel_tokenizer(CORPUS + ["1 + 2 = 3 so 4 + 5 = 9"] * 20, vocab_size=400)
    tiny_causal_lm(len(tok), hidden_size=32, max_position_embeddings=48).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _long_counts(path, n=16, steps=12):
    rows = [
        {
            "id": f"r{i}",
            "question": "add these",
            "steps": [f"{a} + {a + 1} = {2 * a + 1}" for a in range(steps)],
            "mc_correct": [4] * steps,
            "mc_total": 8,
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_default_max_length_is_the_models_positions_and_scoring_accepts_what_was_trained(tmp_path, short_lm):
    data = _long_counts(tmp_path / "long.jsonl")
    cfg = train_config(short_lm, data, tmp_path / "out", max_steps=1, save_steps=1)
    assert cfg.max_length is None
    prm, trainer, _ = train(cfg, quiet=True)
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert summary["config"]["max_length"] == 48  # the model's positions
    assert summary["truncation"]["truncated_records"] == 16  # every trace was longer: cut to whole steps
    lengths = [len(e["input_ids"]) for e in trainer.train_dataset.examples]
    assert max(lengths) <= 48
    # The traces as trained on, scored: accepted (before, training took 8192 tokens that score refused).
    pools = tmp_path / "pools.jsonl"
    kept = summary["truncation"]
    assert kept["records"] == 16
    steps = json.loads(data.read_text().splitlines()[0])["steps"]

    def n_tokens(n):
        return len(
            encode_traces(prm.tokenizer, prm.config.marker_id, [("add these", steps[:n])], prm.config.trace_format)[0]
        )

    n_kept = max(n for n in range(1, len(steps)) if n_tokens(n) <= 48)
    assert n_tokens(len(steps)) > 48
    pools.write_text(
        json.dumps({"id": "p", "question": "add these", "candidates": [{"steps": steps[:n_kept]}]}) + "\n"
    )
    assert (
        main(["score", "--model", str(tmp_path / "out"), "--input", str(pools), "--output", str(tmp_path / "s")]) == 0
    )


def test_more_than_the_positions_is_refused_before_training(tmp_path, short_lm, capsys):
    data = _long_counts(tmp_path / "long.jsonl")
    with pytest.raises(BetaPRMInputError, match=r"--max-length 100 is more than the 48 positions"):
        train(train_config(short_lm, data, tmp_path / "out", max_length=100), quiet=True)
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_held_out_items_follow_the_same_rule(tmp_path, short_lm, capsys):
    """ProcessBench items as --eval-data: cut to the positions (--truncate steps) or left out
    (reject), never scored past them."""
    data = _long_counts(tmp_path / "train.jsonl", steps=2)
    items = [
        {
            "id": f"e{i}",
            "problem": "add these",
            "steps": [f"{a} + 1 = {a + 1}" for a in range(2 + 6 * (i % 2))],
            "label": -1 if i % 3 else 1,
        }
        for i in range(8)
    ]
    held = tmp_path / "pb.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in items))
    logs = []
    cfg = train_config(short_lm, data, tmp_path / "a", eval_data=str(held), max_steps=1, save_steps=1)
    train(cfg, quiet=True, log=logs.append)
    assert any("cut to --max-length" in line for line in logs), logs
    logs.clear()
    cfg = train_config(
        short_lm, data, tmp_path / "b", eval_data=str(held), max_steps=1, save_steps=1, truncate="reject"
    )
    train(cfg, quiet=True, log=logs.append)
    assert any("longer than --max-length left out" in line for line in logs), logs
