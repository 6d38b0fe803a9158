"""Outputs that know where they came from: a resume under other settings stops and names
them, a second writer is locked out, train keeps an earlier run's output dir, and JSON
results carry their settings and stay strict JSON."""

import json
import math
import random
import shutil
import signal
import subprocess
import sys

import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.provenance import finite_or_null, json_line, model_fingerprint
from betaprm.train import TrainConfig

from .helpers import make_counts, make_lm_dir


def write_pools(path, n, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            cands = [
                {
                    "steps": [
                        f"{rng.randint(0, 9)} + {rng.randint(0, 9)} = {rng.randint(0, 18)}"
                        for _ in range(rng.randint(1, 3))
                    ]
                }
                for _ in range(3)
            ]
            f.write(json.dumps({"id": f"p{i}", "question": f"problem {i}", "answer": "7", "candidates": cands}) + "\n")
    return path


def score(model, pools, out, *extra):
    return main(
        ["score", "--model", str(model), "--input", str(pools), "--output", str(out), "--device", "cpu", *extra]
    )


# ---------------------------------------------------------------- fingerprints


def test_model_fingerprint_follows_contents_not_paths(prms, tmp_path):
    """A copied model keeps its fingerprint, files betaprm writes beside a model do not
    count, and other weights give another one. A file over the whole-hash size is
    fingerprinted by sampled blocks, which still see a change in its body."""
    a, b = prms
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    (copy / "train_summary.json").write_text("{}")
    assert model_fingerprint(copy) == model_fingerprint(a) != model_fingerprint(b)
    # a hub name is resolved to its snapshot (tests/test_hub.py); one that cannot be is an error
    with pytest.raises(BetaPRMInputError, match="org/some-hub-model"):
        model_fingerprint("org/some-hub-model")
    big = tmp_path / "big"
    big.mkdir()
    data = bytearray(random.Random(0).randbytes(20 << 20))
    (big / "model.safetensors").write_bytes(data)
    before = model_fingerprint(big)
    mid = len(data) // 2
    data[mid : mid + (1 << 20)] = bytes(1 << 20)  # one MiB zeroed in the middle of the file
    (big / "model.safetensors").write_bytes(data)
    assert model_fingerprint(big) != before


# ---------------------------------------------------------------- score


def test_score_resumed_with_another_model_stops(prms, tmp_path, capsys):
    """Fails before this change: the run exited 0, keeping model a's records for p0-p2
    and appending model b's for p3-p5 in one file."""
    a, b = prms
    out = tmp_path / "out.jsonl"
    assert score(a, write_pools(tmp_path / "three.jsonl", 3), out) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert score(b, write_pools(tmp_path / "six.jsonl", 6), out) == 2
    err = capsys.readouterr().err
    assert "--model:" in err and str(a) in err and str(b) in err and "another --output" in err
    assert "Traceback" not in err
    assert out.read_bytes() == before  # not a byte appended


def test_score_resumed_with_another_batch_size_continues(prms, tmp_path, capsys):
    """Batching does not change a record, so it is not a setting: the resume goes on.
    (Guards the settings against being too strict; passed before this change too.)"""
    a, _ = prms
    out = tmp_path / "out.jsonl"
    assert score(a, write_pools(tmp_path / "three.jsonl", 3), out, "--batch-size", "2") == 0
    assert (
        score(a, write_pools(tmp_path / "six.jsonl", 6), out, "--batch-size", "5", "--max-batch-tokens", "4096") == 0
    )
    assert "3 already in" in capsys.readouterr().out
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [f"p{i}" for i in range(6)]
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert meta["settings"]["model"] == model_fingerprint(a) and meta["info"]["model"] == str(a)
    assert "batch_size" not in meta["settings"]


def test_a_second_score_process_is_locked_out(prms, tmp_path, capsys):
    """Fails before this change: two processes on one --output both scored every record,
    so the file held each one twice. The lock holder is a real process; once it is
    killed the OS releases the lock and the next run goes through."""
    a, _ = prms
    pools = write_pools(tmp_path / "pools.jsonl", 4)
    out = tmp_path / "out.jsonl"
    holder = (
        "import sys, time\nfrom betaprm.provenance import open_output\n"
        "with open_output(sys.argv[1], {}, flag='--output'):\n    print('locked', flush=True)\n    time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        capsys.readouterr()
        assert score(a, pools, out) == 2
        err = capsys.readouterr().err
        assert f"another process is writing {out}" in err and "Traceback" not in err
        assert not out.exists()  # nothing written
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert score(a, pools, out) == 0
    assert score(a, pools, out) == 0  # a finished run holds no lock either
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [f"p{i}" for i in range(4)]


# ---------------------------------------------------------------- aca and label


def test_aca_resumed_with_another_variant_stops(prms, tmp_path, capsys):
    """Fails before this change: `--variant aca` on best-of-n records skipped every
    problem already there and reported the best-of-n records as ACA's."""
    a, _ = prms
    common = [
        "aca",
        "--model",
        str(a),
        "--n-problems",
        "3",
        "--budget",
        "4",
        "--n0",
        "2",
        "--m",
        "2",
        "--final",
        "lin",
        "--device",
        "cpu",
    ]
    out = tmp_path / "aca.jsonl"
    assert main([*common, "--variant", "best-of-n", "--out", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*common, "--variant", "aca", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--variant: 'best-of-n' before, 'aca' now" in err
    assert out.read_bytes() == before


def test_label_resumed_with_another_n_stops(tmp_path, capsys):
    """Fails before this change: a rerun with --n 4 kept the --n 2 counts of the traces
    already labelled and appended --n 4 counts for the rest."""
    out = tmp_path / "lab.jsonl"
    assert main(["label", "--out", str(out), "--n-problems", "2", "--n", "2"]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["label", "--out", str(out), "--n-problems", "4", "--n", "4"]) == 2
    assert "--n: 2 before, 4 now" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["label", "--out", str(out), "--n-problems", "4", "--n", "2"]) == 0  # more problems: a resume


# ---------------------------------------------------------------- train


@pytest.fixture(scope="module")
def train_setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    return make_lm_dir(d / "lm"), make_counts(d / "counts.jsonl", n=16), make_counts(d / "other.jsonl", n=16, seed=1)


def train_args(lm, data, out, *extra):
    return [
        "train",
        "--model",
        str(lm),
        "--data",
        str(data),
        "--output-dir",
        str(out),
        "--global-batch-size",
        "4",
        "--per-device-train-batch-size",
        "4",
        "--learning-rate",
        "1e-3",
        "--max-steps",
        "2",
        "--save-steps",
        "1",
        "--logging-steps",
        "1",
        "--use-cpu",
        *extra,
    ]


def snapshot(folder):
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_train_refuses_a_used_output_dir(train_setup, tmp_path, capsys):
    """Fails before this change: the second run rotated the first run's checkpoints away
    and overwrote its model without a word."""
    lm, data, _ = train_setup
    out = tmp_path / "run"
    assert main(train_args(lm, data, out)) == 0
    assert (out / "checkpoint-2" / "betaprm_run.json").is_file()
    before = snapshot(out)
    capsys.readouterr()
    assert main(train_args(lm, data, out, "--seed", "7")) == 2
    err = capsys.readouterr().err
    assert (
        f"--output-dir {out} is not empty" in err
        and "--overwrite-output-dir" in err
        and "--resume-from-checkpoint last" in err
    )
    assert snapshot(out) == before
    # Starting anew is explicit; the earlier run's checkpoints go, so none can be mistaken for this run's.
    (out / "checkpoint-99").mkdir()
    assert main(train_args(lm, data, out, "--seed", "7", "--overwrite-output-dir")) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert json.loads((out / "train_summary.json").read_text())["config"]["seed"] == 7
    with pytest.raises(BetaPRMInputError, match="give one of them"):
        TrainConfig(model=str(lm), data=str(data), overwrite_output_dir=True, resume_from_checkpoint="last")


@pytest.fixture(scope="module")
def one_step_run(train_setup, tmp_path_factory):
    """A finished one-step run whose checkpoint-1 the resume tests try to continue."""
    lm, data, _ = train_setup
    out = tmp_path_factory.mktemp("resume") / "run"
    assert main(train_args(lm, data, out, "--max-steps", "1")) == 0
    return out


@pytest.mark.parametrize(
    "change, key",
    [
        (("--learning-rate", "2e-3"), "--learning-rate: 0.001 before, 0.002 now"),
        (("--data", "OTHER"), "--data:"),
        (("--objective", "soft-ce"), "--objective: 'beta-binomial' before, 'soft-ce' now"),
    ],
)
def test_train_resume_under_other_settings_stops(train_setup, one_step_run, capsys, change, key):
    """Fails before this change: a resume with another --learning-rate or --data ran on
    silently under the checkpoint's optimiser state and schedule; another --objective
    crashed with a ValueError from the optimiser's parameter groups."""
    lm, data, other = train_setup
    out = one_step_run
    before = snapshot(out)
    flag, value = change
    # The changed flag comes last: argparse keeps the last of a flag given twice.
    args = [
        *train_args(lm, data, out, "--max-steps", "1", "--resume-from-checkpoint", "last"),
        flag,
        str(other) if value == "OTHER" else value,
    ]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err
    if flag == "--data":
        assert str(data) in err and str(other) in err
    assert snapshot(out) == before


# ---------------------------------------------------------------- JSON results


def test_eval_bon_out_records_its_settings(tmp_path):
    """Fails before this change: the --out JSON had the results but not what made them."""
    pools = tmp_path / "bench.jsonl"
    c = [
        {"steps": ["3 + 4 = 8", "The answer is \\boxed{8}"], "mu": [0.5, 0.4], "kappa": [4, 4], "sigma": [0.2, 0.2]},
        {"steps": ["3 + 4 = 7", "The answer is \\boxed{7}"], "mu": [0.9, 0.9], "kappa": [4, 4], "sigma": [0.1, 0.1]},
    ]
    pools.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "question": f"3 + 4? ({i})", "answer": "7", "candidates": c}) + "\n"
            for i in range(10)
        )
    )
    out = tmp_path / "r.json"
    assert main(["eval-bon", "--pools", str(pools), "--out", str(out), "--seed", "3"]) == 0
    prov = json.loads(out.read_text())["provenance"]
    assert (
        prov["settings"]["seed"] == 3 and prov["settings"]["val_fraction"] == 0.2 and prov["settings"]["model"] is None
    )
    assert list(prov["settings"]["pools"]) == [str(pools)] and len(prov["settings"]["pools"][str(pools)]) == 16
    assert "batch_size" not in prov["settings"] and prov["info"]["betaprm"]


