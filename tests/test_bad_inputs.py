"""Damaged inputs found by a tester: every reader turns them into exit status 2 with one
message naming the file (and line and field where there is one), never a traceback, and
loses nothing valid. Each docstring says what the code did before."""

import json
import shutil
import time

import pytest

from betaprm.cli import main
from betaprm.data.records import read_records

GOOD = {"id": "ok-1", "question": "2+2?", "steps": ["2+2=4", "answer 4"], "mc_correct": [7, 8], "mc_total": 8}
POOL = {"id": "p1", "question": "2+2?", "answer": "4", "candidates": [{"steps": ["2+2=4", "answer \\boxed{4}"]}]}
VPB = {
    "id": "v1",
    "question": "2+2?",
    "data_source": "s",
    "response": {"steps": ["2+2=4", "answer 4"], "process_correctness": [1, 1]},
}
HUGE = "9" * 5000


def write_lines(path, lines) -> str:
    """``lines``: objects (written as JSON), str (written as is) or bytes."""
    with open(path, "wb") as f:
        for x in lines:
            f.write(x if isinstance(x, bytes) else (x if isinstance(x, str) else json.dumps(x)).encode())
            f.write(b"\n")
    return str(path)


def fails(argv, capsys, *names):
    """Run the CLI; it must exit 2 with one message naming every one of ``names``."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    msg = out + err
    for n in names:
        assert str(n) in msg, (n, msg)
    return msg


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from betaprm import BetaPRM

    from .helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm", hidden=16, layers=1))).save_pretrained(d / "prm")
    return d / "prm"


def damaged_copy(prm_dir, tmp_path, file, how):
    d = tmp_path / "ckpt"
    shutil.copytree(prm_dir, d)
    if how == "missing":
        (d / file).unlink()
    else:
        data = (d / file).read_bytes()
        (d / file).write_bytes(data[: len(data) // 2])
    return d


# ---------------------------------------------------------------- invalid UTF-8


def test_records_with_invalid_utf8(tmp_path, capsys):
    """Fails before this change: traceback UnicodeDecodeError (validate, train)."""
    path = write_lines(tmp_path / "r.jsonl", [GOOD, b'{"id": "x", "question": "caf\xe9"}'])
    fails(["validate", path], capsys, f"{path}:2", "(line)", "UTF-8")
    fails(
        ["train", "--model", str(tmp_path / "none"), "--data", path, "--output-dir", str(tmp_path / "run")],
        capsys,
        f"{path}:2",
        "UTF-8",
    )


def test_records_skip_keeps_raw_text_of_undecodable_and_non_json_lines(tmp_path):
    """Fails before this change: traceback UnicodeDecodeError; a non-JSON line was found
    again by re-reading the file from the start."""
    path = write_lines(
        tmp_path / "r.jsonl", [GOOD, b'{"id": "x", "question": "caf\xe9"}', "{not json", {**GOOD, "id": "ok-2"}]
    )
    rejects = tmp_path / "rej.jsonl"
    res = read_records(path, on_error="skip", rejects=rejects)
    assert [r.id for r in res.records] == ["ok-1", "ok-2"]
    rej = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert [r["line"] for r in rej] == [2, 3]
    assert rej[0]["raw"] == '{"id": "x", "question": "caf\ufffd"}' and "UTF-8" in rej[0]["reasons"][0]
    assert rej[1]["raw"] == "{not json" and rej[1]["record"] == "{not json"


def test_converter_with_invalid_utf8_fails_or_skips(tmp_path, capsys):
    """Fails before this change: traceback UnicodeDecodeError, even under --on-error skip."""
    good = {"prompt": "2+2?", "completions": ["2+2=4", "answer 4"], "labels": [True, True]}
    src = write_lines(tmp_path / "trl.jsonl", [good, b'{"prompt": "\xff"}', good])
    out = tmp_path / "out.jsonl"
    out.write_text("keep me\n")
    fails(["convert", "--from", "trl", "--input", src, "--output", str(out)], capsys, f"{src}:2", "UTF-8")
    assert out.read_text() == "keep me\n"  # untouched on failure
    assert main(["convert", "--from", "trl", "--input", src, "--output", str(out), "--on-error", "skip"]) == 0
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["trl-1", "trl-3"]
    rej = json.loads((tmp_path / "out.rejects.jsonl").read_text())
    assert rej["line"] == 2 and rej["raw"] == '{"prompt": "\ufffd"}'


def test_visualprocessbench_with_invalid_utf8(tmp_path, capsys):
    """Fails before this change: traceback UnicodeDecodeError."""
    data = write_lines(tmp_path / "vpb.jsonl", [VPB, b'{"question": "\xc3"}'])
    fails(["eval-steps", "--model", str(tmp_path / "none"), "--data", data], capsys, f"{data}:2", "UTF-8")


def test_problems_with_invalid_utf8(tmp_path, capsys, prm_dir):
    """Fails before this change: traceback UnicodeDecodeError."""
    probs = write_lines(tmp_path / "p.jsonl", [{"id": "a", "question": "q", "answer": "1"}, b'{"id": "b\x80"}'])
    fails(
        [
            "aca",
            "--model",
            str(prm_dir),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--problems",
            probs,
            "--backend",
            "openai",
            "--policy",
            "m",
        ],
        capsys,
        f"{probs}:2",
        "UTF-8",
    )


def test_label_traces_with_invalid_utf8(tmp_path, capsys):
    """Fails before this change: traceback UnicodeDecodeError."""
    traces = write_lines(tmp_path / "t.jsonl", [b'{"id": "a", "question": "\xfe"}'])
    fails(
        ["label", "--backend", "openai", "--policy", "m", "--input", traces, "--out", str(tmp_path / "o.jsonl")],
        capsys,
        f"{traces}:1",
        "UTF-8",
    )


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_with_invalid_utf8(tmp_path, capsys, suffix):
    """Fails before this change: traceback UnicodeDecodeError."""
    cfg = tmp_path / f"c{suffix}"
    cfg.write_bytes(b'{"seed": 1,\n "out": "\xe9"}\n')
    fails(["eval-bon", "--config", str(cfg)], capsys, f"--config {cfg}:2", "UTF-8")


def test_config_values_of_the_wrong_type(tmp_path, capsys):
    """Fails before this change: exit 2 with "bad configuration: '<' not supported between
    instances of 'int' and 'list'", naming neither the file nor the option."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"pools": "x.jsonl", "seed": "1", "val_fraction": [0.2]}))
    fails(["eval-bon", "--config", str(cfg)], capsys, f"--config {cfg}", "seed", "val_fraction")


