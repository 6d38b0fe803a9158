"""`betaprm convert --from authors-train / authors-pool`: the two data files of the paper
authors' public code (github.com/JinYuanLi0012/Beta-Binomial-PRM, MIT) read as their code
reads them, the bare final step read as the answer, and the judge shown the question.

The fixtures (tests/data/authors_train.jsonl, tests/data/authors_pool.json) are
hand-written lines in their formats. `their_train_item` and `their_pool_item` re-implement,
independently, from reading their source, how their code reads each file:
src/internvl/train/internvl_chat_finetune_beta_binom.py (LazySupervisedDataset.__getitem__,
get_image_path, _pack_conversations_with_prm_counts, preprocess_internvl2_5_beta_binom) and
eval/prm/evaluate_mathverse_prm_beta_binomial.py / evaluate_olympiadbench_prm_beta_binomial.py
(_pick_question_text, _pick_image_path, the dataset's __getitem__). No code of theirs is in
the package."""

import json
import os
from copy import deepcopy
from pathlib import Path

import pytest
from PIL import Image

from betaprm.answers import LLMJudge, bare_answer, final_answer
from betaprm.cli import main
from tests.test_eval_bon import _Judge

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "authors_train.jsonl"
POOL = DATA / "authors_pool.json"


# --------------------------------------------------------------------------- their readers, re-implemented
def _safe_float(v):
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def their_train_item(item: dict, root: str) -> dict:
    """What their training loader makes of one JSONL line: the assistant text (with the
    `<image>\\n` it prepends for a single image), the image files (os.path.join(root, .)),
    and the ratio, K and N at each <prm> (their N = 16 fallback, Python's round)."""
    item = deepcopy(item)
    image = item.get("image")
    images = []
    if image is not None and len(image) != 0:
        if isinstance(image, list):
            images = [os.path.join(root, p) for p in image]
        else:
            if "<image>" not in item["conversations"][0]["value"]:
                item["conversations"][0]["value"] = "<image>\n" + item["conversations"][0]["value"]
            images = [os.path.join(root, image)]
    convs = deepcopy(item["conversations"])
    if "prm_counts" in item:
        gpt = None
        for i, m in enumerate(convs):
            if isinstance(m, dict) and m.get("from") == "gpt":
                gpt = i
        convs[gpt if gpt is not None else (1 if len(convs) > 1 else 0)]["prm_counts"] = item["prm_counts"]
    if convs[0]["from"] == "system":
        convs = convs[1:]
    ratios = convs[1]["value"]
    pc = convs[1].get("prm_counts")
    k_list = n_list = None
    if isinstance(pc, dict):
        k_list, n_list = pc.get("k"), pc.get("n")
    if k_list is None or n_list is None:
        n_list = [16.0] * len(ratios)
        k_list = [round(min(max(_safe_float(r) or 0.0, 0.0), 1.0) * 16.0) for r in ratios]
    rs, ks, ns = [], [], []
    for i in range(len(ratios)):
        r = min(max(_safe_float(ratios[i]) or 0.0, 0.0), 1.0)
        k = _safe_float(k_list[i]) if i < len(k_list) else None
        n = _safe_float(n_list[i]) if i < len(n_list) else None
        if n is None or n <= 0:
            n = 16.0
        if k is None:
            k = round(r * n)
        rs.append(r)
        ks.append(min(max(k, 0.0), n))
        ns.append(n)
    text = convs[0]["value"]
    assert text.count("<prm>") == len(rs)  # their preprocess raises otherwise
    return {"text": text, "images": images, "ratio": rs, "k": ks, "n": ns}


