"""Step-level beam search and DVTS on the chain-arithmetic world: the real policy stepping one
step at a time, the exact Bayes belief as the scorer; accuracy, token accounting, the
reliability options, a backend that cannot stop after a step, and problems without answers."""

import numpy as np
import pytest

from betaprm.aca import summarize
from betaprm.errors import BetaPRMInputError
from betaprm.generation import GenerationRequest
from betaprm.generation.base import Completion
from betaprm.search import SearchConfig, run_search
from betaprm.synth import SynthPolicy, World, synth_answer, synth_is_correct, synth_tasks
from betaprm.synth.experiment import BayesScorer
from betaprm.synth.world import WorldConfig


@pytest.fixture(scope="module")
def world():
    return World(WorldConfig())


@pytest.fixture(scope="module")
def problems(world):
    return world.sample_problems(150, 11, "s")


def run(world, problems, gen=None, **kw):
    gen = gen or SynthPolicy(world, seed=5)
    cfg = SearchConfig(**kw)
    recs = run_search(
        synth_tasks(problems), gen, BayesScorer(world, problems), cfg, synth_answer, synth_is_correct, progress=False
    )
    return recs, summarize(recs)


def test_one_step_requests_cost_one_step(world, problems):
    p = problems[0]
    (one,) = SynthPolicy(world, seed=1).generate([GenerationRequest(p.question, [], 3, p, max_steps=1)])
    assert all(len(c.steps) == 1 and c.finished is False for c in one)
    assert all(c.n_tokens == len(c.steps[0].split()) for c in one)
    (full,) = SynthPolicy(world, seed=1).generate([GenerationRequest(p.question, [], 2, p)])
    assert all(c.finished and c.steps[-1].startswith("answer") for c in full)


@pytest.mark.parametrize("method", ["beam", "dvts"])
def test_search_beats_a_single_sample_and_counts_its_tokens(world, problems, method):
    single = np.mean([t.correct for p in problems for t in SynthPolicy(world, seed=9).sample_traces(p, 4)])
    recs, s = run(world, problems, method=method, n=8, width=4)
    assert s["acc"] > single + 0.15, (s["acc"], single)
    # Tokens: every generated step is paid for once; a search of 8 beams over T+1 steps
    # generates about 8 (T + 1) steps' worth, far less than 8 whole traces per round.
    for r, p in zip(recs, problems):
        assert r["pool_size"] >= 1 and r["rounds"] <= p.T + 1
        assert r["generated_completions"] <= 8 * (p.T + 1)
    steps_words = np.mean([len(t.steps[0].split()) for t in SynthPolicy(world, seed=3).sample_traces(problems[0], 4)])
    assert s["tokens"] <= 8 * sum(p.T + 1 for p in problems) * steps_words * 1.3


def test_reliability_options_run_and_pruning_saves_nothing_it_should_not(world, problems):
    _, plain = run(world, problems, n=8, width=2)
    _, ucb = run(world, problems, n=8, width=2, rank="ucb", c=0.5)
    _, pruned = run(world, problems, n=8, width=2, prune=True, c=0.5)
    for s in (ucb, pruned):
        assert s["acc"] > plain["acc"] - 0.1 and s["n"] == len(problems)


def test_a_backend_that_returns_whole_completions_is_cut_to_one_step_and_charged_for_all(world, problems):
    class Whole:
        """Ignores max_steps and does not say whether it finished (like the text backends)."""

        def __init__(self):
            self.inner = SynthPolicy(world, seed=5)

        def generate(self, requests):
            out = self.inner.generate(
                [GenerationRequest(r.question, r.prefix, r.n, r.problem, r.seed) for r in requests]
            )
            return [[Completion(c.steps, c.n_tokens) for c in cs] for cs in out]

    _, exact = run(world, problems[:40], n=4, width=2)
    _, whole = run(world, problems[:40], gen=Whole(), n=4, width=2)
    assert whole["tokens"] > 1.5 * exact["tokens"]  # the discarded rest of each completion is paid for
    assert whole["acc"] > 0.5