# ---------------------------------------------------------------- JSON the parser chokes on


def test_integer_over_4300_digits(tmp_path, capsys):
    """Fails before this change: traceback ValueError (Exceeds the limit (4300 digits))."""
    path = write_lines(tmp_path / "r.jsonl", [GOOD, '{"id": "x", "question": "q", "mc_total": ' + HUGE + "}"])
    fails(["validate", path], capsys, f"{path}:2", "4300 digits")
    res = read_records(path, on_error="skip", rejects=tmp_path / "rej.jsonl")
    assert [r.id for r in res.records] == ["ok-1"]


def test_nan_and_infinity_tokens_are_refused(tmp_path, capsys):
    """Fails before this change: NaN parsed as a float (in a pool: scores accepted)."""
    pool = {**POOL, "candidates": [{"steps": ["a", "b"], "mu": [0.5, 0.5], "kappa": [2.0, 2.0], "sigma": [0.1, 0.1]}]}
    path = write_lines(tmp_path / "pool.jsonl", [json.dumps(pool).replace("0.5, 0.5", "NaN, Infinity")])
    fails(["validate", "--kind", "pool", path], capsys, f"{path}:1", "NaN")


# ---------------------------------------------------------------- converters


@pytest.mark.parametrize("image", [5, [1, 2]])
@pytest.mark.parametrize("key", ["image", "images"])
def test_visualprm_raw_with_non_path_images(tmp_path, capsys, image, key):
    """Fails before this change: traceback TypeError ("image": 5); "images": [1, 2] was
    written, and `validate` then rejected the output."""
    row = {"question": "q", key: image, "steps_with_score": [{"step": "a", "num_mc_correct": 1, "num_mc_total": 2}]}
    src = write_lines(tmp_path / "v.jsonl", [row])
    out = tmp_path / "out.jsonl"
    fails(["convert", "--from", "visualprm-raw", "--input", src, "--output", str(out)], capsys, f"{src}:1", "image")
    assert not out.exists()