def their_pool_item(item: dict, root: str) -> dict:
    """What their Best-of-N evaluators read of one annotation item: the question, the
    image files, one prompt per candidate and the judged labels. Items with image_paths
    are OlympiadBench's (its own evaluator: data_item['question'], images under root, an
    <image> tag prepended per missing one); the others MathVerse/MathVision's resolver."""
    if item.get("image_paths"):
        images = [p if os.path.isabs(p) else os.path.join(root, p) for p in item["image_paths"]]
        question = item["question"]
        need = max(0, len(images) - question.count("<image>"))
        question = "<image>\n" * need + question
    else:
        question = str(item.get("query") or item.get("query_cot") or item.get("question") or "")
        cands = []
        raw_abs, raw_rel = item.get("image_path"), item.get("image")
        if raw_abs is not None:
            cands.append(str(raw_abs))
        if raw_rel is not None:
            cands += [os.path.join(root, str(raw_rel)), os.path.join(root, os.path.basename(str(raw_rel)))]
        if raw_abs is not None:
            cands += [os.path.join(root, str(raw_abs)), os.path.join(root, os.path.basename(str(raw_abs)))]
        seen, ordered = set(), []
        for p in cands:
            if p and os.path.normpath(p) not in seen:
                seen.add(os.path.normpath(p))
                ordered.append(os.path.normpath(p))
        images = [next(p for p in ordered if os.path.exists(p))]
    prompts = [f"Question: {question}\nProcess: " + "<prm>".join(s) + "<prm>" for s in item["solutions_splits"]]
    return {"question": question, "images": images, "prompts": prompts, "labels": item["labels"]}


def _strip_tags(text: str) -> str:
    return text.replace("<image>\n", "").replace("<image>", "")


def _png(path: Path, shade: int = 0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (shade, shade, shade)).save(path)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# --------------------------------------------------------------------------- training records
def _train_root(tmp_path: Path) -> Path:
    root = tmp_path / "datasets"
    for i, item in enumerate(_lines(TRAIN)):
        image = item.get("image")
        for p in [image] if isinstance(image, str) else image or []:
            _png(root / p, i)
    return root


def test_training_records_hold_what_their_loader_reads(tmp_path, capsys):
    root = _train_root(tmp_path)
    out = tmp_path / "out" / "train.jsonl"
    cmd = [
        "convert",
        "--from",
        "authors-train",
        "--input",
        str(TRAIN),
        "--output",
        str(out),
        "--image-root",
        str(root),
    ]
    assert main(cmd) == 0
    said = capsys.readouterr().out
    assert "4 read, 4 records with 10 steps" in said
    assert "3 records from prm_counts, 1 from the N = 16 fallback" in said
    assert "2 of their ratios were not whole sixteenths" in said and "name no file" not in said
    assert main(["validate", str(out)]) == 0
    assert "4 good records, 0 bad" in capsys.readouterr().out

    ours = _lines(out)
    for rec, item in zip(ours, _lines(TRAIN)):
        theirs = their_train_item(item, str(root))
        assert rec["mc_correct"] == theirs["k"] and rec["mc_total"] == theirs["n"]
        assert all(isinstance(x, int) for x in rec["mc_correct"] + rec["mc_total"])
        assert rec.get("images", []) == theirs["images"] and all(Path(p).is_file() for p in rec.get("images", []))
        # The trace their loader tokenises, image tags aside, is ours written back in their layout.
        assert _strip_tags(theirs["text"]) == f"Question: {rec['question']}\nProcess: " + "".join(
            s + "<prm>" for s in rec["steps"]
        )
        assert [k / n for k, n in zip(rec["mc_correct"], rec["mc_total"])] == pytest.approx(
            theirs["ratio"], abs=1 / 32
        )
    # Line 2 has no prm_counts: N = 16, K = round(16 * ratio), half to even (0.5 -> 0), said in meta.
    assert ours[1]["mc_correct"] == [8, 5, 0] and ours[1]["mc_total"] == [16, 16, 16]
    assert ours[1]["meta"] == {"counts": "n16-fallback", "rounded_steps": [1, 2]}
    assert [r["meta"]["counts"] for r in ours] == ["prm_counts", "n16-fallback", "prm_counts", "prm_counts"]
    # A system turn skipped, counts given in the gpt turn, and no image: a text record.
    assert ours[2]["question"] == "What is 6 * 7?" and "images" not in ours[2] and ours[2]["mc_total"] == [8, 16]
    assert ours[0]["question"] == "Which label marks the leaf?\nA. P\nB. Q" and ours[0]["steps"][-1] == "B"
    assert len(ours[3]["images"]) == 2 and ours[3]["id"] == "multi-4" and ours[1]["id"] == "authors_train-2"


