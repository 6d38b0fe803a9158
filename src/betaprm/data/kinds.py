"""What kind of file a record looks like, and the command that reads that kind.

A file of the wrong kind (TRL stepwise data given to ``train``, counts given to ``score``,
ProcessBench items given to ``validate``) fails every record's check in the same few ways;
listing four field errors per row for thousands of rows hides the one thing to say. The
readers (``records.read_records``, ``read_objects``' callers) ask ``wrong_kind`` about the
first record they cannot use and answer in one line: what it looks like and the command
that reads it.

The signatures are the fields each format's own readers require (``data.convert``, the
benchmark readers in ``evaluation``); ``identify`` tries the most specific first.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KINDS", "identify", "wrong_kind"]

# kind -> (what it is, the command that reads it: {path} is the file as given).
KINDS = {
    "counts": ("betaprm training records (counts)", "betaprm train --data {path}"),
    "pool": ("betaprm candidate pools", "betaprm score --input {path}"),
    "problems": ("problems (id, question, answer)", "betaprm label / aca / search --problems {path}"),
    "trl": (
        "TRL stepwise data (prompt, completions, labels)",
        "betaprm convert --from trl --input {path} --output counts.jsonl",
    ),
    "math-shepherd": (
        "Math-Shepherd data (input, label)",
        "betaprm convert --from math-shepherd --input {path} --output counts.jsonl",
    ),
    "prm800k": (
        "PRM800K data (question, label objects)",
        "betaprm convert --from prm800k --input {path} --output counts.jsonl",
    ),
    "er-prm": ("ER-PRM data (text, value)", "betaprm convert --from er-prm --input {path} --output counts.jsonl"),
    "mc-prefix": (
        "Monte Carlo prefix rows (question, prefix, success rate)",
        "betaprm convert --from mc-prefix --input {path} --output counts.jsonl",
    ),
    "visualprm-raw": (
        "VisualPRM raw data (steps_with_score)",
        "betaprm convert --from visualprm-raw --input {path} --output counts.jsonl",
    ),
    "authors-train": (
        "the paper authors' training records (InternVL conversations, prm_counts)",
        "betaprm convert --from authors-train --input {path} --output counts.jsonl",
    ),
    "authors-pool": (
        "the paper authors' Best-of-N pools (solutions_splits, labels)",
        "betaprm convert --from authors-pool --input {path} --output pools.jsonl",
    ),
    "processbench": ("ProcessBench items (problem, steps, label)", "betaprm eval-steps --data {path}"),
    "prmbench": ("PRMBench items (modified_process)", "betaprm eval-steps --data {path}"),
    "visualprocessbench": ("VisualProcessBench items (response)", "betaprm eval-steps --data {path}"),
}

_PREFIX_QUESTION, _PREFIX = ("question", "problem"), ("reasoning_prefix", "first_pass_prefix", "prefix")
_PREFIX_RATE = ("success_prob", "accuracy", "mc_value")


def identify(obj: Any) -> str | None:
    """The kind (a key of ``KINDS``) ``obj``'s fields say it is; None when they say none."""
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj[:3]):
        return identify(obj[0])  # a JSON list of items (the authors' pools, benchmark dumps)
    if not isinstance(obj, dict):
        return None
    has = obj.__contains__
    if has("conversations") and (has("prm_counts") or has("image")):
        return "authors-train"
    if has("solutions_splits"):
        return "authors-pool"
    if has("steps_with_score"):
        return "visualprm-raw"
    if has("prompt") and has("completions") and has("labels"):
        return "trl"
    if has("modified_process"):
        return "prmbench"
    if has("response") and has("label"):
        return "visualprocessbench"
    if isinstance(obj.get("question"), dict) and isinstance(obj.get("label"), dict):
        return "prm800k"
    if isinstance(obj.get("input"), str) and isinstance(obj.get("label"), str):
        return "math-shepherd"
    if isinstance(obj.get("text"), str) and isinstance(obj.get("value"), list):
        return "er-prm"
    if any(map(has, _PREFIX_QUESTION)) and any(map(has, _PREFIX)) and any(map(has, _PREFIX_RATE)):
        return "mc-prefix"
    if has("steps") and has("label") and (has("problem") or has("question")) and not has("mc_correct"):
        return "processbench"
    if has("candidates"):
        return "pool"
    if has("steps") and (has("mc_correct") or has("mc_total")):
        return "counts"
    if has("question") and not has("steps"):
        return "problems"
    return None


def wrong_kind(obj: Any, want: str | tuple[str, ...], path) -> str | None:
    """One line for a record of another known kind than ``want`` (what it looks like and the
    command that reads it), or None when it is of ``want``'s kind or of no known kind."""
    wants = (want,) if isinstance(want, str) else want
    kind = identify(obj)
    if kind is None or kind in wants:
        return None
    what, command = KINDS[kind]
    expected = " or ".join(KINDS[w][0] for w in wants)
    return f"{path} looks like {what}, not {expected}: read it with `{command.format(path=path)}`"