def test_prm800k_with_non_object_completions(tmp_path, capsys):
    """Fails before this change: traceback AttributeError ('str' object has no attribute 'get')."""
    row = {"question": {"problem": "q"}, "label": {"steps": [{"completions": ["text"], "chosen_completion": 0}]}}
    src = write_lines(tmp_path / "p.jsonl", [row])
    fails(
        ["convert", "--from", "prm800k", "--input", src, "--output", str(tmp_path / "o.jsonl")],
        capsys,
        f"{src}:1",
        "label.steps[0].completions",
    )


def test_broken_json_converter_input(tmp_path, capsys):
    """Fails before this change: traceback JSONDecodeError."""
    src = tmp_path / "trl.json"
    src.write_text('[{"prompt": "q",\n  "completions": ["a"], "labels": [tru\n')
    fails(
        ["convert", "--from", "trl", "--input", str(src), "--output", str(tmp_path / "o.jsonl"), "--on-error", "skip"],
        capsys,
        f"{src}:2",
        "not valid JSON",
    )


def test_broken_parquet_converter_input(tmp_path, capsys):
    """Fails before this change: traceback pyarrow.lib.ArrowInvalid."""
    pytest.importorskip("pyarrow")
    src = tmp_path / "trl.parquet"
    src.write_bytes(b"PAR1 this is not parquet")
    fails(
        ["convert", "--from", "trl", "--input", str(src), "--output", str(tmp_path / "o.jsonl")],
        capsys,
        str(src),
        "parquet",
    )


# ---------------------------------------------------------------- VisualProcessBench


@pytest.mark.parametrize(
    "damage,field",
    [
        ({"response": {"steps": ["a", "b"], "process_correctness": [[1], 1]}}, "process_correctness"),
        ({"image": 5}, "image"),
    ],
)
def test_visualprocessbench_bad_fields(tmp_path, capsys, damage, field):
    """Fails before this change: traceback TypeError (unhashable list; int not iterable)."""
    data = write_lines(tmp_path / "vpb.jsonl", [VPB, {**VPB, **damage}])
    fails(["eval-steps", "--model", str(tmp_path / "none"), "--data", data], capsys, f"{data}:2", field)


# ---------------------------------------------------------------- label input


def test_label_candidates_that_are_not_objects(tmp_path, capsys):
    """Fails before this change: traceback AttributeError ('str' object has no attribute 'get')."""
    traces = write_lines(tmp_path / "t.jsonl", [{"id": "a", "question": "q", "answer": "1", "candidates": ["x"]}])
    fails(
        ["label", "--backend", "openai", "--policy", "m", "--input", traces, "--out", str(tmp_path / "o.jsonl")],
        capsys,
        f"{traces}:1",
        "candidates[0]",
    )


@pytest.mark.parametrize("where", ["steps", "question"])
def test_label_refuses_the_marker_in_its_input(tmp_path, capsys, where):
    """Fails before this change: read_traces accepted it and label went on to write
    records holding '<prm>', which train then rejects."""
    row = {"id": "a", "question": "q", "answer": "1", "steps": ["x = 1", "answer 1"]}
    row[where] = ["x = 1 <prm>", "answer 1"] if where == "steps" else "what is <prm>?"
    traces = write_lines(tmp_path / "t.jsonl", [row])
    out = tmp_path / "o.jsonl"
    fails(
        ["label", "--backend", "openai", "--policy", "m", "--input", traces, "--out", str(out)],
        capsys,
        f"{traces}:1",
        where,
        "<prm>",
    )
    assert not out.exists() or not out.read_text()


# ---------------------------------------------------------------- world config


