"""Answer checks run in worker processes with a hard time bound: an adversarial answer
that keeps sympy busy for minutes is a failed check (None) after ``timeout`` seconds,
its worker is killed and replaced, and the process exits at once afterwards, with or
without ``close()``, from the library and from the CLI."""

import json
import subprocess
import sys
import time

from betaprm.answers import AnswerChecker

ADVERSARIAL = r"\sin(10^{10^{6}})"  # math-verify spends minutes in sympy on this


def test_adversarial_check_is_none_and_the_process_exits():
    """Fails before this change: the check returned None after ~2 s, but the thread
    running it could not be stopped and the process hung at exit (for minutes, past the 90 s bound)."""
    code = (
        "import json, time\n"
        "from betaprm.answers import AnswerChecker\n"
        "c = AnswerChecker(timeout=2)\n"
        "t = time.monotonic()\n"
        f"r = c.check_many([('1', {ADVERSARIAL!r})])\n"
        "print(json.dumps({'result': r, 'failed': c.failed, 'seconds': time.monotonic() - t}))\n"
        # no close(): the exit itself must stop the worker
    )
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["result"] == [None] and out["failed"] == 1
    # Wide bounds that catch only the hang (sympy runs for minutes): a busy machine starts
    # workers slowly, and that is not a failure.
    assert 2 <= out["seconds"] < 45  # the time bound plus a worker start, not minutes
    assert time.monotonic() - t0 < 90


def test_a_timed_out_check_fails_alone_and_the_checker_goes_on():
    """Fails before this change: ``with`` and ``close()`` did not exist, and the stuck
    check kept one of the checker's threads computing for minutes after its None."""
    with AnswerChecker(timeout=2, workers=1) as c:
        t0 = time.monotonic()
        pairs = [("1/2", "0.5"), ("1", ADVERSARIAL), ("2", "3"), ("7", "7"), (None, "7"), ("7", None), ("$$", "7")]
        assert c.check_many(pairs) == [True, None, False, True, None, False, None]
        assert c.failed == 3  # the timeout, the missing reference and the unreadable one
        assert time.monotonic() - t0 < 60  # only a hang: the stuck check runs for minutes
        # The killed worker was replaced; the checker still answers.
        assert c.check("3/4", "0.75") is True and c.workers_started == 2
        procs = [w.proc for w in c._pool]
    assert procs and all(p.poll() is not None for p in procs)  # closed: no worker left running


def test_thousands_of_quick_checks_share_a_few_workers():
    """Fails before this change: there were no worker processes (checks ran in threads of
    this process, where a stuck one could not be stopped) and no ``with``. Here 2000
    checks are batched over two processes, not one process per check."""
    pairs = [(str(i), str(i if i % 3 else i + 1)) for i in range(2000)]
    with AnswerChecker(timeout=10, workers=2) as c:
        r = c.check_many(pairs)
        assert r == [bool(i % 3) for i in range(2000)] and c.failed == 0
        assert c.workers_started == 2  # batched over two processes; how fast is not checked
        assert c.check_many([("1", "1")]) == [True] and c.workers_started == 2  # the workers are reused


def test_eval_bon_with_an_adversarial_answer_finishes(tmp_path):
    """Fails before this change: one model output of \\boxed{\\sin(10^{10^{6}})} kept
    eval-bon's process alive after its results, for minutes, until killed by the 120 s bound."""
    recs = []
    for i in range(10):
        bad = ADVERSARIAL if i == 0 else "8"
        cands = [
            {"steps": ["x", f"The answer is \\boxed{{{a}}}"], "mu": [0.5, m], "kappa": [4, 4], "sigma": [0.1, 0.1]}
            for a, m in ((bad, 0.6), ("7", 0.7))
        ]
        recs.append({"id": f"p{i}", "question": f"q{i}", "answer": "7", "candidates": cands})
    pools = tmp_path / "bench.jsonl"
    pools.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "betaprm",
            "eval-bon",
            "--pools",
            str(pools),
            "--out",
            str(out),
            "--check-timeout",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["benchmarks"]["bench"]["answer_checks_failed"] == 1
    assert time.monotonic() - t0 < 120  # only the hang (sympy for minutes); startup on a busy machine is slow
