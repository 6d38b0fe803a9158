"""betaprm label: counts that follow the truth (the chain-arithmetic world's exact q_t),
the text path through a real HTTP server with math-verify, failed checks kept apart,
and resuming after an interrupted write."""

import json

import numpy as np
import pytest

from betaprm.cli import main
from betaprm.label import LabelItem, label_traces
from betaprm.synth import SynthPolicy, World, synth_answer

from .synth_server import SynthServer


def _z_score(world, problems_by_id, records, n):
    """Standardised total of (K_t - N q_t) over every non-final step: K_t ~ Bin(N, q_t)."""
    num, var = 0.0, 0.0
    for r in records:
        p = problems_by_id[r["id"].split("/")[0]]
        q = world.true_q(p, world.values_of(p, r["steps"]))
        for t in range(len(r["steps"]) - 1):
            num += r["mc_correct"][t] - n * q[t]
            var += n * q[t] * (1 - q[t])
    return num / np.sqrt(var)


def test_synth_labels_follow_the_exact_q(tmp_path):
    out = tmp_path / "lab.jsonl"
    assert main(["label", "--out", str(out), "--n-problems", "60", "--n", "16", "--seed", "2"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    world = World()
    problems = {p.id: p for p in world.sample_problems(60, 2, "label")}
    assert len(recs) == 120 and all(len(r["mc_correct"]) == len(r["steps"]) for r in recs)
    assert abs(_z_score(world, problems, recs, 16)) < 4
    # The last step is the trace itself: K_T is N when its answer is right, else 0.
    for r in recs:
        right = int(r["steps"][-1].split()[-1]) == problems[r["id"].split("/")[0]].answer
        assert r["mc_correct"][-1] == (16 if right else 0)
    assert main(["validate", str(out)]) == 0


def _write_traces(path, problems, world, bad_gold=None):
    pol = SynthPolicy(world, seed=4)
    with open(path, "w") as f:
        for p in problems:
            t = pol.sample_traces(p, 1)[0]
            gold = bad_gold if bad_gold and p is problems[-1] else str(p.answer)
            f.write(
                json.dumps({"id": p.id, "question": p.question, "answer": gold, "candidates": [{"steps": t.steps}]})
                + "\n"
            )


def test_text_labelling_through_a_real_server(tmp_path):
    """`betaprm label --backend openai`: text continuations from a real HTTP server,
    answers read from the text and checked by math-verify. The last problem's reference
    answer cannot be parsed: its checks fail, and the trace is set apart, not labelled 0."""
    world = World()
    problems = world.sample_problems(12, 9, "x")
    src = tmp_path / "traces.jsonl"
    _write_traces(src, problems, world, bad_gold="$$")
    srv = SynthServer(problems)
    out = tmp_path / "lab.jsonl"
    try:
        rc = main(
            [
                "label",
                "--backend",
                "openai",
                "--policy",
                "synth-policy",
                "--base-url",
                srv.url,
                "--input",
                str(src),
                "--out",
                str(out),
                "--n",
                "8",
                "--concurrency",
                "4",
            ]
        )
    finally:
        srv.close()
    assert rc == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == [f"{p.id}/0" for p in problems[:-1]]
    assert abs(_z_score(world, {p.id: p for p in problems}, recs, 8)) < 4
    failed = [json.loads(line) for line in (tmp_path / "lab.failed.jsonl").read_text().splitlines()]
    assert [f["id"] for f in failed] == [f"{problems[-1].id}/0"]
    assert all(m == 8 for m in failed[0]["mc_failed"]) and "every answer check failed" in failed[0]["reason"]
    assert all("mc_failed" not in r for r in recs)


def test_resume_after_an_interrupted_write_equals_the_uninterrupted_run(tmp_path):
    world = World()
    problems = world.sample_problems(20, 5, "r")
    pol = SynthPolicy(world, seed=1)
    items = [LabelItem(p.id, p.question, pol.sample_traces(p, 1)[0].steps, p.answer, p) for p in problems]

    def check(pairs):
        return [a is not None and a == it.handle.answer for it, a in pairs]

    full = tmp_path / "full.jsonl"
    label_traces(items, SynthPolicy(world, seed=0), 8, synth_answer, check, full, progress=False, chunk=4)
    lines = full.read_text().splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:7]) + lines[7][:25])  # seven records and a torn eighth
    stats = label_traces(items, SynthPolicy(world, seed=99), 8, synth_answer, check, part, progress=False, chunk=4)
    assert stats["already_done"] == 7 and stats["labelled"] == 13
    assert sorted(part.read_text().splitlines()) == sorted(line.rstrip("\n") for line in lines)


def test_label_input_errors_name_the_line(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        '{"id": "a", "question": "q", "answer": "1", "steps": ["x"]}\n{"id": "b", "question": "q", "steps": ["x"]}\n'
    )
    rc = main(
        ["label", "--backend", "openai", "--policy", "m", "--input", str(src), "--out", str(tmp_path / "o.jsonl")]
    )
    assert rc == 2 and f"{src}:2: field 'answer' is missing" in capsys.readouterr().err
    assert main(["label", "--backend", "openai", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "--backend openai needs --policy" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--help"])
def test_label_and_aca_help(flag, capsys):
    for cmd in ("label", "aca"):
        with pytest.raises(SystemExit) as e:
            main([cmd, flag])
        assert e.value.code == 0
    assert "--continuation" in capsys.readouterr().out


def test_label_with_a_local_transformers_policy(tmp_path):
    """`betaprm label --backend transformers` on a tiny random causal LM: every step gets
    N checked continuations (a random model states no answer, so K is 0 and nothing fails)."""
    from tests.helpers import make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    src = tmp_path / "t.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "a",
                "question": "What is 1 + 2?",
                "answer": "3",
                "steps": ["1 + 2 = 3", "The answer is \\boxed{3}"],
            }
        )
        + "\n"
    )
    out = tmp_path / "o.jsonl"
    assert (
        main(
            [
                "label",
                "--backend",
                "transformers",
                "--policy",
                str(lm),
                "--input",
                str(src),
                "--out",
                str(out),
                "--n",
                "3",
                "--max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["mc_total"] == [3, 3] and rec["mc_correct"][1] == 3 and 0 <= rec["mc_correct"][0] <= 3