def test_without_reference_answers_the_choice_is_returned(world, problems):
    cfg = SearchConfig(method="dvts", n=4, width=2)
    recs = run_search(
        synth_tasks(problems[:5]),
        SynthPolicy(world, seed=1),
        BayesScorer(world, problems),
        cfg,
        synth_answer,
        progress=False,
    )
    assert all(r["correct"] is None and r["chosen_answer"] is not None for r in recs)


def test_bad_search_configuration_is_one_clear_error():
    with pytest.raises(BetaPRMInputError, match="multiple of width"):
        SearchConfig(n=6, width=4)
    with pytest.raises(BetaPRMInputError, match="method"):
        SearchConfig(method="mcts")


# ---------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from betaprm.model import BetaPRM

    from .helpers import make_lm_dir

    d = tmp_path_factory.mktemp("prm")
    BetaPRM.from_backbone(str(make_lm_dir(d / "lm"))).save_pretrained(d / "prm")
    return d / "prm"


def _problems_file(path, problems, extra):
    """A problems file: id and question of each problem, and ``extra(i, problem)``'s fields."""
    import json

    path.write_text(
        "".join(json.dumps({"id": p.id, "question": p.question, **extra(i, p)}) + "\n" for i, p in enumerate(problems))
    )
    return path


def _records(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def test_search_command_on_the_world_appends_and_resumes(tmp_path, prm_dir):
    from betaprm.cli import main

    out = tmp_path / "s.jsonl"
    argv = ["search", "--model", str(prm_dir), "--n-problems", "6", "--n", "4", "--width", "2", "--out", str(out)]
    assert main(argv + ["--method", "dvts"]) == 0
    first = _records(out)
    assert len(first) == 6 and all(isinstance(r["correct"], bool) and r["tokens"] > 0 for r in first)
    assert main(argv + ["--method", "dvts"]) == 0  # a rerun finds every problem done
    assert _records(out) == first
    assert main(argv + ["--method", "beam"]) == 2  # other settings into the same --out: refused


def test_search_and_aca_through_a_real_server_with_and_without_reference_answers(tmp_path, prm_dir, capsys):
    """`betaprm search --backend openai`: one step per call (the stop at the blank line; the
    server says when the model ended the trace, as vLLM does), answers read from the text.
    Problems without an answer get a choice and no verdict, in search and in ACA."""

    from betaprm.cli import main

    from .synth_server import SynthServer

    world = World()
    problems = world.sample_problems(4, 21, "w")
    src = _problems_file(
        tmp_path / "problems.jsonl", problems, lambda i, p: {"answer": str(p.answer)} if i < 2 else {}
    )
    srv = SynthServer(problems)
    common = ["--backend", "openai", "--policy", "synth", "--base-url", srv.url, "--problems", str(src)]
    try:
        rc = main(
            [
                "search",
                *common,
                "--model",
                str(prm_dir),
                "--n",
                "4",
                "--width",
                "2",
                "--out",
                str(tmp_path / "s.jsonl"),
            ]
        )
        one_step = [b for b in srv.bodies if b.get("stop") == ["\n\n"]]
        rc_aca = main(["aca", *common, "--model", str(prm_dir), "--final", "lin", "--out", str(tmp_path / "a.jsonl")])
    finally:
        srv.close()
    assert rc == 0 and rc_aca == 0
    assert len(one_step) >= 4 * sum(p.T for p in problems)  # search asked step by step
    for name in ("s.jsonl", "a.jsonl"):
        recs = sorted(_records(tmp_path / name), key=lambda r: r["id"])  # appended as they finish
        assert [r["id"] for r in recs] == [p.id for p in problems]
        assert all(isinstance(r["correct"], bool) for r in recs[:2]), name
        assert all(r["correct"] is None and r["answer"] is None and r["chosen_answer"] is not None for r in recs[2:])
    search = sorted(_records(tmp_path / "s.jsonl"), key=lambda r: r["id"])
    # A search of 4 beams over T + 1 steps: every beam finished with a whole trace.
    assert all(r["pool_size"] >= 1 and r["rounds"] == p.T + 1 for r, p in zip(search, problems))
    out = capsys.readouterr().out
    assert "on the 2 with an answer" in out


def test_problems_with_images_reach_a_vision_language_policy_and_prm(tmp_path):
    """ACA and search on problems with images: the OpenAI-compatible backend sends each
    image as an image_url part (a data URL) of the user turn, and a vision-language BetaPRM
    scores the candidates with the images."""
    import base64
    import json

    from PIL import Image

    from betaprm.cli import main
    from betaprm.model import BetaPRM
    from betaprm.tiny import save_vlm_dir, tiny_vlm

    from .synth_server import SynthServer

    model, proc = tiny_vlm("qwen2_5_vl")
    save_vlm_dir(model, proc, tmp_path / "vlm")
    BetaPRM.from_backbone(str(tmp_path / "vlm")).save_pretrained(tmp_path / "prm")
    (tmp_path / "img").mkdir()
    Image.fromarray(np.full((28, 28, 3), 200, dtype="uint8")).save(tmp_path / "img" / "a.png")
    world = World()
    problems = world.sample_problems(3, 31, "i")
    src = _problems_file(
        tmp_path / "problems.jsonl",
        problems,
        lambda i, p: {"answer": str(p.answer), "images": ["img/a.png"] if i else []},
    )
    srv = SynthServer(problems)
    common = [
        "--backend",
        "openai",
        "--policy",
        "synth",
        "--base-url",
        srv.url,
        "--problems",
        str(src),
        "--model",
        str(tmp_path / "prm"),
    ]
    try:
        rc = main(["aca", *common, "--final", "lin", "--budget", "4", "--out", str(tmp_path / "a.jsonl")])
        rc_search = main(["search", *common, "--n", "2", "--width", "2", "--out", str(tmp_path / "s.jsonl")])
    finally:
        srv.close()
    assert rc == 0 and rc_search == 0
    png = base64.b64encode((tmp_path / "img" / "a.png").read_bytes()).decode()
    assert srv.image_parts and all(urls == [f"data:image/png;base64,{png}"] for urls in srv.image_parts)
    with_images = [b for b in srv.bodies if isinstance(b["messages"][0]["content"], list)]
    assert len(with_images) == len(srv.image_parts) and len(with_images) < len(
        srv.bodies
    )  # the first problem has none
    for name in ("a.jsonl", "s.jsonl"):
        recs = {r["id"]: r for r in _records(tmp_path / name)}
        assert "images" not in recs[problems[0].id] and recs[problems[1].id]["images"][0].endswith("a.png")
    # A problem whose image is missing is refused before anything runs, naming the line.
    src.write_text(json.dumps({"id": "x", "question": "q", "images": ["nope.png"]}) + "\n")
    assert main(["aca", *common, "--out", str(tmp_path / "b.jsonl")]) == 2


def test_repair_rewrites_wrong_looking_steps_instead_of_building_on_them(world, problems):
    recs, plain = run(world, problems, n=4, width=2)
    rrecs, repaired = run(world, problems, n=4, width=2, repair=True, c=0.0, p_bad=0.2)
    assert sum(r["repairs"] for r in rrecs) > 0 and all(r["repairs"] == 0 for r in recs)
    # Under the exact belief a wrong verifiable step drops mu to ~0: repairing it gives the
    # search more right traces to choose from, at the price of more rounds.
    assert repaired["acc"] >= plain["acc"] - 0.02
    assert repaired["tokens"] > plain["tokens"]
    assert all(r["rounds"] <= 40 + 1 for r in rrecs)


def test_batched_equals_one_by_one(world, problems):
    """Lockstep over many problems gives the records that searching each alone gives (every
    request carries a seed derived from its problem, round and beam)."""
    together, _ = run(world, problems[:10], method="dvts", n=4, width=2)
    alone = [run(world, [p], method="dvts", n=4, width=2)[0][0] for p in problems[:10]]
    assert together == alone
