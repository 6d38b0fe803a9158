"""Randomly damaged copies of valid input files (seeded): every reader either loads the
valid part or stops with exit status 2 / ``BetaPRMInputError`` naming a line; any other
exception, a traceback or a lost line is a failure. The whole run has a time bound."""

import copy
import json
import random
import re
import time
from pathlib import Path

import pytest

from betaprm.cli import main
from betaprm.cli._problems import read_problems
from betaprm.data.records import validate_object
from betaprm.errors import BetaPRMInputError
from betaprm.evaluation.steps import read_visualprocessbench

SEED = 20261126
COPIES = 100  # per kind of file: 600 damaged files in all
TIME_BOUND_S = 60

COUNTS = [
    {"id": "c1", "question": "2+2?", "steps": ["2+2=4", "answer 4"], "mc_correct": [7, 8], "mc_total": 8},
    {
        "id": "c2",
        "question": "3*3?",
        "steps": ["3*3=9", "answer 9"],
        "mc_correct": [1, 0],
        "mc_total": [4, 4],
        "answer": "9",
        "source": "s",
    },
    {
        "id": "c3",
        "question": "soft",
        "steps": ["a", "b", "c"],
        "mc_correct": [2.5, 1.0, 0.5],
        "mc_total": 4,
        "soft": True,
    },
    {"id": "c4", "question": "img", "images": ["img.png"], "steps": ["look"], "mc_correct": [1], "mc_total": 1},
]
POOLS = [
    {
        "id": "p1",
        "question": "2+2?",
        "answer": "4",
        "candidates": [{"steps": ["2+2=4", "answer 4"]}, {"steps": ["answer 5"]}],
    },
    {
        "id": "p2",
        "question": "1+1?",
        "answer": 2,
        "candidates": [{"steps": ["1+1=2", "answer 2"], "mu": [0.9, 0.8], "kappa": [3.0, 4.0], "sigma": [0.1, 0.2]}],
    },
    {"id": "p3", "question": "q", "candidates": [{"steps": ["x"], "mu": [0.5], "kappa": [1.0], "sigma": [0.0]}]},
]
PROBLEMS = [
    {"id": "a", "question": "2+2?", "answer": "4"},
    {"id": 7, "question": "1+1?", "answer": 2},
    {"id": "c", "question": "x?", "answer": "x"},
]
VPB = [
    {
        "id": "v1",
        "question": "2+2?",
        "data_source": "s",
        "image": "a.png",
        "response": {"steps": ["2+2=4", "answer 4"], "process_correctness": [1, -1]},
    },
    {
        "question": "q",
        "response": {"steps": ["x", "y", "z"], "process_correctness": [0, 1, 1]},
        "image": ["a.png", "b.png"],
    },
]
CONVERTER_INPUTS = {
    "visualprm-raw": "visualprm_raw.jsonl",
    "prm800k": "prm800k.jsonl",
    "trl": "trl_stepwise.jsonl",
    "math-shepherd": "math_shepherd.jsonl",
}
DATA = Path(__file__).parent / "data"

# Values that stand in for a field; the "__X__" ones are swapped for text json cannot write.
SPECIAL = {
    '"__HUGE__"': "9" * 4400,
    '"__NAN__"': "NaN",
    '"__INF__"': "-Infinity",
    '"__DEEP__"': "[" * 5000 + "]" * 5000,
    '"__DEEP900__"': "[" * 900 + "]" * 900,
    '"__BIGFLOAT__"': "1e400",
    '"__BIGINT__"': "1" + "0" * 40,
}
BAD_VALUES = [
    "x",
    "",
    "   ",
    [],
    [1, 2],
    [[1]],
    ["a", None],
    {"a": 1},
    {},
    None,
    True,
    False,
    -1,
    0,
    1,
    2**31,
    1.5,
    -0.5,
    "<prm>",
    "a\u2028b",
    "é\x00",
    *[k.strip('"') for k in SPECIAL],
]


def retype(rng, obj):
    """Replace or delete one value somewhere in ``obj`` (or the whole record)."""
    slots = []

    def walk(x):
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for k, v in list(items):
            slots.append((x, k))
            walk(v)

    walk(obj)
    if not slots or rng.random() < 0.05:
        return copy.deepcopy(rng.choice(BAD_VALUES))
    c, k = rng.choice(slots)
    if rng.random() < 0.25:
        del c[k]
    else:
        c[k] = copy.deepcopy(rng.choice(BAD_VALUES))
    return obj


def dump(obj) -> str:
    text = json.dumps(obj, ensure_ascii=False)
    for k, v in SPECIAL.items():
        text = text.replace(k, v)
    return text