@pytest.mark.parametrize(
    "damage,field",
    [
        ({"op_probs": [0.4, 0.4, 0.2]}, "op_probs"),
        ({"op_probs": {"+": "0.4", "*": "0.4", "?": "0.2"}}, "op_probs"),
        ({"near_miss": "a"}, "near_miss"),
        ({"error_rates": {"easy": [1], "hard": 2}}, "error_rates"),
    ],
)
def test_world_config_bad_values(tmp_path, capsys, damage, field):
    """Fails before this change: traceback TypeError (string probabilities, near_miss "a");
    a list op_probs or bad error_rates gave a message that did not name the file."""
    w = tmp_path / "w.json"
    w.write_text(json.dumps(damage))
    fails(
        ["label", "--backend", "synth", "--world-config", str(w), "--out", str(tmp_path / "o.jsonl")],
        capsys,
        str(w),
        field,
    )


def test_world_config_nan(tmp_path, capsys):
    """Fails before this change: NaN op_probs passed the check (NaN compares false) and
    sampling then failed with a traceback (ValueError: Probabilities contain NaN)."""
    w = tmp_path / "w.json"
    w.write_text('{"op_probs": {"+": NaN, "*": 0.5, "?": 0.5}}')
    fails(
        ["label", "--backend", "synth", "--world-config", str(w), "--out", str(tmp_path / "o.jsonl")],
        capsys,
        str(w),
        "NaN",
    )
    from betaprm.errors import BetaPRMInputError
    from betaprm.synth import WorldConfig

    with pytest.raises(BetaPRMInputError, match="op_probs"):
        WorldConfig.from_dict({"op_probs": {"+": float("nan"), "*": 0.5, "?": 0.5}})


# ---------------------------------------------------------------- missing files


def test_missing_input_files_name_the_flag(tmp_path, capsys, prm_dir):
    """Fails before this change: tracebacks FileNotFoundError (label --input, aca
    --problems, eval-steps --data); train --data did not name the flag."""
    gone = str(tmp_path / "missing.jsonl")
    fails(
        ["convert", "--from", "trl", "--input", gone, "--output", str(tmp_path / "o.jsonl")],
        capsys,
        f"--input {gone}: no such file",
    )
    fails(
        ["label", "--backend", "openai", "--policy", "m", "--input", gone, "--out", str(tmp_path / "o.jsonl")],
        capsys,
        f"--input {gone}: no such file",
    )
    fails(["eval-steps", "--model", str(prm_dir), "--data", gone], capsys, f"--data {gone}: no such file")
    fails(
        [
            "aca",
            "--model",
            str(prm_dir),
            "--out",
            str(tmp_path / "a.jsonl"),
            "--problems",
            gone,
            "--backend",
            "openai",
            "--policy",
            "m",
        ],
        capsys,
        f"--problems {gone}: no such file",
    )
    fails(["eval-bon", "--pools", gone], capsys, gone, "no such file")
    fails(
        ["train", "--model", str(prm_dir), "--data", gone, "--output-dir", str(tmp_path / "run")],
        capsys,
        gone,
        "no such file",
    )


def test_eval_bon_on_an_empty_pool_file(tmp_path, capsys):
    """Fails before this change: traceback ValueError (no test problems left after the
    validation split)."""
    pools = tmp_path / "empty.jsonl"
    pools.write_text("\n")
    fails(["eval-bon", "--pools", str(pools)], capsys, str(pools), "no usable pool records")


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize(
    "file,how",
    [
        ("betaprm_config.json", "truncated"),
        ("kappa_head.safetensors", "missing"),
        ("kappa_head.safetensors", "truncated"),
        ("model.safetensors", "missing"),
        ("model.safetensors", "truncated"),
    ],
)
def test_damaged_checkpoint(tmp_path, capsys, prm_dir, file, how):
    """Fails before this change: traceback JSONDecodeError / FileNotFoundError /
    SafetensorError / OSError from BetaPRM.from_pretrained."""
    ckpt = damaged_copy(prm_dir, tmp_path, file, how)
    data = write_lines(tmp_path / "vpb.jsonl", [VPB])
    msg = fails(["eval-steps", "--model", str(ckpt), "--data", data], capsys, str(ckpt), "damaged")
    assert file.split(".")[0] in msg


