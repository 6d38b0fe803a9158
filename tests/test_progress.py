"""Progress bars in logs: ``TQDM_DISABLE=1`` and ``--disable-tqdm`` turn every bar off (the
earlier ``score`` passed ``disable=False`` to tqdm, which overrides the variable), and a bar
written to a log ends with one 100% line (the earlier one printed its final state twice)."""

import io
import json
import os
import re
import subprocess
import sys

import pytest

from betaprm import BetaPRM
from betaprm.cli import main
from betaprm.progress import progress_bar

from .helpers import make_lm_dir
from .test_score import write_pools


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A saved BetaPRM and a pool file of 12 problems."""
    d = tmp_path_factory.mktemp("progress")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return d / "prm", write_pools(d / "pools.jsonl", 12)


def _score(prm, pools, out, *flags, env=None):
    """``betaprm score`` in a fresh process, its stderr a file as a log's is: the lines of
    stderr, each carriage-return redraw of a bar one line."""
    base = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    run = subprocess.run(
        [sys.executable, "-m", "betaprm", "score", "--model", str(prm), "--input", str(pools)]
        + ["--output", str(out), "--device", "cpu", *flags],
        capture_output=True,
        text=True,
        env={**base, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert len(open(out).readlines()) == 12
    return [line for line in re.split(r"[\r\n]", run.stderr) if line.strip()]


def test_score_ends_its_bar_with_one_line(scored, tmp_path):
    prm, pools = scored
    lines = _score(prm, pools, tmp_path / "a.jsonl")
    final = [line for line in lines if line.startswith("scoring: 100%")]
    assert len(final) == 1, lines  # one final line, not two
    assert "12/12" in final[0]


@pytest.mark.parametrize("how", ["TQDM_DISABLE=1", "--disable-tqdm"])
def test_score_without_bars(how, scored, tmp_path):
    prm, pools = scored
    flags, env = ([], {"TQDM_DISABLE": "1"}) if how == "TQDM_DISABLE=1" else (["--disable-tqdm"], None)
    lines = _score(prm, pools, tmp_path / "a.jsonl", *flags, env=env)
    assert not [line for line in lines if "%|" in line], lines  # no bar at all, the weights' loading included


def test_one_final_line_and_the_variable_read_at_each_bar(monkeypatch):
    """The bar maker itself: updates of every size end in one drawing of the final state;
    TQDM_DISABLE set after tqdm was imported (tqdm reads it once, at import) still turns
    it off, and values that mean "no" leave bars on."""
    for steps in ([1] * 5, [2, 3], [5]):
        log = io.StringIO()
        with progress_bar(5, "work", "item", file=log, mininterval=0) as bar:
            for n in steps:
                bar.update(n)
        drawn = [s for s in re.split(r"[\r\n]", log.getvalue()) if s.strip()]
        assert [s for s in drawn if "100%" in s] == [drawn[-1]] and "5/5" in drawn[-1], drawn
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_bar(3, "off", file=io.StringIO()).disable
    for value in ("0", "false", ""):
        monkeypatch.setenv("TQDM_DISABLE", value)
        assert not progress_bar(3, "on", file=io.StringIO()).disable, value


def test_disable_tqdm_lasts_one_command(scored, tmp_path, capsys):
    """In one process (a script or a test calling ``main``), --disable-tqdm turns transformers'
    bars off for its command only; the next command has them again."""
    from transformers.utils import logging as hf_logging

    prm, pools = scored
    assert hf_logging.is_progress_bar_enabled()
    args = ["score", "--model", str(prm), "--input", str(pools), "--device", "cpu"]
    assert main([*args, "--output", str(tmp_path / "a.jsonl"), "--disable-tqdm"]) == 0
    assert hf_logging.is_progress_bar_enabled()
    meta = json.loads((tmp_path / "a.jsonl.meta.json").read_text())
    assert "disable_tqdm" not in meta["settings"]  # how it logs is no setting of the records
    # ... so a rerun with bars resumes the same output
    assert main([*args, "--output", str(tmp_path / "a.jsonl")]) == 0
    assert "12 already in" in capsys.readouterr().out
