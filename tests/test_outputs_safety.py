"""Outputs never clobber inputs or each other, are checked writable before any work, and
leave no lock or empty sidecar behind a failed run; bad numbers, duplicate benchmark
names, links and overlong lines end with exit status 2 and one message naming them."""

import json
import math
import os
import shutil
import zlib
from pathlib import Path

import pytest

from betaprm.cli import main
from betaprm.data import jsonl
from betaprm.data.records import read_records
from betaprm.errors import BetaPRMInputError
from betaprm.train import TrainConfig


def pool(i):
    return {"id": f"p{i}", "question": f"problem {i}", "answer": "7", "candidates": [{"steps": ["3 + 4 = 7"]}]}


def write_pools(path, n, bad_at=(), newline=True):
    lines = [json.dumps(pool(i)) if i not in bad_at else '{"id": "broken"' for i in range(n)]
    path.write_text("\n".join(lines) + ("\n" if newline else ""))
    return path


def score(model, pools, out, *extra):
    return main(
        ["score", "--model", str(model), "--input", str(pools), "--output", str(out), "--device", "cpu", *extra]
    )


def refused(capsys, *words):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    return err


# ---------------------------------------------------------------- 3, 4: no output is an input or another output


def test_score_rejects_that_is_the_input_or_the_output_is_refused(prms, tmp_path, capsys):
    """Fails before this change: `--rejects in.jsonl` left the 7-line input as the one
    rejected line, and `--rejects` equal to `--output` replaced the scored records."""
    a, _ = prms
    src = write_pools(tmp_path / "in.jsonl", 7, bad_at={3})
    before = src.read_bytes()
    assert score(a, src, tmp_path / "out.jsonl", "--on-error", "skip", "--rejects", str(src)) == 2
    refused(capsys, f"--rejects {src}", "is the input --input", "fix")
    assert src.read_bytes() == before
    out = tmp_path / "out.jsonl"
    assert score(a, src, out, "--on-error", "skip") == 0
    scored = out.read_bytes()
    assert len(scored.splitlines()) == 6
    capsys.readouterr()
    assert score(a, src, out, "--on-error", "skip", "--rejects", str(out)) == 2
    refused(capsys, f"--rejects {out}", "is also --output")
    assert out.read_bytes() == scored


def test_score_refuses_an_output_that_is_its_input(prms, tmp_path, capsys):
    """Fails before this change: with --input equal to --output (no final newline) the
    last record was cut as a "partial line" and the rest counted as already done."""
    a, _ = prms
    x = write_pools(tmp_path / "x.jsonl", 4, newline=False)
    before = x.read_bytes()
    assert score(a, x, x) == 2
    refused(capsys, f"--output {x}: is the input --input")
    assert x.read_bytes() == before
    link = tmp_path / "link.jsonl"
    link.symlink_to(x)  # the same file under another name: os.path.samefile sees it
    assert score(a, x, link) == 2
    refused(capsys, "is the input --input")
    assert x.read_bytes() == before


def test_default_rejects_names_come_from_the_whole_output_name(prms, tmp_path, capsys):
    """Fails before this change: the default rejects file dropped the output's suffix, so
    `--output keep.rejects` overwrote an unrelated keep.rejects.jsonl, and results.seed1
    and results.seed2 shared one rejects file."""
    a, _ = prms
    src = write_pools(tmp_path / "in.jsonl", 4, bad_at={1})
    unrelated = tmp_path / "keep.rejects.jsonl"
    unrelated.write_text("precious\n")
    assert score(a, src, tmp_path / "keep.rejects", "--on-error", "skip") == 0
    assert unrelated.read_text() == "precious\n"
    assert json.loads((tmp_path / "keep.rejects.rejects.jsonl").read_text())["line"] == 2
    for seed in ("seed1", "seed2"):
        assert score(a, src, tmp_path / f"results.{seed}", "--on-error", "skip") == 0
        assert (tmp_path / f"results.{seed}.rejects.jsonl").is_file()


def bon_pool(i, q=None):
    c = [
        {"steps": ["3 + 4 = 8", "The answer is \\boxed{8}"], "mu": [0.5, 0.4], "kappa": [4, 4]},
        {"steps": ["3 + 4 = 7", "The answer is \\boxed{7}"], "mu": [0.9, 0.9], "kappa": [4, 4]},
    ]
    return {"id": f"p{i}", "question": q or f"problem {i}: 3 + 4?", "answer": "7", "candidates": c}


def write_bon(path, n=10, bad_first=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(bon_pool(i)) for i in range(n)]
    if bad_first:
        lines[0] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_eval_bon_rejects_name_keeps_an_unrelated_file(tmp_path, capsys):
    """Fails before this change: bench.jsonl's rejects went to bench.rejects.jsonl,
    overwriting a file of that name; they go to bench.jsonl.rejects.jsonl now."""
    pools = write_bon(tmp_path / "bench.jsonl", bad_first=True)
    unrelated = tmp_path / "bench.rejects.jsonl"
    unrelated.write_text("precious\n")
    assert main(["eval-bon", "--pools", str(pools), "--on-error", "skip"]) == 0
    assert unrelated.read_text() == "precious\n"
    assert json.loads((tmp_path / "bench.jsonl.rejects.jsonl").read_text())["line"] == 1


