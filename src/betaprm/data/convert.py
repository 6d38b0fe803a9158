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
``mc-prefix``       one row per solution prefix with its Monte Carlo success rate
                    over ``mc_n`` rollouts (the PRM-calibration data: ``question``,
                    ``reasoning_prefix`` with steps split by blank lines, and
                    ``success_prob``): K = round(mc_n * rate), refused when that is
                    not a whole count. Rows of one solution (same question, and
                    ``response_id`` when present) become one record: the longest
                    prefix's steps, each labelled by the row of that prefix; rows of
                    the same prefix pool their counts; a missing prefix is an error.
``er-prm``          ER-PRM soft labels (``text`` tagged with ``ки`` after each step,
                    ``value`` one label per tag) from ``soft_n`` rollouts: K = p *
                    soft_n (``"soft": true``), p the label itself, or, with ``er_eta``,
                    the success rate recovered from ER-PRM's entropy-regularised value
                    v = log(1 - p + p e^eta) / eta.
``authors-train``   the paper authors' training JSONL (InternVL conversations, read as
                    their loader reads them): K and N from ``prm_counts``; without it
                    their rule, N = 16 and K = round(16 * ratio), said in the record's
                    ``meta`` and counted in the summary.
``authors-pool``    the authors' Best-of-N annotation file -> pool records (not counts):
                    each candidate's ``correct`` from their judged ``labels``.
==================  ================================================================

Hard labels (every N = 1) are said so in the summary: a BetaPRM learns nothing about kappa
from them (``betaprm train`` warns too).

A source record that cannot be converted raises ``ConversionError`` naming the field
and the fix; the CLI reports it with the input line, like any other bad record.

Over 400 lines because it holds eight short converters that share one driver
(``convert_file``) and its error handling; the table above stays next to their code.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError
from ..numeric import NumberRefused, number
from .jsonl import Problem
from .records import MAX_COUNT, validate_object, write_rejects
from .sources import iter_rows

FORMATS = (
    "visualprm-raw",
    "math-shepherd",
    "prm800k",
    "trl",
    "mc-prefix",
    "er-prm",
    "authors-train",
    "authors-pool",
)
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
    """TRL and ER-PRM: N for fractional labels (K = p * N)."""
    mc_n: int | None = None
    """mc-prefix: the rollouts behind each success rate (K = round(mc_n * rate))."""
    er_eta: float | None = None
    """ER-PRM: the entropy coefficient its labels were made with (recovers p from v)."""


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
        rec["images"] = [_under_root(p, opts.image_root) for p in images]
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
    question, steps = _question_and_steps(pieces, "input")
    rec = {
        "id": str(obj.get("id", f"{opts.source_name}-{line}")),
        "question": question,
        "steps": steps,
        "mc_correct": labels,
        "mc_total": 1,
    }
    rec["source"] = str(obj.get("task", opts.source_name))
    return [rec]


def _question_and_steps(pieces: list[str], field: str) -> tuple[str, list[str]]:
    """The question and the steps of a text cut at its step tags (``pieces``: the text
    split by the tag; the last piece must be empty)."""
    head = pieces[0]
    cut = max(head.find("Step 1:"), head.find("step 1:"))
    if cut < 0:
        # Some Math-Shepherd rows put a tag inside the question; guessing a split would
        # misalign every label after it, so such rows are rejected instead.
        raise ConversionError(
            field,
            "cannot find where the question ends ('Step 1:' is missing before the first tag)",
            "fix the row or leave it out (--on-error skip)",
        )
    return head[:cut].strip(), [head[cut:].strip()] + [p.strip() for p in pieces[1:-1]]


