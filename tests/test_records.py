"""Validation: one file with every kind of damage, each reported with line, field and fix."""

import json
import subprocess
import sys

import pytest

from betaprm.data.records import read_records, records_from_rows, validate_file
from betaprm.errors import BetaPRMInputError

GOOD = {"id": "ok-1", "question": "2+2?", "steps": ["2+2=4", "answer 4"], "mc_correct": [7, 8], "mc_total": 8}


def damaged_lines(tmp_path):
    (tmp_path / "img.png").write_bytes(b"\x89PNG")
    rows = [
        ("good", GOOD),
        ("K > N", {**GOOD, "id": "a", "mc_correct": [9, 8]}),
        ("K < 0", {**GOOD, "id": "b", "mc_correct": [-1, 8]}),
        ("N < 1", {**GOOD, "id": "c", "mc_total": [8, 0]}),
        ("non-integer", {**GOOD, "id": "d", "mc_correct": [2.5, 8]}),
        ("length", {**GOOD, "id": "e", "mc_correct": [1, 2, 3]}),
        ("empty step", {**GOOD, "id": "f", "steps": ["2+2=4", "   "]}),
        ("marker", {**GOOD, "id": "g", "steps": ["2+2=4<prm>", "answer 4"]}),
        ("image", {**GOOD, "id": "h", "images": ["missing.png"]}),
        ("duplicate", {**GOOD}),
        ("not json", "{this is not json"),
        ("good image", {**GOOD, "id": "i", "images": ["img.png"]}),
        ("soft ok", {**GOOD, "id": "j", "mc_correct": [2.5, 8], "soft": True}),
    ]
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for _, r in rows))
    return path


EXPECTED = {
    2: ("mc_correct[0]", "K = 9 > N = 8"),
    3: ("mc_correct[0]", "K = -1 < 0"),
    4: ("mc_total[1]", "N must be an integer count from 1 to 16,777,216, got 0"),
    5: ("mc_correct[0]", "K must be an integer count, got 2.5"),
    6: ("mc_correct", "has 3 counts for 2 steps"),
    7: ("steps[1]", "is empty"),
    8: ("steps[0]", "contains the marker text '<prm>'"),
    9: ("images[0]", "file not found"),
    10: ("id", "duplicate id 'ok-1'"),
    11: ("(line)", "not valid JSON"),
}


def test_every_kind_of_damage_is_reported(tmp_path):
    path = damaged_lines(tmp_path)
    with pytest.raises(BetaPRMInputError) as e:
        read_records(path)
    msg = str(e.value)
    assert "10 bad records" in msg and "--on-error skip" in msg
    for line, (field, text) in EXPECTED.items():
        assert f"{path}:{line}: field '{field}': {text}" in msg, (line, field, text)
    assert "fix:" in msg


def test_skip_writes_rejects_and_keeps_the_rest(tmp_path):
    path = damaged_lines(tmp_path)
    rejects = tmp_path / "rejects.jsonl"
    res = read_records(path, on_error="skip", rejects=rejects)
    assert [r.id for r in res.records] == ["ok-1", "i", "j"]
    assert res.n_rejected == 10 and "3 records loaded, 10 rejected" in res.summary()
    rej = [json.loads(x) for x in rejects.read_text().splitlines()]
    assert [r["line"] for r in rej] == sorted(EXPECTED)
    assert rej[0]["record"]["id"] == "a" and "K = 9 > N = 8" in rej[0]["reasons"][0]
    assert rej[-1]["record"] == "{this is not json"  # the raw text survives
    good = res.records[1]
    assert good.images == [str(tmp_path / "img.png")] and good.mc_total == [8, 8]
    assert res.records[2].soft and res.records[2].mc_correct == [2.5, 8]


def test_validate_command_exit_status(tmp_path):
    path = damaged_lines(tmp_path)
    bad = subprocess.run([sys.executable, "-m", "betaprm", "validate", str(path)], capture_output=True, text=True)
    assert (
        bad.returncode == 2
        and "3 good records, 10 bad" in bad.stdout
        and f"{path}:2: field 'mc_correct[0]'" in bad.stdout
    )
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(GOOD) + "\n")
    ok = subprocess.run([sys.executable, "-m", "betaprm", "validate", str(clean)], capture_output=True, text=True)
    assert ok.returncode == 0 and "1 good records, 0 bad" in ok.stdout


def test_pool_records_and_tables(tmp_path):
    pool = {"id": "p1", "question": "q", "candidates": [{"steps": ["a", "b"]}, {"steps": []}]}
    path = tmp_path / "pool.jsonl"
    path.write_text(json.dumps(pool) + "\n")
    with pytest.raises(BetaPRMInputError, match=r"field 'candidates\[1\].steps'"):
        read_records(path, kind="pool")
    _, report = validate_file(path, kind="pool")
    assert "candidates[1].steps" in report
    # A datasets-style table: rows are numbered like lines.
    res = records_from_rows([GOOD, {**GOOD, "id": "x", "mc_total": 0}], on_error="skip")
    assert len(res.records) == 1 and res.rejected[0][0] == 2
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_list([GOOD, {**GOOD, "id": "y"}])
    assert [r.id for r in records_from_rows(table).records] == ["ok-1", "y"]