def test_images_without_a_root_stay_relative_and_are_reported(tmp_path, capsys):
    out = tmp_path / "train.jsonl"
    assert main(["convert", "--from", "authors-train", "--input", str(TRAIN), "--output", str(out)]) == 0
    assert "4 image paths name no file on this machine" in capsys.readouterr().out
    assert _lines(out)[0]["images"] == ["VisualPRM400K-v1.1-Raw/ai2d/images/17.png"]
    # Placed beside the output, as their meta json's root, they are found: relative to its folder.
    _train_root(tmp_path)
    for p in (tmp_path / "datasets").iterdir():
        p.rename(tmp_path / p.name)
    assert main(["validate", str(out)]) == 0


GOOD = {
    "image": "a.png",
    "conversations": [
        {"from": "human", "value": "<image>\nQuestion: What is 2 + 2?\nProcess: 2 + 2 = 4<prm>4<prm>"},
        {"from": "gpt", "value": [0.5, 0.5]},
    ],
    "prm_counts": {"k": [8, 8], "n": [16, 16]},
}


def _bad(change):
    item = deepcopy(GOOD)
    change(item)
    return item


BAD_TRAIN = [
    # (change, field named, words of the message)
    (lambda d: d["conversations"][1].update(value=[0.5]), "conversations[1].value", "1 ratios for 2 steps"),
    (lambda d: d["prm_counts"].update(k=[8, 17], n=[16, 16]), "prm_counts.k[1]", "K = 17 > N = 16"),
    (lambda d: d["prm_counts"].pop("n"), "prm_counts.n", "is missing while k is given"),
    (lambda d: d["prm_counts"].update(n=[16]), "prm_counts.n", "has 1 values for 2 steps"),
    (lambda d: d["prm_counts"].update(k=[8, 2]), "prm_counts.k[1]", "K/N = 2/16 but the step's ratio"),
    (
        lambda d: d["prm_counts"].update(n=[16, 0]),
        "prm_counts.n[1]",
        "must be a finite number in [1, 16777216], got 0",
    ),
    (
        lambda d: d["conversations"][1].update(value=[0.5, 1.5]),
        "conversations[1].value[1]",
        "must be a finite number in [0, 1], got 1.5",
    ),
    (
        lambda d: d["conversations"][0].update(value="Question: q\nProcess: a<prm>b<prm>c"),
        "conversations[0].value",
        "text after the last <prm>",
    ),
    (
        lambda d: d["conversations"][0].update(value="Q: q\nProcess: a<prm>b<prm>"),
        "conversations[0].value",
        "'Question:'",
    ),
    (lambda d: d["conversations"][0].update({"from": "user"}), "conversations[0].from", "not 'human'"),
    (lambda d: d.update(image=["a.png", "b.png"]), "conversations[0].value", "1 <image> tag(s) for 2 image(s)"),
    (lambda d: d.update(image="s3://bucket/a.png"), "image", "remote path"),
    (lambda d: d["prm_counts"].update(k=[8, 8.5]), "prm_counts.k[1]", "must be a whole count, got 8.5"),
    (lambda d: d["prm_counts"].update(k=[8, 10**400]), "prm_counts.k[1]", "got an integer of 401 digits"),
]


