"""betaprm eval-bon"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..answers import AnswerChecker, LLMJudge, final_answer
from ..data.records import read_records
from ..distributed import discard_parts, process_device, processes
from ..errors import BetaPRMInputError
from ..evaluation import plots
from ..evaluation.bon import (
    SELECTORS,
    TUNED,
    BonPool,
    NoTestProblems,
    NoValidationProblems,
    check_pools,
    evaluate_pools,
    split_problems,
)
from ..generation.factory import api_key_problems, read_api_key
from ..options import opt as _f
from ..provenance import (
    check_paths,
    config_file_of,
    fingerprint,
    model_fingerprint,
    rejects_path,
    settings_of,
    write_result,
)
from .flags import add_config_args, config_from_args
from .scoring_options import ScoringOptions, scores_path

HELP = "Best-of-N accuracy of every selector on candidate-pool files (one per benchmark)"
DESCRIPTION = """Best-of-N evaluation, the protocol of the paper's table 1.

--pools: one JSONL file per benchmark (id, question, answer, candidates with steps; scored
files also carry mu, kappa, sigma per candidate, else give --model to score on the fly).
Final answers are read from each candidate's last step (\\boxed{}, <answer>, "answer is",
or the step itself when it is a bare answer such as 12 or B) and checked against the
reference with math-verify, or by an LLM judge behind an OpenAI-compatible server
(--judge-url, --judge-model; --judge-with-question shows it the question too, as the
paper's authors' judge; --api-key-env NAME sends the key held in environment variable
NAME, no key is sent without it); failed checks are counted apart. A candidate with a
judged 'correct' (authors' pools converted by `betaprm convert --from authors-pool`) is
not checked again.
S_lin and S_RB are tuned on --val-fraction of each benchmark's problems; the table gives
test accuracy with 95% bootstrap intervals and the average gain over single pass. A split
that leaves no validation (or no test) problem is an error; --skip-tuned leaves the tuned
selectors out and tests every problem."""


@dataclass
class EvalBonConfig(ScoringOptions):
    pools: str = _f(
        "",
        "comma-separated pool sources, one per benchmark (JSONL, .json, parquet, a save_to_disk folder or a hub name; "
        "the file or folder name is the benchmark name)",
        required=True,
    )
    model: str | None = _f(
        None,
        "a PRM: a folder, or a hub name OWNER/NAME[@REVISION], to score pools that have no mu/kappa/sigma",
    )
    out: str | None = _f(None, "write the results here (JSON)")
    plots: str | None = _f(None, "write Best-of-n curves (PNG, one per benchmark) into this folder")
    val_fraction: float = _f(0.2, "fraction of each benchmark's problems used to tune S_lin and S_RB")
    seed: int = _f(0, "seed of the split and the bootstrap")
    skip_tuned: bool = _f(
        False,
        "leave out the selectors tuned on validation (S_lin, S_RB, the reliability-weighted vote) and test every "
        "problem (no split, --val-fraction unused); without it a split that leaves no validation problem is an error",
    )
    device: str = _f("auto", "auto, cpu, cuda, ...")
    judge_url: str | None = _f(
        None, "check answers with an LLM judge at this OpenAI-compatible base URL instead of math-verify"
    )
    judge_model: str = _f("", "the judge's served model name")
    judge_with_question: bool = _f(
        False,
        "with --judge-url: show the judge the question as well as the reference and the candidate's answer, as the "
        "paper's authors' judge does (their aca/judge_client.py), for results comparable with theirs; by default "
        "the judge sees the two answers alone",
    )
    api_key_env: str | None = _f(
        None,
        "with --judge-url: the NAME of an environment variable holding the judge's API key, sent as "
        "'Authorization: Bearer' (e.g. --api-key-env OPENAI_API_KEY); without it no key is sent",
    )
    check_timeout: float = _f(10.0, "math-verify: seconds per check before it counts as failed")
    on_error: str = _f(
        "fail",
        "a bad pool record: fail (stop, listing every problem) or skip (leave it out, write it to "
        "POOL_FILE.rejects.jsonl, e.g. math.jsonl.rejects.jsonl, and count it in the results)",
        choices=("fail", "skip"),
    )

    def __post_init__(self):
        bad = []  # required flags and fixed choices: checked by config_from_args (options.field_problems)
        if not 0 < self.val_fraction < 1:
            bad.append(f"--val-fraction must be in (0, 1), got {self.val_fraction}")
        bad += self.scoring_problems()
        if not (math.isfinite(self.check_timeout) and self.check_timeout > 0):
            bad.append(f"--check-timeout must be a number of seconds > 0, got {self.check_timeout}")
        if self.judge_url and not self.judge_model:
            bad.append("--judge-url needs --judge-model")
        if self.api_key_env and not self.judge_url:
            bad.append("--api-key-env is for --judge-url (only the judge talks HTTP)")
        if self.judge_with_question and not self.judge_url:
            bad.append("--judge-with-question is for --judge-url (math-verify compares the answers alone)")
        bad += api_key_problems(self.api_key_env)
        if bad:
            raise BetaPRMInputError("bad eval-bon configuration: " + "; ".join(bad))


def add_arguments(parser):
    add_config_args(parser, EvalBonConfig)


# Options that do not change the results (paths, batching, device, where the judge is
# served): left out of the settings recorded in --out. The model and the pool files
# enter as fingerprints of their contents.
NOT_RESULTS = {
    "pools",
    "model",
    "out",
    "plots",
    "device",
    "batch_size",
    "max_batch_tokens",
    "judge_url",
    "api_key_env",
}


def result_settings(cfg) -> dict:
    pools = {p.strip(): fingerprint(p.strip()) for p in cfg.pools.split(",") if p.strip()}
    return {
        "model": model_fingerprint(cfg.model) if cfg.model else None,
        "pools": pools,
        **settings_of(cfg, NOT_RESULTS),
    }


def run(args):
    cfg = config_from_args(EvalBonConfig, args)
    procs = processes()  # under torchrun: each process scores its share of the unscored pools
    paths = pool_paths(cfg)
    check_paths(
        [*(("--pools", p) for p in paths), ("--model", cfg.model), config_file_of(cfg)],
        [
            ("--out", cfg.out),
            *(("--pools (rejects)", rejects_path(p)) for p in paths if cfg.on_error == "skip"),
            *((f"--plots (best_of_n_{Path(p).stem}.png)", plot_path(cfg, p)) for p in paths if cfg.plots),
        ],
        [("--plots", cfg.plots)],
    )
    # A key goes to the judge only when --api-key-env names where it is.
    checker = (
        LLMJudge(
            cfg.judge_url,
            cfg.judge_model,
            api_key=read_api_key(cfg.api_key_env),
            with_question=cfg.judge_with_question,
        )
        if cfg.judge_url
        else AnswerChecker(timeout=cfg.check_timeout)
    )
    prm, kind = None, None
    results, curves = {}, {}
    read = []  # (path, loaded): every pool file read and checked before any scoring
    for path in paths:
        rejects = rejects_path(path) if procs.main else None  # one process writes them
        loaded = read_records(path, kind="pool", flag="--pools", on_error=cfg.on_error, rejects=rejects)
        records = loaded.records
        if loaded.n_rejected and procs.main:
            print(f"{path}: {loaded.n_rejected} bad pool records left out (see {rejects_path(path)})")
        if not records:
            raise BetaPRMInputError(
                f"--pools {path}: holds no usable pool records; fix: give a JSONL file with one pool (id, question, "
                "answer, candidates) per line"
            )
        for r in records:
            if r.get("answer") is None and not all("correct" in c for c in r["candidates"]):
                raise BetaPRMInputError(
                    f"{path}: record {r['id']!r} has no 'answer'; Best-of-N accuracy needs the reference answer, or "
                    "every candidate's judged 'correct' (what `betaprm convert --from authors-pool` writes)"
                )
        # The split hangs on the questions alone: refused before any scoring or answer check.
        questions = [SimpleNamespace(question=r["question"]) for r in records]
        # --skip-tuned: no split, every problem is tested.
        val, test = ([], questions) if cfg.skip_tuned else split_problems(questions, cfg.val_fraction, cfg.seed)
        if not test:
            raise _no_test_problems(cfg, path, len(records))
        unscored = not all("mu" in c for r in records for c in r["candidates"])
        if unscored and not cfg.model:
            raise BetaPRMInputError(
                f"{path}: candidates without mu/kappa/sigma; give --model to score them (or run betaprm score first)"
            )
        if not val and not cfg.skip_tuned:  # the pools are (or will be) scored: the tuned selectors would be missing
            raise _no_validation_problems(cfg, path, len(records))
        read.append((path, loaded))
    for path, loaded in read:
        if not all("mu" in c for r in loaded.records for c in r["candidates"]):
            if prm is None:
                prm, kind = _load(cfg)
                if procs.main:
                    print(f"{cfg.model} ({kind}) scores the pools that have no scores")
            # Under torchrun each process scores its share of each pool; rank 0 reports.
            _score_in_place(prm, loaded.records, cfg, path)
    if not procs.main:
        return 0
    for path, loaded in read:
        name, records = Path(path).stem, loaded.records
        before = checker.failed
        pools = check_pools(records, final_answer, checker.check_many, with_questions=cfg.judge_with_question)
        try:
            res = evaluate_pools(pools, cfg.val_fraction, cfg.seed, tune=not cfg.skip_tuned)
        except NoTestProblems:
            raise _no_test_problems(cfg, path, len(pools)) from None
        except NoValidationProblems:
            raise _no_validation_problems(cfg, path, len(pools)) from None
        res["answer_checks_failed"] = checker.failed - before
        res["pool_records_rejected"] = loaded.n_rejected
        res["candidates_truncated"] = sum("steps_scored" in c for r in records for c in r["candidates"])
        if res["candidates_truncated"]:
            print(
                f"{path}: {res['candidates_truncated']} candidates were scored on the steps that fit the model's "
                "positions only "
                "(steps_scored); selectors see those steps, so min, last and prod may favour them"
            )
        results[name] = res
        if cfg.plots:
            curves[name] = _curve(pools, res, cfg)
    checker.close()  # stops math-verify's worker processes (on an error above, the exit does)
    names = list(results)
    sel = [s for s in SELECTORS if all(s in results[n]["selectors"] for n in names)]
    gains = {
        s: sum(results[n]["selectors"][s]["acc"] - results[n]["selectors"]["single_pass"]["acc"] for n in names)
        / len(names)
        for s in sel
    }
    header = "| selector | " + " | ".join(names) + " | avg gain vs single pass |"
    print(header)
    print("|" + "---|" * (len(names) + 2))
    for s in sel:
        cells = [
            f"{100 * results[n]['selectors'][s]['acc']:.2f} [{100 * results[n]['selectors'][s]['ci'][0]:.1f}, "
            f"{100 * results[n]['selectors'][s]['ci'][1]:.1f}]"
            for n in names
        ]
        print(f"| {SELECTORS[s]} | " + " | ".join(cells) + f" | {100 * gains[s]:+.2f} |")
    for n in names:
        r = results[n]
        failed = {s: v["check_failed"] for s, v in r["selectors"].items() if v["check_failed"]}
        print(
            f"{n}: {r['n_test']} test / {r['n_val']} validation problems; {r['answer_checks_failed']} answer checks "
            "failed" + (f" (picks left out: {failed})" if failed else "")
        )
    if cfg.skip_tuned:
        print(f"--skip-tuned: {_tuned_names()} left out; every problem tested")
    out = {
        "benchmarks": results,
        "avg_gain_vs_single_pass": gains,
        "judge": cfg.judge_model if cfg.judge_url else "math-verify",
        # the kind of the model that scored pools here; None when every pool came scored
        "model_kind": kind,
    }
    if cfg.out:
        write_result(cfg.out, out, result_settings(cfg), {"model": cfg.model})
        discard_parts(scores_path(cfg.out))  # the scores kept for a resume: the results are written
    if cfg.plots:
        Path(cfg.plots).mkdir(parents=True, exist_ok=True)
        for p in paths:
            plots.best_of_n_curves(curves[Path(p).stem], plot_path(cfg, p))
    return 0


def _no_test_problems(cfg, path, n):
    return BetaPRMInputError(
        f"--pools {path}: all {n} problems fall in the validation split (--val-fraction {cfg.val_fraction}, --seed "
        f"{cfg.seed}), none is left to test on; fix: another --seed, a smaller --val-fraction, or more problems"
    )


def _tuned_names() -> str:
    return ", ".join(SELECTORS[s] for s in TUNED)


def _no_validation_problems(cfg, path, n):
    return BetaPRMInputError(
        f"--pools {path}: none of its {n} problems falls in the validation split (--val-fraction {cfg.val_fraction}, "
        f"--seed {cfg.seed}), so {_tuned_names()} cannot be tuned; fix: another --seed, a larger --val-fraction, or "
        "more problems; or --skip-tuned to leave those selectors out and test every problem"
    )


def pool_paths(cfg) -> list[str]:
    """--pools as a list. Results are keyed by each file's stem (the benchmark's name), so
    two pools with one stem would keep one benchmark's results: refused, naming both."""
    paths, seen = [p.strip() for p in cfg.pools.split(",") if p.strip()], {}
    for p in paths:
        stem = Path(p).stem
        if stem in seen:
            raise BetaPRMInputError(
                f"--pools: {seen[stem]} and {p} are both benchmark {stem!r} (results are named by the file name); "
                "fix: rename one of them, or give a pool once"
            )
        seen[stem] = p
    return paths