def test_records_and_results_stay_strict_json():
    """Fails before this change: json.dumps wrote NaN, which strict JSON readers reject;
    now a record with a NaN is refused, naming it and the field, and a result's
    undefined values are written as null."""
    with pytest.raises(BetaPRMInputError, match=r"record 'p3': field candidates\[1\]\.mu\[0\] is nan"):
        json_line({"id": "p3", "candidates": [{"mu": [0.5]}, {"mu": [math.nan]}]})
    assert json_line({"id": "p1", "mu": [0.5]}) == '{"id": "p1", "mu": [0.5]}\n'
    assert finite_or_null({"acc": math.nan, "ci": [math.inf, 0.5], "n": 0}) == {"acc": None, "ci": [None, 0.5], "n": 0}


def test_damaged_sidecar_or_folder_output_is_an_input_error(prms, tmp_path, capsys):
    """A sidecar whose settings are not an object, and an --output that is a folder, end
    with exit 2 naming the file (before: AttributeError / IsADirectoryError tracebacks)."""
    pools = write_pools(tmp_path / "pools.jsonl", 2)
    out = tmp_path / "out.jsonl"
    assert score(prms[0], pools, out) == 0
    (tmp_path / "out.jsonl.meta.json").write_text('{"settings": "x"}')
    capsys.readouterr()
    assert score(prms[0], pools, out) == 2
    assert "out.jsonl.meta.json: not a betaprm settings file" in capsys.readouterr().err
    (tmp_path / "folder").mkdir()
    assert score(prms[0], pools, tmp_path / "folder") == 2
    assert "is a folder; give the path of the output file" in capsys.readouterr().err
