"""betaprm aca"""

from __future__ import annotations

from dataclasses import dataclass

from ..generation.factory import RUNTIME_SETTINGS, BackendOptions
from ..options import opt as _f
from ._scoring import BatchOptions

HELP = "Adaptive Computation Allocation: Best-of-N that stops early and repairs uncertain prefixes"
DESCRIPTION = """Run ACA (paper section 5) with a trained PRM as the scorer.

Problems: the chain-arithmetic world's test split by default (the split `betaprm demo
--seed S` uses; answers checked exactly), or --problems FILE.jsonl with id, question and
answer per line (answers checked with math-verify; a check that fails is counted apart,
never as wrong; a line without answer is solved all the same, its record has the choice and
no verdict). Generation: --backend synth | transformers | openai | vllm.

Each problem appends one record to --out (rounds, cut points, stop reason, pool size,
generated tokens, the candidates with their scores); rerunning the same command skips the
problems already there. OUT.meta.json records the settings that made the records (a rerun
with other settings stops and names them); OUT.lock keeps a second process out of --out.
--variant picks the paper's ablations:
  aca            ACA with the learned uncertainty (BetaPRM), final choice by S_RB
  no-early-stop  always spend the budget, still repairing uncertain prefixes
  reward-only    sigma = 0 (for a standard PRM): the stopping test is a score margin
  proxy          sigma = sqrt(mu(1-mu)) (for a standard PRM)
  best-of-n      all --budget candidates at once (the baseline)
S_RB needs its sigma threshold: --final-tau, or, on the chain-arithmetic world, tuned on
its validation split when not given (--final rb); on a problems file without --final-tau
the final choice falls back to S_lin and says so."""

VARIANTS = ("aca", "no-early-stop", "reward-only", "proxy", "best-of-n")


