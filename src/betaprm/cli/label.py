"""betaprm label"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..answers import AnswerChecker, final_answer
from ..errors import BetaPRMInputError
from ..generation.factory import RUNTIME_SETTINGS, build_generator
from ..label import LabelItem, label_traces, read_traces
from ..options import opt as _f
from ..progress import ProgressOptions
from ..provenance import OutputOptions, check_paths, config_file_of, fingerprint, open_output, settings_of
from ..synth import SynthPolicy, World, WorldConfig, synth_answer, synth_is_correct
from .flags import add_config_args, config_from_args
from .problems import GenerationOptions

HELP = "make Monte Carlo counts (K of N per step) for traces of any domain with reference answers"
DESCRIPTION = """Label reasoning traces with Monte Carlo counts, so BetaPRM can be trained where
no count data exists.

Input (--input): JSONL with id, question, answer and either steps (one trace) or
candidates (a list of {"steps": [...]}; candidate j becomes record ID/j). For every step,
--n continuations are sampled from the prefix ending there (--backend transformers,
openai or vllm), their final answers checked against the reference with math-verify;
K_t counts the correct ones. A check that fails (math-verify error or timeout) is kept in
mc_failed and left out of N_t, never counted as wrong. Output: training records
(docs/design.md section 5), appended per trace; rerunning resumes. OUT.meta.json records the
settings that made the records (a rerun with other settings stops and names them);
OUT.lock keeps a second process out of --out.

--backend synth (no --input) labels traces of the chain-arithmetic world instead:
--n-problems problems, --traces-per-problem traces each, checked exactly."""


@dataclass
class LabelConfig(GenerationOptions, OutputOptions, ProgressOptions):
    input: str | None = _f(None, "JSONL traces to label (id, question, answer, steps or candidates)")
    out: str = _f("", "JSONL training records (appended; a rerun resumes)", required=True)
    failed: str | None = _f(None, "where traces whose answer checks all failed go (default: OUT.failed.jsonl)")
    n: int = _f(16, "continuations per step (N)")
    seed: int = _f(0, "sampling seed")
    chunk: int = _f(8, "traces per generation call")
    check_timeout: float = _f(10.0, "seconds one answer check may take before it counts as failed")
    n_problems: int = _f(100, "synth: chain-arithmetic problems to sample")
    traces_per_problem: int = _f(2, "synth: policy traces per problem")
    world_config: str | None = _f(None, "synth: chain-arithmetic world settings (JSON)")

    def __post_init__(self):
        bad = self.backend_problems()
        if not (math.isfinite(self.check_timeout) and self.check_timeout > 0):
            bad.append(f"--check-timeout must be a number of seconds > 0, got {self.check_timeout}")
        for name in ("n", "chunk", "n_problems", "traces_per_problem"):
            if getattr(self, name) < 1:
                bad.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.backend == "synth" and self.input:
            bad.append(
                "--backend synth labels chain-arithmetic traces it samples itself; give --backend "
                "transformers/openai/vllm for --input"
            )
        if self.backend != "synth" and not self.input:
            bad.append(f"--backend {self.backend} needs --input (the traces to label)")
        if bad:
            raise BetaPRMInputError("bad label configuration:\n  " + "\n  ".join(bad))


def add_arguments(parser):
    add_config_args(parser, LabelConfig)


# Options that do not change a record (paths, how many problems, how a server is reached,
# how requests are grouped): left out of the settings a resumed --out must match. The
# policy and the world's settings file enter as fingerprints of their contents.
NOT_RESULTS = {"input", "out", "failed", "chunk", "n_problems", "policy", "world_config"} | RUNTIME_SETTINGS


def result_settings(cfg) -> dict:
    """What makes --out's records: compared with OUT.meta.json when a run resumes."""
    return {
        "policy": fingerprint(cfg.policy) if cfg.policy else "",
        "world_config": fingerprint(cfg.world_config) if cfg.world_config else None,
        **settings_of(cfg, NOT_RESULTS),
    }


def run(args):
    cfg = config_from_args(LabelConfig, args)
    check_paths(
        [("--input", cfg.input), ("--policy", cfg.policy), ("--world-config", cfg.world_config), config_file_of(cfg)],
        [("--out", cfg.out), ("--failed", failed_path(cfg))],
    )
    # Checked (and locked) before the policy loads: a wrong resume stops at once.
    with open_output(
        cfg.out,
        result_settings(cfg),
        {"policy": cfg.policy, "input": cfg.input, "world_config": cfg.world_config},
        adopt=cfg.adopt_output,
    ):
        return _run(cfg)


def failed_path(cfg) -> str:
    return cfg.failed or str(Path(cfg.out).with_suffix("")) + ".failed.jsonl"


def _run(cfg):
    failed = failed_path(cfg)
    if cfg.backend == "synth":
        world = World(WorldConfig.from_json(cfg.world_config) if cfg.world_config else WorldConfig())
        sampler = SynthPolicy(world, seed=cfg.seed + 1)
        items = [
            LabelItem(f"{p.id}/{j}", p.question, t.steps, p.answer, p)
            for p in world.sample_problems(cfg.n_problems, cfg.seed, "label")
            for j, t in enumerate(sampler.sample_traces(p, cfg.traces_per_problem))
        ]
        generator = build_generator(cfg, seed=cfg.seed, world=world)
        answer_of = synth_answer

        def check_many(pairs):
            return [synth_is_correct(it, a) for it, a in pairs]
    else:
        items = read_traces(cfg.input)
        generator = build_generator(cfg, seed=cfg.seed)
        checker = AnswerChecker(timeout=cfg.check_timeout)
        answer_of = final_answer

        def check_many(pairs):
            return checker.check_many([(it.answer, a) for it, a in pairs])

    s = label_traces(items, generator, cfg.n, answer_of, check_many, cfg.out, failed, seed=cfg.seed, chunk=cfg.chunk)
    if cfg.backend != "synth":
        checker.close()  # stops math-verify's worker processes (on an error above, the exit does)
    msg = (
        f"{s['traces']} traces: {s['already_done']} already done, {s['labelled']} labelled into {cfg.out}, "
        f"{s['tokens']} tokens generated"
    )
    if s["failed_checks"]:
        msg += f"; {s['failed_checks']} answer checks failed (kept in mc_failed, left out of N)"
    if s["failed_traces"]:
        msg += f"; {s['failed_traces']} traces had no checkable count and went to {failed}"
    print(msg)
    return 0
