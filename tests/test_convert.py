"""Converters on fixtures written from the documented field layouts; outputs checked exactly."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from betaprm.data.convert import ConvertOptions, convert_file
from betaprm.data.records import read_records
from betaprm.errors import BetaPRMInputError

DATA = Path(__file__).parent / "data"


def run(fmt, name, tmp_path, on_error="skip", **opts):
    out = tmp_path / f"{name}.out.jsonl"
    rejects = tmp_path / f"{name}.rejects.jsonl"
    stats = convert_file(
        fmt, DATA / name, out, ConvertOptions(source_name=Path(name).stem, **opts), on_error=on_error, rejects=rejects
    )
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    rej = [json.loads(x) for x in rejects.read_text().splitlines()] if rejects.exists() else []
    return stats, recs, rej


def test_visualprm_raw_keeps_counts(tmp_path):
    stats, recs, rej = run("visualprm-raw", "visualprm_raw.jsonl", tmp_path, image_root="/data/images")
    assert recs == [
        {
            "id": "visualprm_raw-1",
            "question": "In the triangle shown, find x.",
            "images": ["/data/images/MAVIS-Geometry/depth1/17/17.jpg"],
            "steps": ["The angles sum to 180.", "So x = 30."],
            "mc_correct": [12, 8],
            "mc_total": [16, 16],
            "answer": "30",
            "source": "visualprm_raw",
        },
        {
            "id": "visualprm_raw-2",
            "question": "Which bar is tallest?",
            "images": ["/data/images/ChartQA/train/png/5.png"],
            "steps": ["Bar A is 3.", "Bar B is 7, the tallest."],
            "mc_correct": [1, 0],
            "mc_total": [16, 16],
            "answer": "B",
            "source": "visualprm_raw",
        },
    ]
    assert stats == {
        "read": 3,
        "written": 2,
        "rejected": 1,
        "steps": 4,
        "hard_labels": False,
        "soft": False,
        "er_values_as_rates": False,
    }
    assert rej[0]["line"] == 3 and "steps_with_score[0].num_mc_correct" in rej[0]["reasons"][0]


def test_math_shepherd(tmp_path):
    stats, recs, rej = run("math-shepherd", "math_shepherd.jsonl", tmp_path)
    assert recs == [
        {
            "id": "math_shepherd-1",
            "question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
            "steps": ["Step 1: He has 3 + 2 = 5 apples.", "Step 2: The answer is: 5"],
            "mc_correct": [1, 1],
            "mc_total": 1,
            "source": "GSM8K",
        },
        {
            "id": "math_shepherd-2",
            "question": "What is 6 * 7?",
            "steps": ["Step 1: 6 * 7 = 48", "Step 2: The answer is: 48"],
            "mc_correct": [0, 0],
            "mc_total": 1,
            "source": "MATH",
        },
    ]
    assert rej[0]["line"] == 3 and "'Step 1:' is missing" in rej[0]["reasons"][0]


@pytest.mark.parametrize("neutral_correct,expected_k2", [(True, [1, 1, 1]), (False, [0, 1, 1])])
def test_prm800k(tmp_path, neutral_correct, expected_k2):
    stats, recs, rej = run("prm800k", "prm800k.jsonl", tmp_path, neutral_correct=neutral_correct)
    assert not rej
    assert recs[0] == {
        "id": "prm800k-1",
        "question": "What is 1+2+3?",
        "steps": ["1+2 = 3.", "3+3 = 7."],
        "mc_correct": [1, 0],
        "mc_total": 1,
        "answer": "6",
        "source": "prm800k",
    }
    # Path: chosen completion 0 (neutral), then the human replacement, then the answer.
    assert recs[1] == {
        "id": "prm800k-2",
        "question": "Simplify 2x+3x.",
        "steps": ["Like terms combine.", "So it is 5x.", "# Answer\n\n5x"],
        "mc_correct": expected_k2,
        "mc_total": 1,
        "answer": "5x",
        "source": "prm800k",
    }


def test_trl_hard_and_soft(tmp_path):
    with pytest.raises(BetaPRMInputError, match="pass --soft-n N"):
        run("trl", "trl_stepwise.jsonl", tmp_path, on_error="fail")
    stats, recs, rej = run("trl", "trl_stepwise.jsonl", tmp_path, soft_n=16)
    assert recs[0] == {
        "id": "trl_stepwise-1",
        "question": "Which number is larger, 9.8 or 9.11?",
        "steps": [
            "The fractional part of 9.8 is 0.8.",
            "The fractional part of 9.11 is 0.11.",
            "0.11 is greater than 0.8.",
            "So 9.11 is larger.",
        ],
        "mc_correct": [1, 1, 0, 0],
        "mc_total": 1,
        "source": "trl_stepwise",
    }
    assert recs[1] == {
        "id": "trl_stepwise-2",
        "question": "2+2?",
        "steps": ["2+2=4", "Answer: 4"],
        "mc_correct": [13.0, 16.0],
        "mc_total": 16,
        "soft": True,
        "source": "trl_stepwise",
    }
    # Soft counts survive loading un-rounded.
    loaded = read_records(tmp_path / "trl_stepwise.jsonl.out.jsonl").records
    assert loaded[1].soft and loaded[1].mc_correct == [13.0, 16.0]


def test_trl_soft_n_fractional_k(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"prompt": "q", "completions": ["a"], "labels": [0.3]}) + "\n")
    out = tmp_path / "o.jsonl"
    convert_file("trl", src, out, ConvertOptions(source_name="t", soft_n=16))
    assert json.loads(out.read_text())["mc_correct"] == [pytest.approx(4.8)]


def test_convert_cli(tmp_path):
    out = tmp_path / "ms.jsonl"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "betaprm",
            "convert",
            "--from",
            "math-shepherd",
            "--input",
            str(DATA / "math_shepherd.jsonl"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert (
        res.returncode == 2
        and "1 of 3 records cannot be converted" in res.stderr
        and ":3: field 'input'" in res.stderr
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "betaprm",
            "convert",
            "--from",
            "math-shepherd",
            "--input",
            str(DATA / "math_shepherd.jsonl"),
            "--output",
            str(out),
            "--on-error",
            "skip",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert "3 read, 2 records with 4 steps written" in res.stdout and "1 rejected" in res.stdout
    assert (tmp_path / "ms.rejects.jsonl").exists()
    # Math-Shepherd's labels are hard: the summary says what that means for a BetaPRM
    assert "hard labels (N = 1 per step)" in res.stdout and "kappa learns nothing" in res.stdout


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mc_prefix_counts_from_success_rates(tmp_path):
    """PRM-calibration layout: one row per prefix (steps split by blank lines), rates over 8 rollouts."""
    q = "What is 2 + 3 * 4?"
    rows = [
        {"question": q, "reasoning_prefix": "", "success_prob": 0.5},  # the empty prefix labels no step
        {"question": q, "reasoning_prefix": "3 * 4 = 12", "success_prob": 0.75},
        {"question": q, "reasoning_prefix": "3 * 4 = 12\n\n2 + 12 = 14", "success_prob": 1.0},
        {"question": q, "reasoning_prefix": "3 * 4 = 12\n\n2 + 12 = 15", "success_prob": 0.0},
        {"question": q, "reasoning_prefix": "3 * 4 = 12", "success_prob": 0.625},  # same prefix again: pooled
        {"question": "Other?", "reasoning_prefix": "a\n\nb", "success_prob": 0.25},  # its 1-step prefix is missing
    ]
    src = _write(tmp_path / "cal.jsonl", rows)
    out = tmp_path / "o.jsonl"
    stats = convert_file(
        "mc-prefix", src, out, ConvertOptions(source_name="cal", mc_n=8), on_error="skip", rejects=tmp_path / "r.jsonl"
    )
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert recs == [
        {
            "id": "cal-3",
            "question": q,
            "steps": ["3 * 4 = 12", "2 + 12 = 14"],
            "mc_correct": [6 + 5, 8],
            "mc_total": [16, 8],
            "source": "cal",
        },
        {
            "id": "cal-4",
            "question": q,
            "steps": ["3 * 4 = 12", "2 + 12 = 15"],
            "mc_correct": [6 + 5, 0],
            "mc_total": [16, 8],
            "source": "cal",
        },
    ]
    rej = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rej] == [6] and "prefixes of 1 step(s)" in rej[0]["reasons"][0]
    assert stats["written"] == 2 and stats["rejected"] == 1 and not stats["hard_labels"]
    # a rate that is not a whole number of 8 rollouts is refused, never rounded away
    _write(src, [{"question": q, "reasoning_prefix": "x", "success_prob": 0.3}])
    with pytest.raises(BetaPRMInputError, match=r"field 'success_prob': = 0.3 with --mc-n 8 gives 2.4 successes"):
        convert_file("mc-prefix", src, out, ConvertOptions(mc_n=8))
    # with response ids, solutions that share a prefix stay apart
    rows = [
        {"question": q, "response_id": 0, "reasoning_prefix": "s1", "success_prob": 1.0},
        {"question": q, "response_id": 1, "reasoning_prefix": "s1", "success_prob": 0.5},
    ]
    _write(src, rows)
    convert_file("mc-prefix", src, out, ConvertOptions(source_name="cal", mc_n=8))
    assert [json.loads(x)["mc_correct"] for x in out.read_text().splitlines()] == [[8], [4]]


def test_er_prm_soft_labels(tmp_path):
    import math

    text = "Janet has 3 apples. How many? Step 1: 3 + 2 = 5 ки\nStep 2: The answer is: 5 ки"
    src = _write(tmp_path / "er.json", [])
    src.write_text(json.dumps([{"text": text, "value": [0.8, 1.0]}]))
    out = tmp_path / "o.jsonl"
    stats = convert_file("er-prm", src, out, ConvertOptions(source_name="er", soft_n=16))
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert rec["question"] == "Janet has 3 apples. How many?" and rec["steps"] == [
        "Step 1: 3 + 2 = 5",
        "Step 2: The answer is: 5",
    ]
    assert rec["mc_correct"] == [0.8 * 16, 16.0] and rec["mc_total"] == 16 and rec["soft"] is True
    assert stats["soft"] and not stats["hard_labels"]
    # ER-PRM's value for p = 12/16 at eta = 2, inverted back
    v = math.log(1 - 0.75 + 0.75 * math.exp(2)) / 2
    src.write_text(json.dumps([{"text": text, "value": [v, 1.0]}]))
    convert_file("er-prm", src, out, ConvertOptions(source_name="er", soft_n=16, er_eta=2.0))
    (rec,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert rec["mc_correct"] == pytest.approx([12.0, 16.0])
    src.write_text(json.dumps([{"text": text, "value": [0.8]}]))
    with pytest.raises(BetaPRMInputError, match=r"field 'value': has 1 labels for 2 step tags"):
        convert_file("er-prm", src, out, ConvertOptions(soft_n=16))