@dataclass
class ACACommandConfig(BatchOptions, BackendOptions):
    model: str = _f("", "the PRM directory that scores candidates (betaprm train output)")
    out: str = _f("", "JSONL file of per-problem records (appended; a rerun resumes)")
    problems: str | None = _f(
        None, "JSONL problems with id, question, answer (default: the chain-arithmetic test split)"
    )
    world_config: str | None = _f(None, "chain-arithmetic world settings (JSON), as for betaprm demo")
    seed: int = _f(0, "the demo seed whose test split to use, and the sampling seed")
    n_problems: int = _f(1000, "chain-arithmetic problems (the demo's test split has 1000)")
    variant: str = _f("aca", "aca, no-early-stop, reward-only, proxy or best-of-n (see above)")
    n0: int = _f(4, "candidates sampled from scratch first")
    m: int = _f(4, "candidates per later batch")
    budget: int = _f(16, "candidates per problem at most")
    lam: float = _f(0.5, "lambda of the stopping test's S_lin")
    c_stop: float = _f(0.3, "stopping test: S +- c_stop * mean(sigma)")
    c_cut: float = _f(1.0, "cut point: earliest step with mu - c_cut*sigma < p_bad")
    p_bad: float = _f(0.3, "cut point threshold")
    stop_margin: float = _f(0.0, "stop only when LCB(best) - max UCB(rivals) exceeds this")
    final: str = _f("rb", "final selector: rb, lin, mean, min, last, prod")
    final_lam: float | None = _f(None, "lambda of the final selector (default: tuned with tau, else 0.5)")
    final_tau: float | None = _f(None, "S_RB's sigma threshold (default: tuned on the world's validation split)")
    device: str = _f("auto", "PRM device: auto, cpu, cuda, ...")
    write_candidates: bool = _f(True, "keep every candidate's steps and scores in the records")
    plots: str | None = _f(None, "write aca_tokens.png (accuracy against generated tokens) into this folder")
    baseline: str | None = _f(
        None, "with --plots: records of a --variant best-of-n run, drawn as the Best-of-n curve (n = 1..budget)"
    )

    def __post_init__(self):
        from ..errors import BetaPRMInputError

        bad = self._check_backend() + self.batch_problems()
        if not self.model:
            bad.append("--model is required (the PRM that scores candidates)")
        if not self.out:
            bad.append("--out is required (the JSONL file of per-problem records)")
        if self.variant not in VARIANTS:
            bad.append(f"--variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.problems is None and self.backend != "synth":
            bad.append(
                f"--backend {self.backend} needs --problems (text problems); the chain-arithmetic world is generated "
                "by --backend synth"
            )
        if self.problems is not None and self.backend == "synth":
            bad.append(
                "--backend synth continues chain-arithmetic problems only; give --backend transformers/openai/vllm "
                "for --problems"
            )
        if bad:
            raise BetaPRMInputError("bad aca configuration:\n  " + "\n  ".join(bad))

    def aca_config(self, final_lam: float, final_tau: float | None):
        from ..aca import ACAConfig

        common = dict(
            lam=self.lam,
            c_stop=self.c_stop,
            c_cut=self.c_cut,
            p_bad=self.p_bad,
            stop_margin=self.stop_margin,
            final=self.final,
            final_lam=final_lam,
            final_tau=final_tau,
            seed=self.seed,
        )
        if self.variant == "best-of-n":
            return ACAConfig.best_of_n(budget=self.budget, **common)
        return ACAConfig(
            n0=self.n0,
            m=self.m,
            budget=self.budget,
            early_stop=self.variant != "no-early-stop",
            uncertainty={"reward-only": "none", "proxy": "proxy"}.get(self.variant, "learned"),
            **common,
        )


def add_arguments(parser):
    from ._config import add_config_args

    add_config_args(parser, ACACommandConfig)


def read_problems(path: str) -> list:
    """Problems (id, question, optional answer and images) with file:line errors."""
    from ..data.records import problem_fields, read_objects
    from ..errors import BetaPRMInputError
    from ..types import Task

    tasks, seen = [], set()
    for where, r in read_objects(
        path,
        ("id", "question"),
        "id, question and, for an accuracy, answer (the reference)",
        flag="--problems",
    ):
        # Without an answer the problem is still solved: its record has the choice, no verdict.
        if "answer" in r:
            rid, question, answer = problem_fields(r, where)
        else:
            rid, question, _ = problem_fields({**r, "answer": "-"}, where)
            answer = None
        if rid in seen:
            raise BetaPRMInputError(f"{where}: id {rid!r} appears twice; ids must be unique")
        seen.add(rid)
        tasks.append(Task(rid, question, answer, images=_images(r, where, path)))
    return tasks


def _images(r: dict, where: str, path: str) -> list[str]:
    """A problem's ``images`` (paths, relative ones to the problems file's folder)."""
    from pathlib import Path

    from ..errors import BetaPRMInputError
    from ..scoring import _pool_images

    imgs = r.get("images", [])
    if not isinstance(imgs, list) or not all(isinstance(p, str) and p for p in imgs):
        raise BetaPRMInputError(f"{where}: field 'images' must be a list of image paths, got {imgs!r:.80}")
    paths = _pool_images({"images": imgs}, path)
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise BetaPRMInputError(
            f"{where}: field 'images': no such file {missing[0]!r}; fix: paths are relative to the problems file"
        )
    return paths


# Options that do not change a record (batching, device, paths, how a server is reached,
# how many problems): left out of the settings a resumed --out must match. The model
# and the world's settings file enter as fingerprints of their contents.
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
    "plots",
    "baseline",
} | RUNTIME_SETTINGS


def result_settings(cfg) -> dict:
    """What makes --out's records: compared with OUT.meta.json when a run resumes."""
    from ..provenance import fingerprint, model_fingerprint, settings_of

    return {
        "model": model_fingerprint(cfg.model),
        "policy": fingerprint(cfg.policy) if cfg.policy else "",
        "world_config": fingerprint(cfg.world_config) if cfg.world_config else None,
        **settings_of(cfg, NOT_RESULTS),
    }


def run(args):
    from ..provenance import open_output
    from ._config import config_from_args

    cfg = config_from_args(ACACommandConfig, args)
    # Checked (and locked) before the model loads and S_RB is tuned: a wrong resume stops at once.
    with open_output(
        cfg.out,
        result_settings(cfg),
        {"model": cfg.model, "policy": cfg.policy, "problems": cfg.problems, "world_config": cfg.world_config},
    ):
        return _run(cfg)


