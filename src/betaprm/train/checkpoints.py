"""The training checkpoint format: the full model state in safetensors (``save_state``,
``read_state``, ``load_state``), and the run record (``betaprm_run.json``) every checkpoint
holds, which a resume must match; the checks before a run writes into ``--output-dir``."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from ..errors import BetaPRMInputError
from ..model import CONFIG_NAME
from ..provenance import (
    check_paths,
    config_file_of,
    differences,
    fingerprint,
    model_fingerprint,
    resolved,
    same_path,
    settings_of,
)
from .config import BEST_METRICS, TrainConfig, uses_batch_rebalance

logger = logging.getLogger(__name__)

STATE_NAME = "model.safetensors"
"""A checkpoint's model state (the Trainer's pickled weights are not used)."""


def save_state(state_dict: dict, path) -> None:
    """Safetensors of a full state dict; tensors that share storage (tied embeddings)
    are written once and recorded as aliases."""
    seen, out, aliases = {}, {}, {}
    for k, v in state_dict.items():
        key = (v.device, v.data_ptr(), tuple(v.shape), tuple(v.stride())) if v.numel() else None
        if key is not None and key in seen:
            aliases[k] = seen[key]
            continue
        if key is not None:
            seen[key] = k
        out[k] = v.detach().to("cpu").contiguous()
    save_file(out, str(path), metadata={"format": "pt", "betaprm_aliases": json.dumps(aliases)})


def read_state(path) -> dict:
    """The full state dict ``save_state`` wrote, aliases restored."""
    with safe_open(str(path), framework="pt") as f:
        aliases = json.loads((f.metadata() or {}).get("betaprm_aliases", "{}"))
    sd = load_file(str(path))
    for k, src in aliases.items():
        sd[k] = sd[src]
    return sd


def load_state(model: nn.Module, path, sharded: bool = False) -> None:
    """Load a full state dict into ``model``; ``sharded``: an FSDP model, whose parameters
    are shards (DTensors), filled through torch's distributed state-dict API."""
    sd = read_state(path)
    if sharded:
        # FSDP only: torch.distributed.checkpoint is not loaded by other runs.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=True))
    else:
        model.load_state_dict(sd, strict=True)


RUN_NAME = "betaprm_run.json"
"""Written into every checkpoint: the run's settings, which a resume must match."""

# TrainConfig fields that do not change the trained model (logging, saving, paths,
# devices, how a global batch is split into micro-batches): left out of the settings a
# resume must match. The data and the starting model enter as fingerprints of their contents.
NOT_RESULTS = {
    "model",
    "data",
    "output_dir",
    "logging_steps",
    "save_steps",
    "save_total_limit",
    "plots",
    "report_to",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "push_to_hub",
    "hub_private",
    "license",
    "on_error",
    "rejects",
    "trust_remote_code",
    "dataloader_num_workers",
    "use_cpu",
    "ddp_backend",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",  # the global batch it makes is recorded
    "optim",  # AdamW either way (fused or not)
    "attn_implementation",
    "run_name",
    "bf16",  # --precision says it
    "fp16",
    "gradient_checkpointing",
    "packing",
    # evaluation while training reads the model, it does not change it (--eval-fraction does:
    # it takes problems out of the training data, so it is recorded)
    "eval_data",
    "eval_steps",
    "metric_for_best_model",
    "load_best_model_at_end",
}

# Settings renamed since: a run record that has the old name resumes under the new one.
RENAMED = {"max_tokens_per_batch": "max_batch_tokens", "truncation": "truncate"}
RENAMED_VALUES = {("truncate", "keep-steps"): "steps"}


EVAL_KEYS = ("eval_data", "metric_for_best_model", "greater_is_better")
"""The evaluation settings a resume must match (recorded only when the run evaluates): the
checkpoint's best metric was measured on that data, by that metric, in that direction."""


