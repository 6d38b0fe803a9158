import json
import os
import subprocess
import sys

import pytest

from betaprm.cli import main


def run_cli(*args, cwd=None):
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "betaprm", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_help_lists_commands_and_options():
    top = run_cli("--help")
    assert top.returncode == 0 and "demo" in top.stdout and "Beta belief" in top.stdout
    sub = run_cli("demo", "--help")
    assert sub.returncode == 0
    for flag in ("--out", "--steps", "--quick", "--config", "--seed", "--lambda-reg"):
        assert flag in sub.stdout
    assert "default: 80" in sub.stdout


def test_demo_quick_end_to_end(tmp_path):
    res = run_cli("demo", "--quick", "--out", str(tmp_path / "d"))
    assert res.returncode == 0, res.stderr
    assert "held-out scores" in res.stdout and "mu" in res.stdout
    result = json.loads((tmp_path / "d" / "results.json").read_text())
    assert len(result["history"]) == 20 and result["seed"] == 0 and result["config"]["quick"] is True
    assert result["heldout_nll_after"] < result["heldout_nll_before"]
    lines = (tmp_path / "d" / "scores.jsonl").read_text().splitlines()
    assert len(lines) == 16
    rec = json.loads(lines[0])
    assert len(rec["mu"]) == len(rec["steps"]) == len(rec["kappa"]) == len(rec["sigma"])
    from betaprm import BetaPRM

    assert BetaPRM.from_pretrained(tmp_path / "d" / "model").config.marker == "<prm>"


def test_bad_input_exits_2_with_one_message(tmp_path):
    res = run_cli("demo", "--data", str(tmp_path / "missing.jsonl"))
    assert res.returncode == 2
    assert "missing.jsonl: no such file" in res.stderr and "Traceback" not in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "steps": ["a"], "mc_correct": [3], "mc_total": 2}\n')
    res = run_cli("demo", "--data", str(bad))
    assert res.returncode == 2 and "bad.jsonl line 1: field mc_correct/mc_total" in res.stderr
    res = run_cli("demo", "--steps", "0")
    assert res.returncode == 2 and "steps must be >= 1, got 0" in res.stderr


def test_config_file_then_flags(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 3\nholdout: 8\nout: " + str(tmp_path / "o") + "\n")
    assert main(["demo", "--config", str(cfg), "--steps", "2"]) == 0
    result = json.loads((tmp_path / "o" / "results.json").read_text())
    assert result["config"]["steps"] == 2 and result["config"]["holdout"] == 8  # flag wins, file fills
    cfg.write_text("stepz: 3\n")
    assert main(["demo", "--config", str(cfg)]) == 2
    assert "unknown keys ['stepz']" in capsys.readouterr().err
