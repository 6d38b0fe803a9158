"""Converters from public PRM data formats to betaprm records, keeping the counts.

==================  ================================================================
format              what becomes K of N
==================  ================================================================
``visualprm-raw``   VisualPRM400K(-v1.1)-Raw: each of ``steps_with_score`` carries
                    ``num_mc_correct`` and ``num_mc_total``; they are K and N as is.
``math-shepherd``   ``input`` with a ``ки`` tag after each step and ``label`` with
                    ``+``/``-`` in the tags' places: hard labels, K in {0, 1}, N = 1.
``prm800k``         PRM800K phase files: the labeller's path through the steps,
                    ratings 1 / 0 / -1 as hard labels (N = 1). Whether a neutral 0
                    counts as correct is a choice (``neutral_correct``, default True):
                    OpenAI's PRM800K paper treats neutral steps as positive when
                    training the PRM, while strict error-detection setups treat any
                    non-positive step as not correct.
``trl``             TRL stepwise records (``prompt``, ``completions``, ``labels``):
                    booleans -> K in {0, 1}, N = 1; fractional labels p in [0, 1]
                    need ``soft_n`` and become K = p * soft_n of N = soft_n with
                    ``"soft": true`` (never rounded).
==================  ================================================================

A source record that cannot be converted raises ``ConversionError`` naming the field
and the fix; the CLI reports it with the input line, like any other bad record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError
from .records import Problem, validate_object, write_rejects
from .sources import iter_rows

FORMATS = ("visualprm-raw", "math-shepherd", "prm800k", "trl")
SHEPHERD_TAG = "ки"


class ConversionError(Exception):
    def __init__(self, field: str, message: str, fix: str):
        super().__init__(message)
        self.field, self.message, self.fix = field, message, fix


@dataclass
class ConvertOptions:
    source_name: str = "data"
    """Used in generated ids (``{source_name}-{line}``) and as the default ``source``."""
    image_root: str | None = None
    """Prefix for relative image paths (VisualPRM's ``image`` is relative to its image folder)."""
    neutral_correct: bool = True
    """PRM800K: whether a 0 (neutral) rating counts as a correct step."""
    soft_n: int | None = None
    """TRL: N for fractional labels (K = p * N)."""


def _need(obj: dict, key: str, typ, fix: str):
    if not isinstance(obj, dict) or key not in obj:
        raise ConversionError(key, "is missing", fix)
    val = obj[key]
    if not isinstance(val, typ) or isinstance(val, bool) and typ is not bool:
        raise ConversionError(key, f"has the wrong type ({type(val).__name__})", fix)
    return val


def from_visualprm_raw(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    question = _need(obj, "question", str, "each record needs its question")
    sws = _need(obj, "steps_with_score", list, "VisualPRM raw records list their steps in steps_with_score")
    steps, k, n = [], [], []
    for i, s in enumerate(sws):
        where = f"steps_with_score[{i}]"
        if not isinstance(s, dict):
            raise ConversionError(
                where, "is not an object", "each step is {step, score, num_mc_correct, num_mc_total}"
            )
        for key in ("step", "num_mc_correct", "num_mc_total"):
            if key not in s:
                raise ConversionError(
                    f"{where}.{key}",
                    "is missing",
                    "the raw release keeps the counts per step; use visualprm-raw only on the -Raw files",
                )
        steps.append(s["step"])
        k.append(s["num_mc_correct"])
        n.append(s["num_mc_total"])
    rec: dict[str, Any] = {"id": str(obj.get("id", f"{opts.source_name}-{line}")), "question": question}
    image = obj.get("image", obj.get("images"))
    if image not in (None, "", []):
        images = [image] if isinstance(image, str) else image
        if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
            raise ConversionError(
                "image",
                f"must be an image path or a list of paths, got {json.dumps(image, default=str)[:60]}",
                "give the image path(s) relative to --image-root as strings",
            )
        if opts.image_root:
            images = [p if Path(p).is_absolute() else str(Path(opts.image_root) / p) for p in images]
        rec["images"] = images
    rec.update(steps=steps, mc_correct=k, mc_total=n)
    if obj.get("answer") is not None:
        rec["answer"] = str(obj["answer"])
    rec["source"] = str(obj.get("source", opts.source_name))
    return [rec]


def from_math_shepherd(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    text = _need(obj, "input", str, "Math-Shepherd records have the tagged solution in 'input'")
    label = _need(obj, "label", str, "Math-Shepherd records have the +/- labelled solution in 'label'")
    pieces = text.split(SHEPHERD_TAG)
    n_tags = len(pieces) - 1
    if n_tags == 0:
        raise ConversionError("input", f"has no {SHEPHERD_TAG!r} step tag", "each step must end with the tag")
    if len(label) != len(text) - n_tags:
        raise ConversionError(
            "label",
            f"has length {len(label)}, expected {len(text) - n_tags} (input with each 2-character tag as 1 label "
            "character)",
            "label must be input with every tag replaced by + or -",
        )
    labels, pos = [], 0
    for i, piece in enumerate(pieces[:-1]):
        pos += len(piece)
        ch = label[pos]
        if ch not in "+-":
            raise ConversionError(
                "label",
                f"has {ch!r} where tag {i + 1} is, not + or -",
                "label must be input with every tag replaced by + or -",
            )
        labels.append(1 if ch == "+" else 0)
        pos += 1
    if pieces[-1].strip():
        raise ConversionError(
            "input",
            f"has text after the last tag: {pieces[-1].strip()[:40]!r}",
            "every step, the last included, must end with the tag",
        )
    head = pieces[0]
    cut = max(head.find("Step 1:"), head.find("step 1:"))
    if cut < 0:
        # Some Math-Shepherd rows put a tag inside the question; guessing a split would
        # misalign every label after it, so such rows are rejected instead.
        raise ConversionError(
            "input",
            "cannot find where the question ends ('Step 1:' is missing before the first tag)",
            "fix the row or leave it out (--on-error skip)",
        )
    question = head[:cut].strip()
    steps = [head[cut:].strip()] + [p.strip() for p in pieces[1:-1]]
    rec = {
        "id": str(obj.get("id", f"{opts.source_name}-{line}")),
        "question": question,
        "steps": steps,
        "mc_correct": labels,
        "mc_total": 1,
    }
    rec["source"] = str(obj.get("task", opts.source_name))
    return [rec]


def from_prm800k(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    q = _need(obj, "question", dict, "PRM800K lines have a question object")
    lab = _need(obj, "label", dict, "PRM800K lines have a label object")
    problem = _need(q, "problem", str, "question.problem holds the problem text")
    steps_in = _need(lab, "steps", list, "label.steps holds the rated steps")
    good = {1} | ({0} if opts.neutral_correct else set())
    steps, k = [], []
    for i, st in enumerate(steps_in):
        where = f"label.steps[{i}]"
        if not isinstance(st, dict):
            raise ConversionError(where, "is not an object", "see the PRM800K README for the layout")
        comps = st.get("completions")
        comps = [] if comps is None else comps
        if not isinstance(comps, list) or not all(isinstance(c, dict) for c in comps):
            raise ConversionError(
                f"{where}.completions",
                "must be a list of {text, rating} objects",
                "see the PRM800K README for the layout",
            )
        chosen = st.get("chosen_completion")
        human = st.get("human_completion")
        if human is not None and not isinstance(human, dict):
            raise ConversionError(
                f"{where}.human_completion", "must be an object with a text", "see the PRM800K README for the layout"
            )
        if chosen is not None:
            if not (isinstance(chosen, int) and not isinstance(chosen, bool) and 0 <= chosen < len(comps)):
                raise ConversionError(
                    f"{where}.chosen_completion",
                    f"= {chosen} but there are {len(comps)} completions",
                    "the index must point into completions",
                )
            step, rating = comps[chosen].get("text"), comps[chosen].get("rating")
        elif human is not None:
            # A labeller-written replacement step: correct by construction.
            step, rating = human.get("text"), 1
        else:
            # The labeller stopped here: keep the step that ended the path (a rated
            # completion, e.g. the first error), when there is exactly one.
            rated = [c for c in comps if c.get("rating") is not None]
            if len(rated) != 1:
                break
            step, rating = rated[0].get("text"), rated[0].get("rating")
        if (
            not isinstance(step, str)
            or isinstance(rating, bool)
            or not isinstance(rating, int)
            or rating not in (-1, 0, 1)
        ):
            raise ConversionError(
                where, f"has text {step!r:.40} and rating {rating!r}", "ratings must be -1, 0 or 1 with a text"
            )
        steps.append(step)
        k.append(1 if rating in good else 0)
        if rating == -1:
            break  # nothing after a wrong step is on the labelled path
    if not steps:
        raise ConversionError(
            "label.steps", "holds no rated step on the labeller's path", "leave the line out (--on-error skip)"
        )
    rec = {"id": f"{opts.source_name}-{line}", "question": problem, "steps": steps, "mc_correct": k, "mc_total": 1}
    if q.get("ground_truth_answer") is not None:
        rec["answer"] = str(q["ground_truth_answer"])
    rec["source"] = opts.source_name
    return [rec]


def from_trl(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    prompt = _need(obj, "prompt", str, "TRL stepwise records have a string prompt")
    comps = _need(obj, "completions", list, "TRL stepwise records list the steps in completions")
    labels = _need(obj, "labels", list, "TRL stepwise records have one label per completion")
    if len(labels) != len(comps):
        raise ConversionError(
            "labels", f"has {len(labels)} labels for {len(comps)} completions", "give exactly one label per step"
        )
    hard = all(isinstance(x, bool) or x in (0, 1) for x in labels)
    rec: dict[str, Any] = {
        "id": str(obj.get("id", f"{opts.source_name}-{line}")),
        "question": prompt,
        "steps": list(comps),
    }
    if hard:
        rec.update(mc_correct=[int(bool(x)) for x in labels], mc_total=1)
    else:
        for i, x in enumerate(labels):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
                raise ConversionError(
                    f"labels[{i}]",
                    f"= {x!r} is not a boolean or a probability in [0, 1]",
                    "labels must be booleans or floats in [0, 1]",
                )
        if opts.soft_n is None:
            raise ConversionError(
                "labels",
                "holds fractional labels",
                "pass --soft-n N: how many continuations a label stands for (K = p * N); labels are never rounded",
            )
        rec.update(mc_correct=[float(x) * opts.soft_n for x in labels], mc_total=opts.soft_n, soft=True)
    rec["source"] = opts.source_name
    return [rec]


CONVERTERS = {
    "visualprm-raw": from_visualprm_raw,
    "math-shepherd": from_math_shepherd,
    "prm800k": from_prm800k,
    "trl": from_trl,
}


def convert_file(
    fmt: str,
    input_path,
    output_path,
    opts: ConvertOptions | None = None,
    on_error: str = "fail",
    rejects=None,
    marker: str = "<prm>",
) -> dict:
    """Convert a whole file; returns counts. Output records are validated like any input."""
    if fmt not in CONVERTERS:
        raise BetaPRMInputError(f"--from must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if on_error not in ("fail", "skip"):
        raise BetaPRMInputError(f"--on-error must be 'fail' or 'skip', got {on_error!r}")
    src = Path(input_path)
    opts = opts or ConvertOptions(source_name=src.stem)
    convert = CONVERTERS[fmt]
    out, bad, seen = [], [], set()
    n_in = 0
    for line, obj, parse_problem, raw in iter_rows(input_path, "--input"):
        n_in += 1
        problems = [parse_problem] if parse_problem else []
        if not problems and not isinstance(obj, dict):
            problems = [
                Problem(
                    line,
                    "(record)",
                    f"must be a JSON object, got {type(obj).__name__}",
                    "write one JSON object per line",
                )
            ]
        if not problems:
            try:
                recs = convert(obj, line, opts)
            except ConversionError as e:
                problems = [Problem(line, e.field, e.message, e.fix)]
            else:
                for rec in recs:
                    _, ps = validate_object(
                        rec, line, "counts", marker, base_dir=None, seen_ids=seen, check_images=False
                    )
                    problems.extend(ps)
                    if not ps:
                        out.append(rec)
        if problems:
            bad.append((line, problems, obj, raw))
    if bad and on_error == "fail":
        shown = "\n  ".join(p.render(str(src)) for _, ps, _, _ in bad[:30] for p in ps)
        raise BetaPRMInputError(
            f"{src}: {len(bad)} of {n_in} records cannot be converted:\n  {shown}\nFix them, or pass --on-error skip "
            "to leave them out (written to a rejects file)."
        )
    Path(output_path).parent.mkdir(parents=True, exist_ok=True)
    with open(output_path, "w", encoding="utf-8") as f:
        for rec in out:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if rejects and bad:
        write_rejects(rejects, str(src), bad)
    return {"read": n_in, "written": len(out), "rejected": len(bad), "steps": sum(len(r["steps"]) for r in out)}
