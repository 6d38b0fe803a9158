"""The answer-check worker: a plain script (it imports nothing from betaprm, whose import
brings torch) that ``answers.AnswerChecker`` starts in its own process.

After a first line "ready" it reads batches on stdin (one JSON line of [index, gold,
pred] triples each) and writes one JSON line [index, verdict] per check on stdout as soon
as it is done. The verdict is True/False when math-verify compared the two, None when it
could not (it raised, or the reference cannot be read).
"""

import json
import logging
import os
import sys


def verify_pair(gold: str, pred: str) -> bool | None:
    from math_verify import parse, verify  # imported once by main(), which reports it missing

    # It warns on every call that its own timeout is off: the worker's time is bounded
    # from outside (its signals cannot interrupt sympy's long computations anyway).
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    g = parse(gold, parsing_timeout=None)
    if not g:
        g = parse(f"${gold}$", parsing_timeout=None)
    if not g:
        return None  # the reference itself cannot be read: a failed check
    p = parse(pred, parsing_timeout=None) or parse(f"${pred}$", parsing_timeout=None)
    if not p:
        return pred.strip() == gold.strip()
    return bool(verify(g, p, timeout_seconds=None))


def safe_verify(gold: str, pred: str) -> bool | None:
    try:
        return verify_pair(gold, pred)
    except Exception:  # math-verify raising is a failed check, not a wrong answer
        return None


def main() -> None:
    """A check worker: after a first line "ready", reads batches on stdin (one JSON line
    of [index, gold, pred] triples each) and writes one JSON line [index, verdict] per
    check on stdout as soon as it is done."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever sympy prints must not mix with the answers
    sys.stdout = sys.stderr
    try:
        import math_verify  # noqa: F401  (loaded once, before any check's clock starts)
    except Exception as e:
        out.write(
            json.dumps({"error": f"cannot import math_verify ({type(e).__name__}: {e}); pip install math-verify"})
            + "\n"
        )
        out.flush()
        return
    out.write('"ready"\n')
    out.flush()
    for line in sys.stdin:
        for i, gold, pred in json.loads(line):
            out.write(json.dumps([i, safe_verify(gold, pred)]) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
