"""A file of the wrong kind gets one line naming what it looks like and the command that
reads it, in validate, train, score, eval-bon, eval-calibration and eval-steps; per-row
problems of a file of the right kind are capped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from betaprm.cli import main
from betaprm.data.kinds import KINDS, identify

SAMPLES = {
    "trl": {"prompt": "What is 2+3?", "completions": ["2+3=5", "So 5"], "labels": [True, True]},
    "math-shepherd": {"input": "2+3=5 ки So 5 ки", "label": "2+3=5 + So 5 +", "task": "GSM8K"},
    "prm800k": {"question": {"problem": "q"}, "label": {"steps": []}},
    "er-prm": {"text": "a ки b ки", "value": [0.5, 0.2]},
    "mc-prefix": {"question": "q", "reasoning_prefix": "a", "success_prob": 0.5},
    "visualprm-raw": {"question": "q", "steps_with_score": [{"step": "a", "score": 0.5}]},
    "authors-train": {"image": "a.png", "conversations": [{"from": "human", "value": "x"}], "prm_counts": {}},
    "authors-pool": {"question": "q", "solutions_splits": [["a", "12"]], "labels": [1]},
    "processbench": {"id": "g-0", "problem": "q", "steps": ["a"], "label": -1},
    "prmbench": {"idx": 1, "modified_process": ["a"], "classification": "x"},
    "visualprocessbench": {"id": 1, "response": {"steps": ["a"]}, "label": [1]},
    "pool": {"id": "p", "question": "q", "candidates": [{"steps": ["a"]}]},
    "counts": {"id": "c", "question": "q", "steps": ["a"], "mc_correct": [1], "mc_total": 4},
    "problems": {"id": "p", "question": "q", "answer": "5"},
}


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from betaprm.model import BetaPRM
    from tests.helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return d / "prm"


def test_every_kind_is_identified_from_one_record():
    assert set(SAMPLES) == set(KINDS)
    for kind, obj in SAMPLES.items():
        assert identify(obj) == kind, kind
    assert identify([SAMPLES["authors-pool"]] * 2) == "authors-pool"  # a JSON list of items
    assert identify({"x": 1}) is None and identify("text") is None


def _write(path, obj, n=40):
    path.write_text("".join(json.dumps({**obj, "id": f"r{i}"} if "id" in obj else obj) + "\n" for i in range(n)))
    return path


def test_validate_on_trl_data_is_one_line_naming_convert():
    """Today: 160 field errors for 40 rows. Now: a line, exit 2 (a real process)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = _write(Path(d) / "trl.jsonl", SAMPLES["trl"])
        res = subprocess.run([sys.executable, "-m", "betaprm", "validate", str(path)], capture_output=True, text=True)
    assert res.returncode == 2
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) <= 3 and "TRL stepwise data" in lines[-1]
    assert f"betaprm convert --from trl --input {path}" in lines[-1]


@pytest.mark.parametrize(
    "argv,sample,words",
    [
        (["validate", "{f}", "--kind", "pool"], "counts", "betaprm train --data"),
        (["validate", "{f}"], "processbench", "betaprm eval-steps --data"),
        (["validate", "{f}"], "authors-train", "convert --from authors-train"),
        (
            ["train", "--model", "{m}", "--data", "{f}", "--output-dir", "{o}", "--on-error", "skip"],
            "trl",
            "--from trl",
        ),
        (["score", "--model", "{m}", "--input", "{f}", "--output", "{o}.jsonl"], "counts", "betaprm train --data"),
        (["eval-bon", "--model", "{m}", "--pools", "{f}", "--out", "{o}.json"], "math-shepherd", "math-shepherd"),
        (["eval-calibration", "--model", "{m}", "--data", "{f}", "--out", "{o}.json"], "pool", "score --input"),
        (["eval-steps", "--model", "{m}", "--data", "{f}", "--out", "{o}.json"], "counts", "betaprm train --data"),
    ],
)
def test_each_command_names_the_kind_in_one_line(tmp_path, capsys, prm_dir, argv, sample, words):
    f = _write(tmp_path / "in.jsonl", SAMPLES[sample])
    argv = [a.format(f=f, m=prm_dir, o=tmp_path / "out") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "looks like" in err and words in err, err


def test_problems_of_a_right_kind_file_are_capped(tmp_path, capsys):
    rows = [{"id": f"c{i}", "question": "q", "steps": ["a"], "mc_correct": [9], "mc_total": 4} for i in range(50)]
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["validate", str(tmp_path / "bad.jsonl")]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("0 good records, 50 bad") and out[-1] == "  ... and 30 more problems"
    assert len(out) == 22