def run_record(cfg: TrainConfig, plan=None) -> dict:
    """The run's settings (data and starting model by fingerprint, the hyperparameters
    that change the result, and with held-out evaluation (``plan``, an ``EvalPlan``) its data
    by fingerprint, metric and direction) and, for messages only, where the data and model
    came from."""
    settings = {"data": fingerprint(cfg.data), "model": model_fingerprint(cfg.model), **settings_of(cfg, NOT_RESULTS)}
    if plan is not None:
        settings["eval_data"] = fingerprint(cfg.eval_data) if cfg.eval_data else None  # --eval-fraction: recorded
        settings["metric_for_best_model"] = f"eval_{plan.metric}"
        settings["greater_is_better"] = BEST_METRICS[plan.metric]
    # Recorded only when not the default: older checkpoints, without them, still resume.
    for name, default in (
        ("max_batch_tokens", 0),
        ("freeze_layers", 0),
        ("step_weights", "batch"),
        ("max_grad_norm", 1.0),
        ("eval_fraction", 0),
    ):
        if getattr(cfg, name) == default:
            del settings[name]
    # Whether the rebalancing sampler orders the batches (the flag is moot under grouping or a
    # token budget): recorded only when it does, so a checkpoint from before it existed (random
    # order) resumes only with --no-batch-rebalance, in its own order.
    if not uses_batch_rebalance(cfg):
        del settings["batch_rebalance"]
    return {"settings": json.loads(json.dumps(settings)), "info": {"data": cfg.data, "model": cfg.model}}


SUMMARY_NAME = "train_summary.json"


def rejects_of(cfg: TrainConfig) -> str:
    """Where the run writes the records it rejects: ``--rejects``, else ``OUTPUT_DIR/rejects.jsonl``."""
    return cfg.rejects or str(Path(cfg.output_dir) / "rejects.jsonl")


def _inside(path, folder) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (resolved: links and ``..`` followed)."""
    p, f = resolved(Path(str(path))), resolved(Path(str(folder)))
    return p == f or p.is_relative_to(f)


def check_train_paths(cfg: TrainConfig) -> None:
    """Everything a training run writes or deletes, checked against everything it reads,
    before any of it happens.

    Writes: the final model and ``train_summary.json`` in ``--output-dir``, its
    ``checkpoint-*`` folders, the rejects file, the plots. Deletes: the Trainer's rotation
    removes this run's older ``checkpoint-*``; ``--overwrite-output-dir`` removes an earlier
    run's checkpoints, BetaPRM config and summary. Reads: ``--model`` (a folder),
    ``--data``, ``--eval-data``, ``--config``. Nothing read may be deleted or written over: a model
    continued in its own folder with ``--overwrite-output-dir`` would lose its BetaPRM config
    before it is read, and a data file that is the default rejects file would become its
    own rejected lines."""
    out = Path(cfg.output_dir)
    inputs = [("--data", cfg.data), ("--eval-data", cfg.eval_data), config_file_of(cfg)]
    model = Path(str(cfg.model)).expanduser()
    local_model = model.exists()
    if local_model:
        inputs.append(("--model", str(model)))
    rejects_flag = "--rejects" if cfg.rejects else "--rejects (default: OUTPUT_DIR/rejects.jsonl)"
    # Deleted by this run: with --overwrite-output-dir the earlier run's files, and always the
    # checkpoints the rotation drops.
    deleted = [out / "checkpoint-*"]
    if cfg.overwrite_output_dir:
        deleted += [out / CONFIG_NAME, out / SUMMARY_NAME]
    for flag, path in inputs:
        if not path:
            continue
        try:
            under_ckpt = resolved(Path(str(path))).relative_to(resolved(out)).parts[0].startswith("checkpoint-")
        except (ValueError, IndexError):  # not under --output-dir, or --output-dir itself
            under_ckpt = False
        if under_ckpt:
            raise BetaPRMInputError(
                f"{flag} {path}: lies in a checkpoint folder of --output-dir {out}, which this run's checkpoint "
                f"rotation (or --overwrite-output-dir) deletes; fix: copy it elsewhere first, or give another "
                "--output-dir"
            )
        if cfg.overwrite_output_dir and any(same_path(path, d) or _inside(d, path) for d in deleted[1:]):
            raise BetaPRMInputError(
                f"{flag} {path}: --overwrite-output-dir would delete the earlier run's files in --output-dir {out} "
                f"({CONFIG_NAME}, {SUMMARY_NAME}, checkpoints) and write over the model there, which this run reads "
                f"as {flag}; nothing was changed; fix: write the continued model to another --output-dir"
            )
    check_paths(
        inputs=inputs,
        outputs=[
            (rejects_flag, rejects_of(cfg)),
            (f"--output-dir ({SUMMARY_NAME})", out / SUMMARY_NAME),
            *([("--plots (kappa_dynamics.png)", Path(cfg.plots) / "kappa_dynamics.png")] if cfg.plots else []),
        ],
        folders=[("--output-dir", str(out)), ("--plots", cfg.plots)],
    )


def refuse_used_output_dir(cfg: TrainConfig, rank: int) -> None:
    """A new run in a directory that holds files stops, unless told to overwrite: the
    Trainer's rotation would delete the earlier run's checkpoints and the final save
    overwrite its model. With --overwrite-output-dir the earlier checkpoints go first, so
    rotation and `--resume-from-checkpoint last` never mix two runs' checkpoints."""
    out = Path(cfg.output_dir)
    if cfg.resume_from_checkpoint or not out.is_dir():
        return
    # rejects.jsonl: with several processes, rank 0 may write this run's before another rank looks.
    used = sorted(p.name for p in out.iterdir() if p.name != "rejects.jsonl")
    if not used:
        return
    if not cfg.overwrite_output_dir:
        shown = ", ".join(used[:4]) + (f" and {len(used) - 4} more" if len(used) > 4 else "")
        raise BetaPRMInputError(
            f"--output-dir {out} is not empty ({shown}): a new run there would delete the earlier run's checkpoints "
            "and overwrite "
            "its model. Continue that run with --resume-from-checkpoint last, choose another --output-dir, or pass "
            "--overwrite-output-dir to start anew there"
        )
    if rank == 0:
        for old in out.glob("checkpoint-*"):
            shutil.rmtree(old)
        # Without its BetaPRM config the earlier final model no longer loads, so a run of
        # this one that stops early cannot leave the directory looking like a finished model.
        for name in (CONFIG_NAME, SUMMARY_NAME):
            (out / name).unlink(missing_ok=True)


