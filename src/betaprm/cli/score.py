"""betaprm score"""

from dataclasses import dataclass

from ..data.records import check_kind
from ..distributed import process_device, processes, shared_output
from ..errors import BetaPRMInputError
from ..hub import resolve_model
from ..options import opt
from ..provenance import (
    OutputOptions,
    check_paths,
    config_file_of,
    model_fingerprint,
    rejects_path,
    settings_of,
)
from .flags import add_config_args, config_from_args
from .scoring_options import ScoringOptions

HELP = "add mu, kappa and sigma per step to every candidate of a pool file (resumable)"
DESCRIPTION = """Score candidate pools with a trained BetaPRM (or a standard PRM, or a plain causal LM
scored zero-shot: its own Yes/No logits at each marker, kappa the constant 4.0).

Input: JSONL records with id, question and candidates (each {"steps": [...]}).
Output: the same records, each candidate with mu, kappa and sigma lists (one value per
step), appended to --output. Records whose id is already in --output are skipped, so
rerunning an interrupted command continues where it stopped; nothing is duplicated.
OUTPUT.meta.json records what made the records (the model's fingerprint); a rerun with
another model stops and says so; records without it are refused unless --adopt-output
takes them as this run's. OUTPUT.lock keeps a second process from writing the same
--output. --output and --rejects must not be the input or each other. A candidate
longer than the model's positions stops the run (--truncate error) or is scored on the
whole steps that fit and carries "steps_scored" (--truncate steps); a rerun with
--truncate steps continues the same output."""

# Options that do not change a record (batching, device, paths): left out of the settings
# a resumed --output must match. The model enters as its fingerprint, not its path.
# --truncate is not one either: a record scored whole is the same under both modes, and a
# cut one says so itself (steps_scored), so a rerun with --truncate steps after --truncate
# error stopped on a long candidate continues the same output.
NOT_RESULTS = {
    "model",
    "input",
    "output",
    "device",
    "on_error",
    "rejects",
    "trust_remote_code",
    "batch_size",
    "max_batch_tokens",
    "truncate",
}


@dataclass
class ScoreConfig(ScoringOptions, OutputOptions):
    model: str = opt(
        "",
        "a BetaPRM (betaprm train output), or a plain causal LM scored zero-shot (kappa then the constant 4.0: use "
        "mu): a folder, or a hub name OWNER/NAME[@REVISION]",
        required=True,
    )
    input: str = opt(
        "",
        "candidate pools: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT])",
        required=True,
    )
    output: str = opt("", "scored pools (JSONL, appended)", required=True)
    device: str = opt("auto", "auto (cuda when present), cpu, cuda, cuda:1, ...")
    on_error: str = opt(
        "fail", "fail: stop on any bad record; skip: leave it out and write it to --rejects", choices=("fail", "skip")
    )
    rejects: str | None = opt(None, "rejects file for --on-error skip (default: OUTPUT.rejects.jsonl)")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint")

    def __post_init__(self):
        # Required flags and fixed choices: checked by config_from_args (options.field_problems).
        bad = self.scoring_problems()
        if bad:
            raise BetaPRMInputError("; ".join(bad))


def add_arguments(parser):
    add_config_args(parser, ScoreConfig)


def run(args):
    from ..model import load_prm, model_kind
    from ..scoring import score_pool_file

    cfg = config_from_args(ScoreConfig, args)
    procs = processes()  # under torchrun: this process's share of the pools
    device = process_device(cfg.device)
    rejects = cfg.rejects or rejects_path(cfg.output)
    # Before the model loads: an output that is the input (or the rejects file) would be
    # cut, appended to or replaced by this run.
    check_paths(
        [("--input", cfg.input), ("--model", cfg.model), config_file_of(cfg)],
        [("--output", cfg.output), ("--rejects", rejects if cfg.on_error == "skip" else None)],
    )
    check_kind(cfg.input, "pool", "--input")  # a file of another kind: one line, before the model loads
    source = resolve_model(cfg.model)
    kind = model_kind(source)  # read from its files: a BetaPRM without its config stops before any output opens
    settings = {"model": model_fingerprint(source.path), **settings_of(cfg, NOT_RESULTS)}
    info = {"model": cfg.model, "model_kind": kind, "input": cfg.input}
    if source.is_hub:
        info["model_revision"] = source.revision
    if procs.main:
        print(f"{cfg.model} ({kind})" + (f", {procs.world} processes" if procs.world > 1 else ""))
    # Checked (and locked) before the model loads: a wrong resume stops at once.
    with shared_output(procs, cfg.output, settings, info, flag="--output", adopt=cfg.adopt_output):
        prm, _ = load_prm(source, device, cfg.trust_remote_code, dtype=cfg.dtype)
        s = score_pool_file(
            prm,
            cfg.input,
            cfg.output,
            batch_size=cfg.batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            truncate=cfg.truncate,
            on_error=cfg.on_error,
            rejects=rejects,
            procs=procs,
        )
    if not procs.main:
        return 0
    msg = (
        f"{cfg.input}: {s['records']} pools, {s['already_done']} already in {cfg.output}, {s['scored']} scored "
        f"({s['candidates']} candidates)"
    )
    if s["rejected"]:
        msg += f", {s['rejected']} rejected (see {rejects})"
    print(msg)
    return 0