# ---------------------------------------------------------------- 5: a missing sidecar


def test_records_without_their_sidecar_need_adopt_output(prms, tmp_path, capsys):
    """Fails before this change: with OUT.meta.json moved away, a rerun with another
    --model only warned, appended, and wrote a sidecar naming the new model for every record."""
    a, b = prms
    out = tmp_path / "out.jsonl"
    assert score(a, write_pools(tmp_path / "three.jsonl", 3), out) == 0
    shutil.move(tmp_path / "out.jsonl.meta.json", tmp_path / "elsewhere.json")
    before = out.read_bytes()
    capsys.readouterr()
    six = write_pools(tmp_path / "six.jsonl", 6)
    assert score(b, six, out) == 2
    refused(capsys, f"--output {out}", "out.jsonl.meta.json", "--adopt-output")
    assert out.read_bytes() == before and not (tmp_path / "out.jsonl.meta.json").exists()
    assert score(b, six, out, "--adopt-output") == 0  # the user vouches for the records
    assert len(out.read_text().splitlines()) == 6
    meta = json.loads((tmp_path / "out.jsonl.meta.json").read_text())
    assert "adopt_output" not in meta["settings"]  # how to treat the output is not a setting
    assert score(b, six, out) == 0  # with the sidecar back, a plain rerun resumes


# ---------------------------------------------------------------- 6: outputs checked before any work


def test_eval_outputs_are_checked_before_any_work(tmp_path, capsys):
    """Fails before this change: eval-steps, eval-calibration and eval-bon found a folder
    --out, or a --plots that is a file, only when writing, after the whole evaluation
    (a traceback; the results lost). The model here does not exist: the check comes first."""
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    for cmd in ("eval-steps", "eval-calibration"):
        common = [cmd, "--model", str(tmp_path / "no-model"), "--data", str(data)]
        assert main([*common, "--out", str(folder)]) == 2
        refused(capsys, f"--out {folder}: is a folder")
        assert main([*common, "--out", str(afile / "r.json")]) == 2
        refused(capsys, f"--out {afile / 'r.json'}: cannot be written", "is a file")
        assert main([*common, "--plots", str(afile)]) == 2
        refused(capsys, f"--plots {afile}: is a file")
        assert main([*common, "--out", str(data)]) == 2
        refused(capsys, f"--out {data}: is the input --data")
    pools = write_bon(tmp_path / "bench.jsonl")
    assert main(["eval-bon", "--pools", str(pools), "--out", str(folder)]) == 2
    refused(capsys, f"--out {folder}: is a folder")
    assert main(["eval-bon", "--pools", str(pools), "--plots", str(afile)]) == 2
    refused(capsys, f"--plots {afile}: is a file")
    assert main(["eval-bon", "--pools", str(pools), "--out", str(pools)]) == 2
    refused(capsys, f"--out {pools}: is the input --pools")
    assert not (tmp_path / "afile.txt").is_dir() and afile.read_text() == "x"


def test_an_unwritable_out_is_refused_before_any_work(tmp_path, capsys):
    """Fails before this change: a --out in a read-only folder failed (PermissionError
    traceback) after the evaluation. The check tries to make a file there; permission bits
    alone would pass root (who writes anywhere), so as root the folder is /proc, which
    refuses new files whatever they say."""
    pools = write_bon(tmp_path / "bench.jsonl")
    ro = Path("/proc") if os.geteuid() == 0 else tmp_path / "ro"
    if ro != Path("/proc"):
        ro.mkdir()
        ro.chmod(0o500)
    try:
        assert main(["eval-bon", "--pools", str(pools), "--out", str(ro / "r.json")]) == 2
        refused(capsys, f"--out {ro / 'r.json'}: cannot be written (no file can be made in {ro}")
        # a missing folder under it: the nearest existing folder is tried
        assert main(["eval-bon", "--pools", str(pools), "--out", str(ro / "new" / "r.json")]) == 2
        refused(capsys, f"--out {ro / 'new' / 'r.json'}: cannot be written (no file can be made in {ro}")
        assert main(["eval-bon", "--pools", str(pools), "--plots", str(ro / "plots")]) == 2
        refused(capsys, f"--plots {ro / 'plots'}: cannot be written")
    finally:
        if ro != Path("/proc"):
            ro.chmod(0o700)


