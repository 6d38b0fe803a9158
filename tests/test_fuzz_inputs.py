"""Randomly damaged copies of valid input files (seeded): every reader either loads the
valid part or stops with exit status 2 / ``BetaPRMInputError`` naming a line; any other
exception, a traceback or a lost line is a failure. The reward server gets damaged request
bodies, headers and images: a 4xx with a message or a 200 with the offline scores, never a
500 or a hang. The whole run has a time bound."""

import copy
import json
import random
import re
import time
from pathlib import Path

import pytest

from betaprm.cli import main
from betaprm.cli.problems import read_problems
from betaprm.data.records import validate_object
from betaprm.errors import BetaPRMInputError
from betaprm.evaluation.steps import read_visualprocessbench

SEED = 20261126
COPIES = 100  # per kind of file: 600 damaged files in all
TIME_BOUND_S = 300  # only a hang (a quadratic or stuck read): reading the files takes seconds

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


# ---------------------------------------------------------------- the reward server

SERVER_COPIES = 240  # damaged JSON bodies; with the header and image cases about 400 in all
SCORE_BODIES = [
    {"question": "2+2?", "steps": ["2+2=4", "answer 4"]},
    {"items": [{"question": "1+1?", "steps": ["1+1=2"]}, {"question": "q", "steps": ["a", "b", "c"]}], "lam": 1.0},
    {"question": "x", "steps": ["y"], "tau": 0.2, "lam": -0.5},
]
REWARD_BODIES = [
    {"query": ["2+2? 2+2=4\n\nanswer 4", "q a\n\nb"], "prompts": ["2+2?", "q"], "labels": ["", ""]},
]
HEADER_CASES = [
    ({"Content-Type": "text/plain"}, 415),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "application/jsonx"}, 415),
    ({"Content-Type": ""}, 415),
    ({"Content-Type": "APPLICATION/JSON; charset=utf-8"}, 200),
    ({"Host": "evil.example"}, 400),
    ({"Host": "127.0.0.1:1"}, 400),
    ({"Host": ""}, 400),
    ({"Host": "localhost"}, 400),
    ({"Host": "[::1]:{port}"}, 200),
    ({"Host": "localhost:{port}"}, 200),
    ({"Authorization": "Bearer \x7f\u00e9"}, 200),  # no key set: ignored
    ({"Transfer-Encoding": "chunked"}, 200),
]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    from betaprm import BetaPRM

    from .helpers import make_lm_dir
    from .test_serve import Server

    d = tmp_path_factory.mktemp("fuzz_serve")
    prm = BetaPRM.from_backbone(str(make_lm_dir(d / "lm")))
    prm.save_pretrained(d / "prm")
    s = Server(d / "prm", "--max-items", "8", "--max-request-bytes", "200000")
    s.prm = BetaPRM.from_pretrained(d / "prm")
    yield s
    s.stop()


