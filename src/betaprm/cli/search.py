"""betaprm search"""

from __future__ import annotations

from dataclasses import dataclass

from ..generation.factory import RUNTIME_SETTINGS, BackendOptions
from ..options import opt as _f
from ._scoring import BatchOptions

HELP = "step-level beam search or DVTS guided by a PRM (optionally by its reliability)"
DESCRIPTION = """Beam search or DVTS (diverse verifier tree search, as search-and-learn defines them) with a
trained PRM scoring each new step: every round the generator writes one more step of each kept
beam and the PRM ranks them by the latest step's mu (--rank mu) or mu + c * sigma (--rank ucb).

Problems: the chain-arithmetic world's test split by default (the split `betaprm demo --seed S`
uses), or --problems FILE.jsonl with id, question and, for an accuracy, answer per line (checked
with math-verify; a line without answer gets its choice and no verdict). Generation: --backend
synth | transformers | openai | vllm. The synthetic policy and OpenAI-compatible servers stop
after one step (a blank line, --split blank-line); other backends write whole completions, of
which the search keeps the first step and pays for all.

Each problem appends one record to --out (the choice, generated tokens, rounds, with
--write-candidates the finished beams and their scores); rerunning the same command skips the
problems already there. OUT.meta.json records the settings that made the records."""


@dataclass
class SearchCommandConfig(BatchOptions, BackendOptions):
    model: str = _f("", "the PRM directory that scores steps (betaprm train output)")
    out: str = _f("", "JSONL file of per-problem records (appended; a rerun resumes)")
    problems: str | None = _f(
        None, "JSONL problems with id, question and optional answer (default: the chain-arithmetic test split)"
    )
    world_config: str | None = _f(None, "chain-arithmetic world settings (JSON), as for betaprm demo")
    seed: int = _f(0, "the demo seed whose test split to use, and the sampling seed")
    n_problems: int = _f(1000, "chain-arithmetic problems (the demo's test split has 1000)")
    method: str = _f("beam", "beam (beam search) or dvts (diverse verifier tree search)")
    n: int = _f(16, "beams: steps generated per round (beam) or subtrees x width (dvts)")
    width: int = _f(4, "extensions per kept beam")
    max_rounds: int = _f(40, "rounds of one step each; then the kept beams are completed in one call")
    rank: str = _f("mu", "ranking score of a beam's latest step: mu, or ucb (mu + c * sigma)")
    c: float = _f(1.0, "width of the bounds mu +- c * sigma (--rank ucb, --prune)")
    prune: bool = _f(False, "beam: drop a beam whose upper bound is below another beam's lower bound")
    repair: bool = _f(
        False,
        "cut a kept beam whose latest step looks wrong (mu - c * sigma < p_bad) before its earliest wrong-looking "
        "step and continue from there, as ACA repairs",
    )
    p_bad: float = _f(0.3, "--repair: the threshold of a wrong-looking step")
    final: str = _f("last", "selector of the final answer among finished beams: last, mean, min, prod, lin, rb")
    final_lam: float = _f(0.5, "lambda of the final selector")
    final_tau: float | None = _f(None, "S_RB's sigma threshold (required for --final rb)")
    device: str = _f("auto", "PRM device: auto, cpu, cuda, ...")
    write_candidates: bool = _f(False, "keep every finished beam's steps and scores in the records")

    def __post_init__(self):
        from ..errors import BetaPRMInputError

        bad = self._check_backend() + self.batch_problems()
        if not self.model:
            bad.append("--model is required (the PRM that scores steps)")
        if not self.out:
            bad.append("--out is required (the JSONL file of per-problem records)")
        if self.problems is None and self.backend != "synth":
            bad.append(f"--backend {self.backend} needs --problems (text problems)")
        if self.problems is not None and self.backend == "synth":
            bad.append("--backend synth continues chain-arithmetic problems only; give another backend for --problems")
        try:
            self.search_config()
        except BetaPRMInputError as e:
            bad.append(str(e))
        if bad:
            raise BetaPRMInputError("bad search configuration:\n  " + "\n  ".join(bad))

    def search_config(self):
        from ..search import SearchConfig

        return SearchConfig(
            method=self.method,
            n=self.n,
            width=self.width,
            max_rounds=self.max_rounds,
            rank=self.rank,
            c=self.c,
            prune=self.prune,
            repair=self.repair,
            p_bad=self.p_bad,
            final=self.final,
            final_lam=self.final_lam,
            final_tau=self.final_tau,
            seed=self.seed,
        )


def add_arguments(parser):
    from ._config import add_config_args

    add_config_args(parser, SearchCommandConfig)


NOT_RESULTS = {
    "model",
    "policy",
    "out",
    "problems",
    "n_problems",
    "world_config",
    "batch_size",
    "max_batch_tokens",
    "device",
} | RUNTIME_SETTINGS


def run(args):
    from ..provenance import fingerprint, model_fingerprint, open_output, settings_of
    from ._config import config_from_args

    cfg = config_from_args(SearchCommandConfig, args)
    settings = {
        "model": model_fingerprint(cfg.model),
        "policy": fingerprint(cfg.policy) if cfg.policy else "",
        "world_config": fingerprint(cfg.world_config) if cfg.world_config else None,
        **settings_of(cfg, NOT_RESULTS),
    }
    where = {"model": cfg.model, "policy": cfg.policy, "problems": cfg.problems, "world_config": cfg.world_config}
    with open_output(cfg.out, settings, where):
        return _run(cfg)


def _run(cfg):
    import torch

    from ..aca import accuracy_phrase, summarize
    from ..generation.factory import build_generator
    from ..model import BetaPRM
    from ..scoring import PRMScorer
    from ..search import run_search

    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    prm = BetaPRM.from_pretrained(cfg.model, device=device).eval()
    scorer = PRMScorer(prm, cfg.batch_size, cfg.max_batch_tokens)
    checker = None
    if cfg.problems is None:
        from ..synth import World, WorldConfig, synth_answer, synth_is_correct, synth_tasks
        from ..synth.experiment import split_seeds

        world = World(WorldConfig.from_json(cfg.world_config) if cfg.world_config else World().cfg)
        tasks = synth_tasks(world.sample_problems(cfg.n_problems, split_seeds(cfg.seed).test_problems, "test"))
        tok = prm.tokenizer
        generator = build_generator(
            cfg, world, count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False)), seed=cfg.seed
        )
        answer_of, is_correct = synth_answer, synth_is_correct
    else:
        from ..answers import AnswerChecker, final_answer
        from .aca import read_problems

        tasks = read_problems(cfg.problems)
        generator = build_generator(cfg, seed=cfg.seed)
        checker = AnswerChecker()
        answer_of = final_answer

        def is_correct(task, ans):
            return None if task.answer is None else checker.check(task.answer, ans)

    records = run_search(
        tasks,
        generator,
        scorer,
        cfg.search_config(),
        answer_of,
        is_correct,
        write_candidates=cfg.write_candidates,
        out=cfg.out,
    )
    if checker is not None:
        checker.close()
    s = summarize(records)
    acc = accuracy_phrase(s)
    print(
        f"{cfg.method}: {s['n']} problems, {acc}, {s['tokens']} generated tokens "
        f"({s['tokens'] / max(s['n'], 1):.0f} per problem)"
        + (f", {s['check_failed']} answer checks failed" if s["check_failed"] else "")
        + f" -> {cfg.out}"
    )
    return 0