def damaged(rng, rows: list) -> bytes:
    """A JSONL file of ``rows`` with one to three kinds of damage."""
    rows = copy.deepcopy(rows)
    for _ in range(rng.randint(0, 2)):
        i = rng.randrange(len(rows))
        rows[i] = retype(rng, rows[i])
    lines = [dump(r).encode() for r in rows]
    for _ in range(rng.randint(0, 2)):
        kind = rng.choice(["cut", "flip", "blank", "garbage", "duplicate"])
        i = rng.randrange(len(lines))
        if kind == "cut":
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        elif kind == "flip":
            b = bytearray(lines[i])
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            lines[i] = bytes(b).replace(b"\n", b" ")
        elif kind == "blank":
            lines.insert(i, b"   ")
        elif kind == "garbage":
            lines.insert(i, rng.choice([b"\xff\xfe", b"{", b"[1, 2]", b'"text"', b"null", b"\xe9t\xe9", b"{}"]))
        else:
            lines.insert(i, lines[i])
    return b"\n".join(lines) + (b"\n" if rng.random() < 0.8 else b"")


def n_lines(data: bytes) -> int:
    return sum(1 for x in data.split(b"\n") if x.strip())


NAMES_A_LINE = re.compile(r":(\d+)\b")


def check_cli(argv, capsys, path) -> str:
    """Exit 0, or 2 with a message that names ``path`` and a line; never an exception."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in (0, 2), (code, out, err)
    if code == 2:
        assert re.search(re.escape(str(path)) + r":\d+", out + err), (out, err)
    return out


def check_reader(fn, path, data):
    """The reader's items (one per line) or a ``BetaPRMInputError`` naming a line."""
    try:
        items = fn(str(path))
    except BetaPRMInputError as e:
        assert re.search(re.escape(str(path)) + r":\d+", str(e)), str(e)
        return
    assert len(items) == n_lines(data)  # nothing dropped


@pytest.fixture(scope="module")
def clock():
    t = time.perf_counter()
    yield
    assert time.perf_counter() - t < TIME_BOUND_S


@pytest.mark.parametrize("kind,rows", [("counts", COUNTS), ("pool", POOLS)])
def test_validate_on_damaged_records(tmp_path, capsys, clock, kind, rows):
    (tmp_path / "img.png").write_bytes(b"\x89PNG")
    rng = random.Random(f"{SEED}/{kind}")
    for i in range(COPIES):
        data = damaged(rng, rows)
        path = tmp_path / f"{kind}{i}.jsonl"
        path.write_bytes(data)
        out = check_cli(["validate", "--kind", kind, str(path)], capsys, path)
        good, bad = map(int, re.search(r"(\d+) good records, (\d+) bad", out).groups())
        assert good + bad == n_lines(data), (i, out)  # every line loaded or reported


def test_read_problems_on_damaged_files(tmp_path, clock):
    rng = random.Random(f"{SEED}/problems")
    for i in range(COPIES):
        data = damaged(rng, PROBLEMS)
        path = tmp_path / f"p{i}.jsonl"
        path.write_bytes(data)
        check_reader(read_problems, path, data)


def test_read_visualprocessbench_on_damaged_files(tmp_path, clock):
    rng = random.Random(f"{SEED}/vpb")
    for i in range(COPIES):
        data = damaged(rng, VPB)
        path = tmp_path / f"v{i}.jsonl"
        path.write_bytes(data)
        check_reader(read_visualprocessbench, path, data)


def test_convert_on_damaged_inputs(tmp_path, capsys, clock):
    rng = random.Random(f"{SEED}/convert")
    sources = {
        fmt: [json.loads(x) for x in (DATA / name).read_text().splitlines() if x.strip()]
        for fmt, name in CONVERTER_INPUTS.items()
    }
    for i in range(COPIES):
        fmt = rng.choice(sorted(sources))
        data = damaged(rng, sources[fmt])
        src, out = tmp_path / f"in{i}.jsonl", tmp_path / f"out{i}.jsonl"
        src.write_bytes(data)
        skip = rng.random() < 0.5
        check_cli(
            ["convert", "--from", fmt, "--input", str(src), "--output", str(out), "--soft-n", "8"]
            + (["--on-error", "skip"] if skip else []),
            capsys,
            src,
        )
        if out.exists():
            written = [json.loads(x) for x in out.read_text().splitlines()]
            rejects = Path(str(out.with_suffix("")) + ".rejects.jsonl")
            n_rej = len(rejects.read_text().splitlines()) if rejects.exists() else 0
            assert len(written) + n_rej == n_lines(data), (i, fmt)  # each line written or rejected
            for j, rec in enumerate(written, 1):  # what convert writes, validate accepts
                assert validate_object(rec, j, check_images=False)[1] == [], (i, fmt, rec)