def test_the_write_check_leaves_no_file_behind(tmp_path):
    """Trying a folder makes and removes a file: nothing is left, and an existing output
    file keeps its content (it is opened for appending, nothing written)."""
    from betaprm.provenance import check_paths

    out = tmp_path / "out.json"
    out.write_text("keep")
    check_paths([], [("--out", out)], [("--plots", tmp_path / "plots")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"] and out.read_text() == "keep"


# ---------------------------------------------------------------- 7: a failed run cleans up after itself


def test_a_failed_run_leaves_no_lock_nor_empty_sidecar(prms, tmp_path, capsys):
    """Fails before this change: a run stopped by a bad record left out.jsonl.lock and an
    out.jsonl.meta.json of no record (and an empty out.jsonl) behind."""
    a, _ = prms
    out = tmp_path / "out.jsonl"
    assert score(a, write_pools(tmp_path / "bad.jsonl", 3, bad_at={1}), out) == 2
    refused(capsys, "bad.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    good = write_pools(tmp_path / "good.jsonl", 3)
    assert score(a, good, out) == 0
    assert not (tmp_path / "out.jsonl.lock").exists()  # a finished run removes its lock too
    # a failure once records exist keeps the sidecar that describes them
    assert score(a, write_pools(tmp_path / "bad2.jsonl", 3, bad_at={1}), out) == 2
    assert (tmp_path / "out.jsonl.meta.json").is_file() and not (tmp_path / "out.jsonl.lock").exists()


# ---------------------------------------------------------------- 8, 10: eval-bon's benchmarks


def test_eval_bon_with_no_test_problem_is_an_input_error(tmp_path, capsys):
    """Fails before this change: a seed that put every problem in validation ended in a
    ValueError traceback from evaluation/bon.py."""
    q = "the only problem: 3 + 4?"
    seed = next(s for s in range(10_000) if zlib.crc32(f"{s}/{q}".encode()) / 0xFFFFFFFF < 0.2)
    pools = tmp_path / "one.jsonl"
    pools.write_text(json.dumps(bon_pool(0, q)) + "\n")
    assert main(["eval-bon", "--pools", str(pools), "--seed", str(seed)]) == 2
    refused(capsys, f"--pools {pools}: all 1 problems fall in the validation split", f"--seed {seed}", "fix")


def test_eval_bon_refuses_two_pools_of_one_name(tmp_path, capsys):
    """Fails before this change: `--pools bon.jsonl,x/bon.jsonl` kept one of the two
    benchmarks (results are keyed by the file's stem)."""
    a, b = write_bon(tmp_path / "bon.jsonl"), write_bon(tmp_path / "x" / "bon.jsonl")
    assert main(["eval-bon", "--pools", f"{a},{b}"]) == 2
    refused(capsys, str(a), str(b), "'bon'", "rename")


# ---------------------------------------------------------------- 9: the learning rate


@pytest.mark.parametrize("lr", [float("nan"), -1.0, float("inf"), 1e30, 0.0])
def test_a_learning_rate_that_is_not_a_sane_number_is_refused(lr, tmp_path, capsys):
    """Fails before this change: nan and -1 ended in torch's ValueError traceback once the
    optimiser was built; inf and 1e30 were accepted."""
    with pytest.raises(BetaPRMInputError, match="--learning-rate must be a finite number"):
        TrainConfig(model="m", data="d.jsonl", learning_rate=lr)
    if math.isnan(lr):
        assert main(["train", "--model", "m", "--data", "d.jsonl", "--learning-rate", "nan"]) == 2
        refused(capsys, "--learning-rate must be a finite number in (0, 1], got nan")


# ---------------------------------------------------------------- 11: links and mistyped paths


def test_a_link_loop_or_a_mistyped_path_is_no_such_file(tmp_path, monkeypatch):
    """Fails before this change: a relative symlink loop, a broken link, or a mistyped path
    without a suffix went to datasets as a hub name ("not a file, and datasets could not
    load it as a hub name", after retries when online), never saying the file is missing."""
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", "loop")
    os.symlink("gone.jsonl", "dangling")
    (tmp_path / "data").mkdir()
    for spec in ("loop", "dangling", "cnts", "data/cnts"):
        with pytest.raises(BetaPRMInputError, match="no such file") as e:
            read_records(spec, flag="--data")
        assert f"--data {spec}" in str(e.value) and "datasets could not load" not in str(e.value)
    with pytest.raises(BetaPRMInputError, match="link loop"):
        read_records("loop", flag="--data")


# ---------------------------------------------------------------- 12: overlong lines


def test_a_line_over_the_cap_is_a_problem_of_its_line(tmp_path, monkeypatch):
    """Fails before this change: a line of any length was read whole (a 200 MB line took
    about 1 GB); one over MAX_LINE_BYTES is now reported with its file and line, and
    --on-error skip leaves it out."""
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 2000)
    f = tmp_path / "pools.jsonl"
    big = dict(pool(1), question="x" * 5000)
    f.write_text("\n".join(json.dumps(p) for p in (pool(0), big, pool(2))) + "\n")
    msg = r"pools.jsonl:2: field '\(line\)': is 5,\d{3} bytes long, over the 2,000"
    with pytest.raises(BetaPRMInputError, match=msg):
        read_records(f, kind="pool", flag="--input")
    got = read_records(f, kind="pool", on_error="skip", rejects=tmp_path / "rej.jsonl")
    assert [r["id"] for r in got.records] == ["p0", "p2"] and got.n_rejected == 1