def _post(port: int, path: str, data: bytes, headers: dict) -> tuple[int, bytes]:
    """One request as it is (a hang fails the test through the timeout)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", **headers}
    if headers.get("Transfer-Encoding") == "chunked":
        conn.putrequest("POST", path, skip_host="Host" in headers)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders()
        for i in range(0, len(data), 7):
            conn.send(f"{len(data[i : i + 7]):x}\r\n".encode() + data[i : i + 7] + b"\r\n")
        conn.send(b"0\r\n\r\n")
    else:
        conn.request("POST", path, body=data, headers=headers)
    resp = conn.getresponse()
    out = resp.status, resp.read()
    conn.close()
    return out


def _damaged_body(rng, body) -> bytes:
    body = retype(rng, copy.deepcopy(body)) if rng.random() < 0.8 else copy.deepcopy(body)
    data = dump(body).encode()
    kind = rng.choice(["none", "cut", "flip", "surrogate", "garbage", "wrap"])
    if kind == "cut":
        data = data[: rng.randrange(len(data) + 1)]
    elif kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        data = bytes(b)
    elif kind == "surrogate" and b'"' in data:
        i = rng.choice([m.start() + 1 for m in re.finditer(rb'"', data)])
        data = data[:i] + rng.choice([b"\\ud800", b"\\udfff", b"\\ud83d\\ude00", b"\\u0000"]) + data[i:]
    elif kind == "garbage":
        data += rng.choice([b"\xff", b"}", b" [", b"\x00", b" 1"])
    elif kind == "wrap":
        data = rng.choice([b"[", b'{"items": ', b'{"query": ']) + data + rng.choice([b"]", b"}", b""])
    return data


def _check_answer(server, path: str, data: bytes, status: int, raw: bytes, expected: list):
    """A 4xx with a message, or a 200 whose scores are kept for checking."""
    assert status == 200 or 400 <= status < 500, (status, data[:300], raw[:300])
    if status != 200:
        if raw.startswith(b"Invalid HTTP request"):  # uvicorn's own answer to a header h11 refuses
            return
        answer = json.loads(raw)
        assert isinstance(answer.get("error"), str) and answer["error"], (status, data[:300], answer)
        return
    answer = json.loads(raw)
    body = json.loads(data)
    if path == "/get_reward":
        assert len(answer["rewards"]) == len(body["query"]) and all(
            isinstance(r, float) and 0 <= r <= 1 for r in answer["rewards"]
        )
        return
    items = [body] if "items" not in body else body["items"]
    results = [answer] if "items" not in body else answer["results"]
    for it, res in zip(items, results, strict=True):
        expected.append(((it["question"], it["steps"]), res["mu"]))


def test_server_on_damaged_requests(fuzz_server, clock):
    """A few hundred damaged request bodies, header variants and images: every answer is a
    4xx with a message or a 200 whose mu equal the offline scorer's; never a 500, a hang or
    a dead server. Fails on the code before this change: a text/plain body was scored (200
    where 415 is due) and the Host header was not checked."""
    from betaprm.scoring import score_traces

    rng = random.Random(f"{SEED}/serve")
    port = fuzz_server.port
    expected: list = []
    statuses: list[int] = []
    for i in range(SERVER_COPIES):
        path, base = ("/get_reward", rng.choice(REWARD_BODIES)) if rng.random() < 0.2 else ("/v1/score", None)
        data = _damaged_body(rng, base or rng.choice(SCORE_BODIES))
        status, raw = _post(port, path, data, {})
        _check_answer(fuzz_server, path, data, status, raw, expected)
        statuses.append(status)
    for headers, want in HEADER_CASES * 4:
        headers = {k: v.replace("{port}", str(port)) for k, v in headers.items()}
        data = _damaged_body(rng, rng.choice(SCORE_BODIES)) if rng.random() < 0.5 else dump(SCORE_BODIES[0]).encode()
        status, raw = _post(port, "/v1/score", data, headers)
        _check_answer(fuzz_server, "/v1/score", data, status, raw, expected)
        if want != 200:
            assert status == want, (headers, status, raw[:200])
        statuses.append(status)
    assert 200 in statuses and 400 in statuses and 415 in statuses  # the damage was varied
    got = score_traces(fuzz_server.prm, [t for t, _ in expected])
    for (trace, mu), want in zip(expected, got):
        assert mu == pytest.approx(want.mu.tolist(), abs=1e-5), trace
    status, raw = _post(port, "/v1/score", dump(SCORE_BODIES[0]).encode(), {})
    assert status == 200  # still serving


def _png(rng) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (rng.randint(1, 40), rng.randint(1, 40)), (rng.randrange(256), 0, 0)).save(buf, "PNG")
    return buf.getvalue()


def test_server_image_decoding_on_damaged_images(clock):
    """Damaged PNGs (bytes flipped, cut, header sizes made huge): each is an image within
    the pixel cap or a 400 with a message that holds no memory address; never another
    exception. Fails on the code before this change: a PNG whose header claimed 90 M pixels
    was decoded, and messages held "<_io.BytesIO object at 0x...>"."""
    import base64
    import struct
    import zlib

    from betaprm.serve_requests import RequestError
    from betaprm.serve_requests import image_from_url as _image

    rng = random.Random(f"{SEED}/images")
    cap = 4096 * 4096
    for i in range(120):
        data = bytearray(_png(rng))
        kind = rng.choice(["flip", "cut", "huge", "huge", "prefix"])
        if kind == "flip":
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == "cut":
            data = data[: rng.randrange(len(data))]
        elif kind == "huge":  # IHDR width and height at offsets 16 and 20, its CRC made valid again
            w, h = rng.choice([(9500, 9500), (100000, 100000), (4097, 4096), (2**31 - 1, 1)])
            data[16:24] = struct.pack(">II", w, h)
            data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
        else:
            data = bytearray(rng.choice([b"GIF89a", b"\xff\xd8\xff", b"BM", b""])) + data[8:]
        url = "data:image/png;base64," + base64.b64encode(bytes(data)).decode()
        try:
            im = _image(url, f"images[{i}]")
        except RequestError as e:
            assert e.status == 400 and str(e).startswith(f"images[{i}]: "), str(e)
            assert not re.search(r"0x[0-9a-f]{6,}|object at", str(e)), str(e)
            continue
        assert im.width * im.height <= cap