def from_er_prm(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    text = _need(obj, "text", str, "ER-PRM records have the tagged solution in 'text'")
    values = _need(obj, "value", list, "ER-PRM records have one soft label per step tag in 'value'")
    pieces = text.split(SHEPHERD_TAG)
    if len(pieces) == 1:
        raise ConversionError("text", f"has no {SHEPHERD_TAG!r} step tag", "each step must end with the tag")
    if pieces[-1].strip():
        raise ConversionError(
            "text", f"has text after the last tag: {pieces[-1].strip()[:40]!r}", "every step must end with the tag"
        )
    if len(values) != len(pieces) - 1:
        raise ConversionError(
            "value", f"has {len(values)} labels for {len(pieces) - 1} step tags", "give one label per tag"
        )
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ConversionError(f"value[{i}]", f"= {v!r} is not in [0, 1]", "labels must be numbers in [0, 1]")
    if opts.soft_n is None:
        raise ConversionError(
            "value",
            "holds soft labels",
            "pass --soft-n N: the rollouts each label was computed from (ER-PRM used 16)",
        )
    question, steps = _question_and_steps(pieces, "text")
    if opts.er_eta:
        eta = opts.er_eta
        # v = log(1 - p + p e^eta) / eta  <=>  p = (e^(eta v) - 1) / (e^eta - 1)
        values = [min(1.0, max(0.0, math.expm1(eta * v) / math.expm1(eta))) for v in values]
    return [
        {
            "id": str(obj.get("id", f"{opts.source_name}-{line}")),
            "question": question,
            "steps": steps,
            "mc_correct": [float(v) * opts.soft_n for v in values],
            "mc_total": opts.soft_n,
            "soft": True,
            "source": opts.source_name,
        }
    ]


PREFIX_FIELDS = {
    "question": ("question", "problem"),
    "prefix": ("reasoning_prefix", "first_pass_prefix", "prefix"),
    "rate": ("success_prob", "accuracy", "mc_value"),
}


def _first_field(obj: dict, names: tuple[str, ...], fix: str):
    for k in names:
        if obj.get(k) is not None:
            return k, obj[k]
    raise ConversionError("/".join(names), "is missing", fix)


def from_mc_prefix(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    """One prefix row, checked; ``assemble_mc_prefix`` makes the records."""
    if opts.mc_n is None:
        raise ConversionError("(file)", "needs the rollout count", "pass --mc-n N: rollouts behind each success rate")
    _, question = _first_field(obj, PREFIX_FIELDS["question"], "each row needs its question")
    pkey, prefix = _first_field(obj, PREFIX_FIELDS["prefix"], "each row needs its solution prefix")
    rkey, rate = _first_field(obj, PREFIX_FIELDS["rate"], "each row needs the prefix's success rate")
    if not isinstance(question, str) or not question.strip():
        raise ConversionError("question", "must be a non-empty string", "write the question as text")
    if isinstance(prefix, str):
        steps = [p.strip() for p in prefix.split("\n\n") if p.strip()]
    elif isinstance(prefix, list) and all(isinstance(p, str) for p in prefix):
        steps = [p.strip() for p in prefix]
    else:
        raise ConversionError(pkey, "must be a string (steps split by blank lines) or a list of steps", "fix the row")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ConversionError(rkey, f"= {rate!r} is not a success rate in [0, 1]", "fix the row")
    k = round(rate * opts.mc_n)
    if abs(rate * opts.mc_n - k) > 0.02:
        raise ConversionError(
            rkey,
            f"= {rate!r} with --mc-n {opts.mc_n} gives {rate * opts.mc_n:.3g} successes, not a whole count",
            "check --mc-n (the rollouts per prefix), or use a converter for soft labels",
        )
    group = (question, str(obj["response_id"]) if obj.get("response_id") is not None else None)
    return [{"group": group, "steps": steps, "k": k, "line": line, "answer": obj.get("answer")}]


def assemble_mc_prefix(rows: list[dict], opts: ConvertOptions) -> list[tuple[int, dict | None, Problem | None]]:
    """Records from prefix rows (``from_mc_prefix``): per solution, the longest prefixes,
    each step labelled by the row of its prefix (rows of one prefix pooled). Returns
    ``(line, record, None)`` or ``(line, None, problem)`` per record, in input order."""
    groups: dict = {}
    for r in rows:
        if r["steps"]:  # the empty prefix (the question alone) labels no step
            groups.setdefault(r["group"], []).append(r)
    out = []
    for (question, _), rs in groups.items():
        counts: dict = {}
        for r in rs:
            k, n = counts.get(tuple(r["steps"]), (0, 0))
            counts[tuple(r["steps"])] = (k + r["k"], n + opts.mc_n)
        prefixes = set(counts)
        leaves = [
            r
            for r in rs
            if not any(len(p) > len(r["steps"]) and p[: len(r["steps"])] == tuple(r["steps"]) for p in prefixes)
        ]
        done = set()
        for r in leaves:
            steps = tuple(r["steps"])
            if steps in done:
                continue
            done.add(steps)
            missing = [j for j in range(1, len(steps) + 1) if steps[:j] not in counts]
            if missing:
                out.append(
                    (
                        r["line"],
                        None,
                        Problem(
                            r["line"],
                            "prefix",
                            f"the prefixes of {', '.join(map(str, missing[:5]))} step(s) of this {len(steps)}-step "
                            "solution have no row, so those steps have no count",
                            "give a row for every prefix of a solution, or leave the solution out (--on-error skip)",
                        ),
                    )
                )
                continue
            rec = {
                "id": f"{opts.source_name}-{r['line']}",
                "question": question,
                "steps": list(steps),
                "mc_correct": [counts[steps[:j]][0] for j in range(1, len(steps) + 1)],
                "mc_total": [counts[steps[:j]][1] for j in range(1, len(steps) + 1)],
                "source": opts.source_name,
            }
            if r["answer"] is not None:
                rec["answer"] = str(r["answer"])
            out.append((r["line"], rec, None))
    return sorted(out, key=lambda x: x[0])


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


# --------------------------------------------------------------------------- the authors' files
# The paper's authors' public code (github.com/JinYuanLi0012/Beta-Binomial-PRM, MIT) reads two
# files: training records (src/internvl/train/internvl_chat_finetune_beta_binom.py,
# LazySupervisedDataset and preprocess_internvl2_5_beta_binom) and Best-of-N pools
# (eval/prm/evaluate_*_prm_beta_binomial.py, written by eval/build_eval_rollouts_annotation*.py).
# What follows reads them as their code does, and refuses what their code would silently
# repair (a clamped ratio, a K above N, a count list shorter than the steps).

AUTHORS_N = 16
"""N where an authors' training record has no ``prm_counts``: their loader then takes
N = 16 and K = round(16 * ratio) (Python's round, half to even)."""
AUTHORS_MARKER = "<prm>"
AUTHORS_IMAGE = "<image>"
AUTHORS_TRAIN_LAYOUT = (
    'their records are {"image": PATH, "conversations": [{"from": "human", "value": "<image>\\nQuestion: Q\\n'
    'Process: s1<prm>s2<prm>"}, {"from": "gpt", "value": [ratio per step]}], "prm_counts": {"k": [...], "n": [...]}}'
)


def _strip_image_tags(text: str) -> str:
    """``text`` without InternVL's image placeholders: ``<image>\\n`` as their loader and
    evaluators prepend it, then any other ``<image>``."""
    return text.replace(AUTHORS_IMAGE + "\n", "").replace(AUTHORS_IMAGE, "")


def _image_paths(value, field: str) -> list[str]:
    """``image``/``image_paths`` as a list of paths: a string, a list of strings, or
    nothing (``""``, ``[]``, null: no image, as their loader reads it)."""
    if value in (None, "", []):
        return []
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise ConversionError(
            field,
            f"must be an image path or a list of paths, got {json.dumps(value, default=str)[:60]}",
            "give the image path(s) as strings",
        )
    for p in paths:
        if "://" in p:
            raise ConversionError(
                field,
                f"is a remote path ({p[:60]!r}), which their loader reads through its petrel client",
                "download the images and give the path relative to --image-root",
            )
    return list(paths)


def _under_root(path: str, root: str | None) -> str:
    """``path`` joined to ``root`` as their loaders join it (``os.path.join``: an absolute
    path stays itself), made absolute so that it names the same file wherever the output
    is read from; as written without a root (then relative to the output file's folder)."""
    return os.path.abspath(os.path.join(root, path)) if root else path


def _number_or_fail(x, field: str, fix: str, low=0.0, high=None, whole: bool = False):
    """``x`` checked by ``numeric.number`` (ints and floats, never a bool or text) in [low,
    high], an int when ``whole`` (a float with a whole value, 16.0, counts as one: their
    loader reads counts with float())."""
    try:
        x = number(x, "", low=low, high=high)
    except NumberRefused as e:
        raise ConversionError(field, e.reason, fix) from None
    if whole:
        if x != int(x):
            raise ConversionError(field, f"must be a whole count, got {x!r}", fix)
        return int(x)
    return x


def _authors_trace(text: str, field: str) -> tuple[str, list[str], int]:
    """``Question: Q\\nProcess: s1<prm>s2<prm>...`` -> (Q, steps, number of ``<image>``
    tags). The steps are the text between markers, stripped; the last must end with one."""
    first = text.find(AUTHORS_MARKER)
    if first < 0:
        raise ConversionError(field, f"has no {AUTHORS_MARKER} step marker", "end every step with <prm>")
    head_end = text.rfind("\nProcess:", 0, first)
    if head_end < 0:
        raise ConversionError(
            field,
            "has no '\\nProcess:' line before the first <prm>",
            "write 'Question: Q\\nProcess: step 1<prm>step 2<prm>', as their data and evaluators do",
        )
    if text.find("\nProcess:", 0, head_end) >= 0:
        # A second 'Process:' line before the first marker: the question's end is a guess.
        raise ConversionError(
            field,
            "has more than one '\\nProcess:' line before the first <prm>, so where the question ends is unclear",
            "fix the row or leave it out (--on-error skip)",
        )
    head, process = text[:head_end], text[head_end + len("\nProcess:") :]
    if AUTHORS_IMAGE in process:
        raise ConversionError(
            field, "has an <image> tag among the steps", "put <image> before 'Question:', where their loader reads it"
        )
    n_tags = head.count(AUTHORS_IMAGE)
    head = _strip_image_tags(head).strip()
    if not head.startswith("Question:"):
        raise ConversionError(
            field,
            f"does not start with 'Question:' (after any <image> tag): {head[:40]!r}",
            "write 'Question: Q\\nProcess: step 1<prm>step 2<prm>'",
        )
    question = head[len("Question:") :].strip()
    pieces = process.split(AUTHORS_MARKER)
    if pieces[-1].strip():
        raise ConversionError(
            field,
            f"has text after the last <prm>: {pieces[-1].strip()[:40]!r}",
            "end every step, the last included, with <prm>: their loader labels marked steps only",
        )
    steps = [p.strip() for p in pieces[:-1]]
    for i, st in enumerate(steps):
        if not st:
            raise ConversionError(field, f"step {i + 1} is empty (nothing before its <prm>)", "remove the empty step")
    return question, steps, n_tags


def _authors_turns(obj: dict) -> tuple[str, int, list, dict]:
    """The human turn's text, the gpt turn's index and ratios, and the gpt turn, as their
    preprocess reads them: a leading system turn skipped, then exactly human and gpt."""
    convs = _need(obj, "conversations", list, AUTHORS_TRAIN_LAYOUT)
    start = 1 if convs and isinstance(convs[0], dict) and convs[0].get("from") == "system" else 0
    turns = convs[start:]
    if len(turns) != 2 or not all(isinstance(t, dict) for t in turns):
        raise ConversionError(
            "conversations",
            f"has {len(turns)} turns after any system turn, not a human turn and a gpt turn",
            AUTHORS_TRAIN_LAYOUT,
        )
    for j, role in ((start, "human"), (start + 1, "gpt")):
        if convs[j].get("from") != role:
            raise ConversionError(
                f"conversations[{j}].from", f"is {convs[j].get('from')!r}, not {role!r}", AUTHORS_TRAIN_LAYOUT
            )
    text = convs[start].get("value")
    if not isinstance(text, str):
        raise ConversionError(f"conversations[{start}].value", "must be the trace as a string", AUTHORS_TRAIN_LAYOUT)
    ratios = convs[start + 1].get("value")
    if not isinstance(ratios, list):
        raise ConversionError(
            f"conversations[{start + 1}].value",
            f"must be a list with one success ratio per step, got {json.dumps(ratios, default=str)[:40]}",
            AUTHORS_TRAIN_LAYOUT,
        )
    return text, start + 1, ratios, convs[start + 1]


def from_authors_train(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    """One training record of the authors' JSONL (see the section's comment)."""
    text, g, ratios, gpt = _authors_turns(obj)
    question, steps, n_tags = _authors_trace(text, f"conversations[{g - 1}].value")
    images = _image_paths(obj.get("image"), "image")
    # Their loader prepends the one tag of a single image when it is missing, and replaces
    # as many tags as there are images; any other tag would stay in the text.
    allowed = (0, 1) if isinstance(obj.get("image"), str) and images else (len(images),)
    if n_tags not in allowed:
        raise ConversionError(
            f"conversations[{g - 1}].value",
            f"has {n_tags} <image> tag(s) for {len(images)} image(s)",
            "write one <image> tag per image, before 'Question:' (none for a record without an image)",
        )
    where_r = f"conversations[{g}].value"
    if len(ratios) != len(steps):
        raise ConversionError(
            where_r,
            f"has {len(ratios)} ratios for {len(steps)} steps (<prm> markers)",
            "give one success ratio per <prm>; their loader stops on this mismatch too",
        )
    ratios = [
        _number_or_fail(r, f"{where_r}[{i}]", "a step's ratio is its success rate in [0, 1]", 0.0, 1.0)
        for i, r in enumerate(ratios)
    ]
    # Their dataset copies a top-level prm_counts into the gpt turn, where preprocess reads it.
    field = "prm_counts" if "prm_counts" in obj else f"conversations[{g}].prm_counts"
    counts = obj["prm_counts"] if "prm_counts" in obj else gpt.get("prm_counts")
    fix_counts = 'give "prm_counts": {"k": [K per step], "n": [N per step]}, or leave it out for their N = 16 rule'
    if counts is not None and not isinstance(counts, dict):
        raise ConversionError(field, f"must be an object, got {json.dumps(counts, default=str)[:40]}", fix_counts)
    k_list, n_list = (counts.get("k"), counts.get("n")) if counts else (None, None)
    meta: dict[str, Any]
    if k_list is None and n_list is None:
        k = [round(r * AUTHORS_N) for r in ratios]
        n: list[int] = [AUTHORS_N] * len(ratios)
        meta = {"counts": "n16-fallback"}
        rounded = [i for i, r in enumerate(ratios) if abs(r * AUTHORS_N - round(r * AUTHORS_N)) > 1e-9]
        if rounded:
            meta["rounded_steps"] = rounded
    else:
        for key, lst in (("k", k_list), ("n", n_list)):
            if lst is None:
                other = "n" if key == "k" else "k"
                raise ConversionError(
                    f"{field}.{key}",
                    f"is missing while {other} is given (their loader would drop both and use N = 16)",
                    fix_counts,
                )
            if not isinstance(lst, list) or len(lst) != len(steps):
                got = f"{len(lst)} values" if isinstance(lst, list) else json.dumps(lst, default=str)[:40]
                raise ConversionError(
                    f"{field}.{key}", f"has {got} for {len(steps)} steps", "give one count per step (<prm> marker)"
                )
        n = [
            _number_or_fail(x, f"{field}.n[{i}]", "N counts rollouts: a whole number >= 1", 1, MAX_COUNT, whole=True)
            for i, x in enumerate(n_list)
        ]
        k = [
            _number_or_fail(x, f"{field}.k[{i}]", "K counts successful rollouts: a whole number >= 0", 0, whole=True)
            for i, x in enumerate(k_list)
        ]
        for i, (kk, nn, r) in enumerate(zip(k, n, ratios)):
            if kk > nn:
                raise ConversionError(
                    f"{field}.k[{i}]", f"K = {kk} > N = {nn}", "K (successes) cannot exceed N; check the two lists"
                )
            if abs(kk / nn - r) > 0.5 / nn + 1e-9:
                raise ConversionError(
                    f"{field}.k[{i}]",
                    f"K/N = {kk}/{nn} but the step's ratio ({where_r}[{i}]) is {r:g}",
                    "the ratio and the counts must describe the same rollouts; fix one of them",
                )
        meta = {"counts": "prm_counts"}
    rec: dict[str, Any] = {"id": str(obj.get("id", f"{opts.source_name}-{line}")), "question": question}
    if images:
        rec["images"] = [_under_root(p, opts.image_root) for p in images]
    rec.update(steps=steps, mc_correct=k, mc_total=n, source=str(obj.get("source", opts.source_name)), meta=meta)
    return [rec]


def _authors_pool_images(obj: dict, root: str | None) -> list[str]:
    """A pool item's images as their evaluators find them: ``image_paths`` (OlympiadBench,
    each as is when absolute, else under the root); else one image, the first existing of
    ``image_path`` as written, the root joined with ``image`` and with its base name, then
    with ``image_path`` and its base name (their MathVerse / MathVision order; relative
    paths from the working directory, as theirs run). When none exists here, the root
    joined with the first of them is written (the path as written without a root), for
    ``betaprm validate`` to report."""
    multi = _image_paths(obj.get("image_paths"), "image_paths")
    if multi:
        return [_under_root(p, root) for p in multi]
    path = _image_paths(obj.get("image_path"), "image_path")
    name = _image_paths(obj.get("image"), "image")
    if len(path) > 1 or len(name) > 1:
        raise ConversionError(
            "image_path" if len(path) > 1 else "image", "holds several paths", "list several images in image_paths"
        )
    if not path and not name:
        return []
    joined = [os.path.join(root or "", q) for p in name + path for q in (p, os.path.basename(p))]
    tried = list(dict.fromkeys(os.path.normpath(p) for p in path + joined))
    # None here: the path under the root the user named, else the path as written.
    found = next((p for p in tried if os.path.isfile(p)), os.path.normpath(joined[0]) if root else tried[0])
    return [os.path.abspath(found) if root or os.path.isfile(found) else found]


def from_authors_pool(obj: dict, line: int, opts: ConvertOptions) -> list[dict]:
    """One item of the authors' Best-of-N annotation file (a JSON list) as a pool record:
    each of ``solutions_splits`` a candidate, its ``labels`` entry its ``correct``, their
    scores (``prm_mu``, ``prm_kappa``, ``prm_sigma``, when the item was scored) kept."""
    # Their evaluators' _pick_question_text: query, then query_cot, then question.
    qkey = next((k for k in ("query", "query_cot", "question") if obj.get(k)), None)
    if qkey is None or not isinstance(obj[qkey], str):
        raise ConversionError(
            qkey or "question", "is missing or not text", "each item needs its question (query, query_cot or question)"
        )
    question = _strip_image_tags(obj[qkey]).strip()
    splits = _need(obj, "solutions_splits", list, "their items list each candidate's steps in solutions_splits")
    labels = _need(obj, "labels", list, "their items hold one judged label (1 or 0) per candidate in labels")
    if len(labels) != len(splits):
        raise ConversionError(
            "labels",
            f"has {len(labels)} labels for {len(splits)} candidates",
            "give one label per solutions_splits entry",
        )
    cands = []
    for j, (sp, lab) in enumerate(zip(splits, labels)):
        if not isinstance(sp, list) or not all(isinstance(x, str) for x in sp):
            raise ConversionError(
                f"solutions_splits[{j}]", "must be a list of step strings", "write each candidate as its list of steps"
            )
        if isinstance(lab, bool) or lab not in (0, 1):
            raise ConversionError(
                f"labels[{j}]", f"= {json.dumps(lab, default=str)[:40]} is not 1 or 0", "labels are 1 (correct) or 0"
            )
        cands.append({"steps": list(sp), "correct": lab == 1})
    if "prm_mu" in obj and "prm_kappa" in obj:
        for key, name in (("prm_mu", "mu"), ("prm_kappa", "kappa"), ("prm_sigma", "sigma")):
            vals = obj.get(key)
            if vals is None:
                continue
            if not isinstance(vals, list) or len(vals) != len(cands):
                raise ConversionError(key, f"must hold one list per candidate ({len(cands)})", "rescore the item")
            for c, v in zip(cands, vals):
                c[name] = v
    rec: dict[str, Any] = {"id": str(obj.get("id", f"{opts.source_name}-{line}")), "question": question}
    images = _authors_pool_images(obj, opts.image_root)
    if images:
        rec["images"] = images
    rec["candidates"] = cands
    ref = obj.get("answer", obj.get("correct_answer"))
    if ref is not None:
        rec["answer"] = str(ref)
    rec["source"] = str(obj.get("source", opts.source_name))
    return [rec]


CONVERTERS = {
    "visualprm-raw": from_visualprm_raw,
    "math-shepherd": from_math_shepherd,
    "prm800k": from_prm800k,
    "trl": from_trl,
    "mc-prefix": from_mc_prefix,
    "er-prm": from_er_prm,
    "authors-train": from_authors_train,
    "authors-pool": from_authors_pool,
}
KINDS = {"authors-pool": "pool"}
"""Formats that become pool records (Best-of-N input); the rest become counts records."""
ASSEMBLERS = {"mc-prefix": assemble_mc_prefix}
"""Formats whose rows are parts of records: converted row by row, then put together."""


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
    kind = KINDS.get(fmt, "counts")
    out, bad, seen = [], [], set()
    parts, rows_by_line = [], {}  # formats whose rows are parts of records (ASSEMBLERS)
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
                if fmt in ASSEMBLERS:
                    parts.extend(recs)
                    rows_by_line[line] = (obj, raw)
                    continue
                for rec in recs:
                    _, ps = validate_object(rec, line, kind, marker, base_dir=None, seen_ids=seen, check_images=False)
                    problems.extend(ps)
                    if not ps:
                        out.append(rec)
        if problems:
            bad.append((line, problems, obj, raw))
    if fmt in ASSEMBLERS:
        for line, rec, problem in ASSEMBLERS[fmt](parts, opts):
            ps = (
                [problem]
                if problem
                else validate_object(rec, line, "counts", marker, base_dir=None, seen_ids=seen, check_images=False)[1]
            )
            if ps:
                bad.append((line, ps, *rows_by_line[line]))
            else:
                out.append(rec)
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
    if kind == "pool":
        return {
            "read": n_in,
            "written": len(out),
            "rejected": len(bad),
            "candidates": sum(len(r["candidates"]) for r in out),
            "steps": sum(len(c["steps"]) for r in out for c in r["candidates"]),
            "images_missing": _images_missing(out, output_path),
        }
    stats = {
        "read": n_in,
        "written": len(out),
        "rejected": len(bad),
        "steps": sum(len(r["steps"]) for r in out),
        # every step N = 1: hard labels, which teach a BetaPRM's kappa nothing
        "hard_labels": bool(out)
        and all((r["mc_total"] == 1 if isinstance(r["mc_total"], int) else set(r["mc_total"]) == {1}) for r in out),
        "soft": any(r.get("soft") for r in out),
        "er_values_as_rates": fmt == "er-prm" and not opts.er_eta,
    }
    if fmt == "authors-train":
        # Their loader's N = 16 rule, used where a record has no prm_counts: said per record
        # (meta.counts) and counted here, with the steps whose ratio was not a whole count.
        fallback = [r for r in out if r["meta"]["counts"] == "n16-fallback"]
        stats["counts_fallback"] = len(fallback)
        stats["ratios_rounded"] = sum(len(r["meta"].get("rounded_steps", ())) for r in fallback)
        stats["images_missing"] = _images_missing(out, output_path)
    return stats


def _images_missing(records: list[dict], output_path) -> int:
    """Image paths of ``records`` with no file behind them, relative ones read from the
    output file's folder as every reader of records reads them."""
    base = Path(output_path).parent
    return sum(
        not (Path(p) if Path(p).is_absolute() else base / p).is_file() for r in records for p in r.get("images", ())
    )
