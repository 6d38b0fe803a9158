"""`betaprm demo --quick` against its reference output: the printed tables and results.json
must stay identical through refactors (timings and paths aside). Exact floats are a property
of one machine and torch build; this is slow-tier (`make test-all`).

The reference was made with `betaprm demo --quick --out DIR > DIR.stdout` on the 2-core CPU
machine (torch 2.13.0 CPU) and written by `python -m tests.test_demo_reference DIR DIR.stdout`.
Regenerate it only for a change that is meant to alter the demo's numbers, and say so.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from .helpers import run_cli

REFERENCE = Path(__file__).parent / "data" / "demo_quick_reference.json"
_TIME = re.compile(r"\(?\b\d+(\.\d+)?s\b[^)\n]*\)?|in \d+s$")


def normalise(results: dict, stdout: str, out_dir: str) -> dict:
    """results.json without its timing and paths; the printed lines without timings or paths."""
    r = json.loads(json.dumps(results).replace(str(out_dir), "OUT"))
    r.pop("seconds", None)
    lines = [_TIME.sub("", line.replace(str(out_dir), "OUT")).rstrip() for line in stdout.splitlines()]
    return {"results": r, "printed": [line for line in lines if not line.lstrip().startswith("pretraining step")]}


@pytest.mark.slow
@pytest.mark.timeout(30 * 60)  # only a hang: a busy machine runs --quick for several minutes
def test_demo_quick_equals_its_reference(tmp_path):
    out = tmp_path / "d"
    res = run_cli("demo", "--quick", "--out", str(out), timeout=25 * 60)
    assert res.returncode == 0, res.stderr[-3000:]
    got = normalise(json.loads((out / "results.json").read_text()), res.stdout, str(out))
    want = json.loads(REFERENCE.read_text())
    assert got["printed"] == want["printed"]
    assert got["results"] == want["results"]


if __name__ == "__main__":
    out_dir, stdout = sys.argv[1], Path(sys.argv[2]).read_text()
    ref = normalise(json.loads((Path(out_dir) / "results.json").read_text()), stdout, out_dir)
    REFERENCE.write_text(json.dumps(ref, indent=1) + "\n")