def test_train_on_a_nonexistent_model(tmp_path, capsys):
    """Fails before this change: traceback OSError (HFValidationError: '/nonexistent' is
    not a repo id)."""
    data = write_lines(tmp_path / "r.jsonl", [GOOD])
    fails(
        ["train", "--model", "/nonexistent", "--data", data, "--output-dir", str(tmp_path / "run")],
        capsys,
        "--model /nonexistent",
        "no such folder",
    )


# ---------------------------------------------------------------- wrong results with exit 0


def test_counts_above_float32_exact_range(tmp_path, capsys):
    """Fails before this change: "mc_total": 1e40 written as an integer validated (exit 0)
    and training then produced NaN."""
    path = write_lines(
        tmp_path / "r.jsonl",
        [
            GOOD,
            {**GOOD, "id": "big", "mc_total": 10**40, "mc_correct": [1, 2]},
            {**GOOD, "id": "edge", "mc_total": 2**24},
        ],
    )
    msg = fails(["validate", path], capsys, f"{path}:2: field 'mc_total[0]'", "16,777,216")
    assert f"{path}:3" not in msg  # N = 2**24 itself is fine


@pytest.mark.parametrize(
    "cand,field",
    [
        ({"mu": [7.0, 0.5], "kappa": [2.0, 2.0], "sigma": [0.1, 0.1]}, "mu[0]"),
        ({"mu": [0.5], "kappa": [2.0, 2.0], "sigma": [0.1, 0.1]}, "mu"),
        ({"mu": [0.5, 0.5], "kappa": [0.0, 2.0], "sigma": [0.1, 0.1]}, "kappa[0]"),
        ({"mu": [0.5, 0.5], "kappa": [2.0, 2.0], "sigma": [-1, 0.1]}, "sigma[0]"),
        ({"mu": [0.5, 0.5], "sigma": [0.1, 0.1]}, "kappa"),
        ({"mu": "0.5", "kappa": [2.0, 2.0], "sigma": [0.1, 0.1]}, "mu"),
    ],
)
def test_pool_scores_are_validated(tmp_path, capsys, cand, field):
    """Fails before this change: eval-bon trusted mu = 7.0, kappa = 0, sigma < 0 or a
    missing kappa (taken as 1.0) and printed accuracies (exit 0); the wrong number of
    scores or a string gave a traceback ValueError. (sigma alone may be left out: it
    follows from mu and kappa.)"""
    pool = {**POOL, "candidates": [{"steps": ["2+2=4", "answer \\boxed{4}"], **cand}]}
    path = write_lines(tmp_path / "pool.jsonl", [pool])
    fails(["eval-bon", "--pools", path], capsys, f"{path}:1", f"candidates[0].{field}")


def test_convert_output_always_validates(tmp_path, capsys):
    """Fails before this change: convert wrote "images": [1, 2] (exit 0) and `validate`
    rejected its output. Under skip the line is a reject and the rest is written."""
    good = {
        "question": "q",
        "image": "a.png",
        "steps_with_score": [{"step": "a", "num_mc_correct": 1, "num_mc_total": 2}],
    }
    src = write_lines(tmp_path / "v.jsonl", [good, {**good, "image": [1, 2]}])
    out = tmp_path / "out.jsonl"
    assert (
        main(["convert", "--from", "visualprm-raw", "--input", src, "--output", str(out), "--on-error", "skip"]) == 0
    )
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["v-1"]
    assert main(["validate", str(out)]) == 2  # the image file is not there; the types are right
    assert "file not found" in capsys.readouterr().out


def test_skip_is_linear_in_the_file_size(tmp_path):
    """Fails before this change: each bad line re-read the file from the start (16,000 bad
    lines: 12-21 s; the 64,000 here, 16 times that). The bound only catches that: a linear
    read takes about a second, 60 s leaves room for a busy machine."""
    path = write_lines(tmp_path / "r.jsonl", [GOOD] + ["{bad"] * 64000 + [{**GOOD, "id": "ok-2"}])
    t = time.perf_counter()
    res = read_records(path, on_error="skip", rejects=tmp_path / "rej.jsonl")
    assert time.perf_counter() - t < 60
    assert [r.id for r in res.records] == ["ok-1", "ok-2"] and res.n_rejected == 64000