def check_resume(resume: str, record: dict, say=logger.warning) -> None:
    """Stop when the checkpoint's run had other data or hyperparameters: its optimiser
    state and schedule would go on under settings they were not made for."""
    if not Path(resume).is_dir():
        raise BetaPRMInputError(f"--resume-from-checkpoint {resume}: no such checkpoint directory")
    path = Path(resume) / RUN_NAME
    if not path.is_file():
        say(
            f"{resume}: no {RUN_NAME} (a checkpoint from before runs recorded their settings): resuming without "
            "checking data and hyperparameters"
        )
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
        if (
            not isinstance(old, dict)
            or not isinstance(old.get("settings"), dict)
            or not isinstance(old.get("info", {}), dict)
        ):
            raise TypeError("settings and info must be objects")
        settings = {RENAMED.get(k, k): v for k, v in old["settings"].items()}
        settings = {k: RENAMED_VALUES.get((k, v), v) if isinstance(v, str) else v for k, v in settings.items()}
        new = record["settings"]
        if not (any(k in settings for k in EVAL_KEYS) and any(k in new for k in EVAL_KEYS)):
            # Compared when both runs evaluate: a checkpoint from before runs recorded their
            # evaluation, or a run that did not evaluate (its best metric unset), or a resume
            # that stops evaluating (no best metric is compared), has nothing to mismatch.
            settings = {k: v for k, v in settings.items() if k not in EVAL_KEYS}
            new = {k: v for k, v in new.items() if k not in EVAL_KEYS}
        diff = differences(settings, new, old.get("info"), record["info"])
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise BetaPRMInputError(
            f"{path}: not a betaprm run record; remove it to resume without checking the settings"
        ) from None
    if diff:
        raise BetaPRMInputError(
            f"--resume-from-checkpoint {resume}: the checkpoint's run had other settings (recorded in {path}):\n  "
            + "\n  ".join(diff)
            + "\nresume with the checkpoint's settings, or start a new run in another --output-dir (or here with "
            "--overwrite-output-dir, "
            "which deletes these checkpoints)"
        )


class RunRecorder(TrainerCallback):
    """A callback that writes ``record`` into every checkpoint it saves."""

    def __init__(self, record: dict):
        self.record = record

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            (folder / RUN_NAME).write_text(json.dumps(self.record, indent=2) + "\n")


def last_checkpoint(output_dir: str) -> str:
    last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    if last is None:
        raise BetaPRMInputError(f"--resume-from-checkpoint last: no checkpoint-* folder in {output_dir}")
    return last