def _run(cfg):
    import torch

    from ..aca import accuracy_phrase, run_aca, summarize, tune_rb_on_world
    from ..generation.factory import build_generator
    from ..model import BetaPRM
    from ..scoring import PRMScorer

    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    prm = BetaPRM.from_pretrained(cfg.model, device=device).eval()
    scorer = PRMScorer(prm, cfg.batch_size, cfg.max_batch_tokens)
    final_lam, final_tau = cfg.final_lam, cfg.final_tau
    if cfg.problems is None:
        from ..synth import (
            World,
            WorldConfig,
            synth_answer,
            synth_is_correct,
            synth_tasks,
        )

        world = World(WorldConfig.from_json(cfg.world_config) if cfg.world_config else World().cfg)
        from ..synth.experiment import split_seeds

        tasks = synth_tasks(world.sample_problems(cfg.n_problems, split_seeds(cfg.seed).test_problems, "test"))
        tok = prm.tokenizer
        generator = build_generator(
            cfg, world, count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False)), seed=cfg.seed
        )
        answer_of, is_correct = synth_answer, synth_is_correct
        if cfg.final == "rb" and final_tau is None:
            n_val = 300
            res = tune_rb_on_world(world, scorer, cfg.budget, cfg.seed, final_lam, n_val=n_val)
            print(
                f"S_RB tuned on {n_val} validation problems: lambda {res.lam}, tau {res.tau:.4f} (q {res.q}), "
                f"validation accuracy {res.val_accuracy:.3f}"
            )
            final_lam, final_tau = res.lam, res.tau
    else:
        from ..answers import AnswerChecker, final_answer

        tasks = read_problems(cfg.problems)
        generator = build_generator(cfg, seed=cfg.seed)
        checker = AnswerChecker()
        answer_of = final_answer

        def is_correct(task, ans):
            return None if task.answer is None else checker.check(task.answer, ans)

        if cfg.final == "rb" and final_tau is None:
            print("betaprm aca: no --final-tau for S_RB on a problems file: the final choice uses S_lin (lambda 0.5)")
            cfg.final = "lin"
    aca_cfg = cfg.aca_config(final_lam if final_lam is not None else 0.5, final_tau)
    records = run_aca(
        tasks, generator, scorer, aca_cfg, answer_of, is_correct, out=cfg.out, write_candidates=cfg.write_candidates
    )
    if cfg.problems is not None:
        checker.close()  # stops math-verify's worker process (on an error above, the exit does)
    s = summarize(records)
    acc = accuracy_phrase(s)
    print(
        f"{cfg.variant}: {s['n']} problems, {acc}, {s['tokens']} generated tokens "
        f"({s['tokens'] / max(s['n'], 1):.0f} per problem), mean pool {s['mean_pool_size']:.1f}, stops "
        f"{s['stop_reasons']}"
        + (f", {s['check_failed']} answer checks failed" if s["check_failed"] else "")
        + f" -> {cfg.out}"
    )
    if cfg.plots:
        _plot(cfg, records, s, final_lam, final_tau)
    return 0


def _plot(cfg, records, s, final_lam, final_tau):
    """This run as a point on accuracy against tokens, over the Best-of-n curve of a
    best-of-n run's records (its first n candidates, the same final selector)."""
    from pathlib import Path

    from ..aca import best_of_n_curve
    from ..evaluation import plots

    curve = {}
    if cfg.baseline:
        from ..data.records import read_objects

        base = [
            r
            for _, r in read_objects(cfg.baseline, ("id",), "an ACA record of a --variant best-of-n run", "--baseline")
        ]
        method = cfg.final if final_tau is not None or cfg.final != "rb" else "lin"
        curve["Best-of-n (baseline records)"] = best_of_n_curve(
            base, method, final_lam if final_lam is not None else 0.5, final_tau
        )
    Path(cfg.plots).mkdir(parents=True, exist_ok=True)
    plots.best_of_n_curves(
        curve,
        Path(cfg.plots) / "aca_tokens.png",
        points={cfg.variant: (s["tokens"], s["acc"])},
        xlabel="generated tokens",
    )