def test_bad_training_lines_name_file_line_field_and_fix(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    lines = [GOOD] + [_bad(change) for change, _, _ in BAD_TRAIN]
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "o.jsonl"
    assert main(["convert", "--from", "authors-train", "--input", str(src), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{len(BAD_TRAIN)} of {len(lines)} records cannot be converted" in err and "Traceback" not in err
    shown = err.splitlines()
    for i, (_, field, words) in enumerate(BAD_TRAIN, start=2):
        line = next(x for x in shown if f"{src}:{i}: field " in x)
        assert f"field '{field}'" in line and words in line and "; fix: " in line, line
    # --on-error skip: the good line is written, the rest go to the rejects file with reasons.
    assert (
        main(["convert", "--from", "authors-train", "--input", str(src), "--output", str(out), "--on-error", "skip"])
        == 0
    )
    assert len(_lines(out)) == 1 and len(_lines(tmp_path / "o.rejects.jsonl")) == len(BAD_TRAIN)


# --------------------------------------------------------------------------- Best-of-N pools
def _pool_root(tmp_path: Path) -> Path:
    root = tmp_path / "extracted_images"
    for name in ("12.png", "31.png", "images/a.png", "images/b.png"):
        _png(root / name)
    return root


def test_pools_hold_what_their_evaluators_read(tmp_path, capsys):
    root = _pool_root(tmp_path)
    out = tmp_path / "pools" / "mathvista.jsonl"
    cmd = ["convert", "--from", "authors-pool", "--input", str(POOL), "--output", str(out), "--image-root", str(root)]
    assert main(cmd) == 0
    assert "3 read, 3 pools with 6 candidates written" in capsys.readouterr().out
    assert main(["validate", str(out), "--kind", "pool"]) == 0
    items = json.loads(POOL.read_text())
    for rec, item in zip(_lines(out), items):
        theirs = their_pool_item(item, str(root))
        assert rec["question"] == _strip_tags(theirs["question"]).strip()
        assert [os.path.realpath(p) for p in rec["images"]] == [os.path.realpath(p) for p in theirs["images"]]
        # Their prompt per candidate is our question and steps in their layout.
        assert [
            f"Question: {theirs['question']}\nProcess: " + "<prm>".join(c["steps"]) + "<prm>"
            for c in rec["candidates"]
        ] == theirs["prompts"]
        assert [c["correct"] for c in rec["candidates"]] == [lab == 1 for lab in theirs["labels"]]
        assert "answer" not in rec  # their items hold no reference answer
    # The bare final step (their <answer> content) is read as the answer; a stated one as before.
    answers = [[final_answer(c["steps"]) for c in r["candidates"]] for r in _lines(out)]
    assert answers == [["12", "13", "12"], ["B", "A"], ["\\frac{1}{2}"]]
    assert _lines(out)[1]["id"] == "31" and _lines(out)[2]["id"] == "authors_pool-3"


def test_eval_bon_on_converted_pools_uses_their_labels(tmp_path, capsys):
    """Their scored output (prm_mu, prm_kappa, prm_sigma per candidate) keeps its scores; no
    reference answer is needed, the judged labels are the outcomes."""
    items = json.loads(POOL.read_text())
    for it in items:
        n = [len(s) for s in it["solutions_splits"]]
        it["prm_mu"] = [[0.9 if lab else 0.2] * k for lab, k in zip(it["labels"], n)]
        it["prm_kappa"] = [[5.0] * k for k in n]
        it["prm_sigma"] = [[0.1] * k for k in n]
    src = tmp_path / "scored.json"
    src.write_text(json.dumps(items, indent=4))
    out = tmp_path / "bench.jsonl"
    root = _pool_root(tmp_path)
    cmd = ["convert", "--from", "authors-pool", "--input", str(src), "--output", str(out), "--image-root", str(root)]
    assert main(cmd) == 0
    assert _lines(out)[0]["candidates"][1]["mu"] == [0.2, 0.2]
    res = tmp_path / "bon.json"
    assert main(["eval-bon", "--pools", str(out), "--skip-tuned", "--out", str(res)]) == 0
    s = json.loads(res.read_text())["benchmarks"]["bench"]["selectors"]
    assert s["single_pass"]["acc"] == pytest.approx(2 / 3) and s["oracle"]["acc"] == pytest.approx(2 / 3)
    assert s["mean"]["acc"] == pytest.approx(2 / 3) and s["mean"]["check_failed"] == 0
    # A pool with neither a reference answer nor judged candidates is still refused.
    bare = _lines(out)[0]
    for c in bare["candidates"]:
        del c["correct"]
    out.write_text(json.dumps(bare) + "\n")
    assert main(["eval-bon", "--pools", str(out), "--skip-tuned"]) == 2
    assert "every candidate's judged 'correct'" in capsys.readouterr().err


def test_bad_pool_items_name_the_field(tmp_path, capsys):
    items = json.loads(POOL.read_text())
    items[0]["labels"] = [1, 0]
    items[1]["labels"] = [1, 2]
    items[2]["solutions_splits"] = [["a", 3]]
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(items))
    assert main(["convert", "--from", "authors-pool", "--input", str(src), "--output", str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{src}:1: field 'labels': has 2 labels for 3 candidates" in err
    assert f"{src}:2: field 'labels[1]': = 2 is not 1 or 0" in err
    assert f"{src}:3: field 'solutions_splits[0]': must be a list of step strings" in err


def test_pool_correct_must_be_a_boolean(tmp_path, capsys):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"id": "1", "question": "q", "candidates": [{"steps": ["1"], "correct": 1}]}) + "\n")
    assert main(["validate", str(p), "--kind", "pool"]) == 2
    assert "field 'candidates[0].correct': must be true or false, got 1" in capsys.readouterr().out


# --------------------------------------------------------------------------- bare final answers
@pytest.mark.parametrize(
    "step, answer",
    [
        ("12", "12"),
        ("-3.5", "-3.5"),
        ("1,000.", "1,000"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("2\\sqrt{3}", "2\\sqrt{3}"),
        ("x = 5", "x = 5"),
        ("(B)", "B"),
        ("C.", "C"),
        ("30°", "30°"),
        ("12 cm", None),
        ("So x = 5.", None),
        ("Yes", None),
        ("sin(x)", None),
        ("...", None),
        ("12\n13", None),
    ],
)
def test_bare_answer(step, answer):
    assert bare_answer(step) == answer


def test_final_answer_reads_a_bare_last_step_and_keeps_stated_answers():
    # Stated answers win as before; the whole text is read when the last step states none.
    assert final_answer(["so 3 + 4 = 7", "The answer is \\boxed{7}"]) == "7"
    assert final_answer(["x is 5", "answer: 5"]) == "5"
    assert final_answer(["The answer is 9.", "Let me stop here."]) == "9"
    assert final_answer(["<answer>4</answer>"]) == "4"
    assert final_answer(["3 + 4 = 7", "I am done."]) is None
    # A bare last step is the answer (the authors' pools end so), before any earlier statement.
    assert final_answer(["5 + 7 = 12", "12"]) == "12"
    assert final_answer(["The answer is 10, or is it?", "12"]) == "12"
    assert final_answer(["Compare the two.", "(B)"]) == "B"
    # A one-step generation that is a line of arithmetic has not ended its trace.
    assert final_answer(["3 + 4 = 7"], bare=False) is None and final_answer(["3 + 4 = 7"]) == "3 + 4 = 7"


# --------------------------------------------------------------------------- the judge with the question
def _answered_pool(path: Path) -> Path:
    rec = {
        "id": "q1",
        "question": "Which option is the largest? (A) 1/2 (B) 3/4",
        "answer": "B",
        "candidates": [{"steps": ["3/4 > 1/2", "(B)"], "mu": [0.9, 0.9], "kappa": [4, 4]}] * 2
        + [{"steps": ["1/2 > 3/4", "A"], "mu": [0.2, 0.2], "kappa": [4, 4]}],
    }
    path.write_text(json.dumps(rec) + "\n")
    return path


@pytest.mark.parametrize("with_question", [False, True])
def test_judge_sees_the_question_only_when_asked(tmp_path, with_question):
    pool, out = _answered_pool(tmp_path / "bench.jsonl"), tmp_path / "r.json"
    j = _Judge()
    try:
        cmd = ["eval-bon", "--pools", str(pool), "--skip-tuned", "--out", str(out), "--judge-url", j.url]
        cmd += ["--judge-model", "judge"] + (["--judge-with-question"] if with_question else [])
        assert main(cmd) == 0
    finally:
        j.close()
    assert len(j.prompts) == 3
    asked = "Question: Which option is the largest? (A) 1/2 (B) 3/4\n"
    assert all((asked in p) == with_question for p in j.prompts)
    r = json.loads(out.read_text())
    assert r["benchmarks"]["bench"]["selectors"]["oracle"]["acc"] == 1.0
    assert r["provenance"]["settings"]["judge_with_question"] is with_question


def test_judge_with_question_needs_a_judge_and_questions(tmp_path, capsys):
    pool = _answered_pool(tmp_path / "bench.jsonl")
    assert main(["eval-bon", "--pools", str(pool), "--skip-tuned", "--judge-with-question"]) == 2
    assert "--judge-with-question is for --judge-url" in capsys.readouterr().err
    judge = LLMJudge("http://127.0.0.1:9/v1", "judge", with_question=True)
    assert "Question: what is 2 + 2?\nReference answer: 4\nCandidate answer: 4\n" in judge.prompt(
        "4", "4", "what is 2 + 2?"
    )
    assert "Question:" not in LLMJudge("http://127.0.0.1:9/v1", "judge").prompt("4", "4", "what is 2 + 2?")
    with pytest.raises(ValueError, match="one question per pair"):
        judge.check_many([("4", "4")])


def test_their_training_file_trains_with_no_hand_editing(tmp_path, capsys):
    """Text-only lines of their training format: convert, then `betaprm train` on the output
    as it is (a tiny causal LM), the counts reaching the loss."""
    from tests.helpers import make_lm_dir

    lines = []
    for i in range(8):
        steps = [f"{i} + 1 = {i + 1}", f"{i + 1} + 1 = {i + 2}", f"{i + 2}"]
        lines.append(
            {
                "id": f"t{i}",
                "conversations": [
                    {
                        "from": "human",
                        "value": f"Question: add 2 to {i}\nProcess: " + "".join(s + "<prm>" for s in steps),
                    },
                    {"from": "gpt", "value": [0.75, 0.5, 0.5]},
                ],
                **({"prm_counts": {"k": [12, 8, 8], "n": [16, 16, 16]}} if i % 2 else {}),
            }
        )
    src = tmp_path / "theirs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "counts.jsonl"
    assert main(["convert", "--from", "authors-train", "--input", str(src), "--output", str(out)]) == 0
    recs = _lines(out)
    assert [r["mc_correct"] for r in recs[:2]] == [[12, 8, 8], [12, 8, 8]]  # the N = 16 rule agrees here
    lm = make_lm_dir(tmp_path / "lm")
    argv = ["train", "--model", str(lm), "--data", str(out), "--output-dir", str(tmp_path / "prm"), "--max-steps", "2"]
    argv += ["--global-batch-size", "4", "--per-device-train-batch-size", "4", "--save-steps", "2", "--use-cpu"]
    argv += ["--logging-steps", "1"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "prm" / "train_summary.json").read_text())
    assert summary["records"]["loaded"] == 8 and any("loss" in h for h in summary["log_history"])