def plot_path(cfg, pool: str) -> Path:
    return Path(cfg.plots) / f"best_of_n_{Path(pool).stem}.png"


def _load(cfg):
    from ..model import load_prm

    return load_prm(cfg.model, process_device(cfg.device), dtype=cfg.dtype)


def _score_in_place(prm, records, cfg, path):
    """Add the scores to the candidates of ``records``. Under torchrun the processes share
    them, and only rank 0's records get them (the others have nothing more to do). With
    --out, the scores are kept for a resume until the results are written."""
    from ..scoring import pool_images, with_scores

    if prm.is_vision:
        traces = [(r["question"], c["steps"], pool_images(r, path)) for r in records for c in r["candidates"]]
    else:
        traces = [(r["question"], c["steps"]) for r in records for c in r["candidates"]]
    names = [f"{path}: record {r['id']!r} candidate {j}" for r in records for j in range(len(r["candidates"]))]
    keys = [f"{Path(path).stem}/{r['id']}/{j}" for r in records for j in range(len(r["candidates"]))]
    resume = (cfg.out, result_settings(cfg)) if cfg.out else None
    flat = cfg.score_with_progress(prm, traces, names, desc=f"scoring {Path(path).name}", resume=resume, keys=keys)
    if flat is None:
        return
    it = iter(flat)
    for r in records:
        r["candidates"] = [with_scores(c, next(it)) for c in r["candidates"]]


def _curve(pools, res, cfg):
    """Test accuracy of a few selectors on the first n candidates, n = 1..N."""
    n_max = min(len(p.answers) for p in pools)
    out = {}
    for n in range(1, n_max + 1):
        cut = [
            BonPool(p.id, p.question, p.answers[:n], p.correct[:n], p.scores[:n] if p.scores else None) for p in pools
        ]
        r = evaluate_pools(cut, cfg.val_fraction, cfg.seed, tune=not cfg.skip_tuned)["selectors"]
        for s in ("majority_vote", "mean", "rb", "weighted_vote", "oracle"):
            if s in r:
                out.setdefault(s, ([], []))
                out[s][0].append(n)
                out[s][1].append(r[s]["acc"])
    return out
