"""What comes after a run's last step: the model card's facts, the upload to the hub, and
the end of a multi-process run's process group."""

from __future__ import annotations

import shlex
from pathlib import Path

import torch.distributed as dist

from ..card import license_of
from ..data.sources import reads_with_datasets
from ..errors import BetaPRMInputError
from ..hub import repo_id_problem, resolve_model
from .config import TrainConfig


def card_of(cfg: TrainConfig, record: dict) -> dict:
    """The model card's settings for the final model (``betaprm.card.model_card``): its hub
    name (None: the card names the output folder), licence (``--license``, else the base
    model's card's), training data (its fingerprint from the run ``record``) and the packages
    the run used besides those every card names (peft for LoRA, datasets for data it read)."""
    used = ["peft"] if cfg.lora_r > 0 else []
    if any(reads_with_datasets(d) for d in (cfg.data, cfg.eval_data) if d):
        used.append("datasets")
    return {
        "name": cfg.push_to_hub,
        "license": cfg.license or license_of(resolve_model(cfg.model).path),
        "data": {"name": cfg.data, "fingerprint": record["settings"]["data"]},
        "frameworks": used,
    }


def training_hyperparameters(cfg: TrainConfig, args, world: int) -> dict:
    """The model card's training hyperparameters, under the names a ``transformers.Trainer``
    card gives them where it has them (learning_rate, train_batch_size, total_train_batch_size,
    optimizer, lr_scheduler_type, ...), then betaprm's own (objective, kappa_min, ...); the
    settings a run left at "off" are left out. ``args``: the run's ``TrainingArguments``."""
    optim = getattr(args.optim, "value", args.optim)
    batch = f"token budget {cfg.max_batch_tokens}" if cfg.max_batch_tokens else cfg.per_device_train_batch_size
    h = {
        "learning_rate": cfg.learning_rate,
        "kappa_head_learning_rate": cfg.learning_rate * cfg.head_lr_multiplier,
        "train_batch_size": batch,
        "seed": cfg.seed,
        "num_devices": world,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "total_train_batch_size": cfg.global_batch_size,
        "optimizer": f"{optim} with betas=({args.adam_beta1}, {args.adam_beta2}), epsilon={args.adam_epsilon} and "
        f"weight_decay={cfg.weight_decay} (none on biases, norms and the kappa head)",
        "lr_scheduler_type": cfg.lr_scheduler_type,
        **(
            {"lr_scheduler_warmup_steps": cfg.warmup_steps}
            if cfg.warmup_steps
            else {"lr_scheduler_warmup_ratio": cfg.warmup_ratio}
        ),
        **({"training_steps": cfg.max_steps} if cfg.max_steps > 0 else {"num_epochs": cfg.num_train_epochs}),
        "mixed_precision_training": "bf16" if args.bf16 else "no (fp32)",
        "max_grad_norm": cfg.max_grad_norm,
        "loss": cfg.objective,
        "lambda_reg": cfg.lambda_reg if cfg.objective == "beta-binomial" else None,
        "hard_threshold": cfg.hard_threshold if cfg.objective == "hard-ce" else None,
        "aux_lm_weight": cfg.aux_lm_weight or None,
        "kappa_init": cfg.kappa_init,
        "kappa_min": cfg.kappa_min,
        "kappa_head": getattr(cfg, "kappa_head", None),
        "max_length": cfg.max_length,
        "truncate": cfg.truncate,
        "packing": cfg.packing,
        "step_weights": cfg.step_weights,
        "freeze_layers": cfg.freeze_layers or None,
        **(
            {
                "lora_r": cfg.lora_r,
                "lora_alpha": cfg.lora_alpha,
                "lora_dropout": cfg.lora_dropout,
                "lora_target_modules": cfg.lora_target_modules,
            }
            if cfg.lora_r > 0
            else {}
        ),
    }
    return {k: v for k, v in h.items() if v is not None}


def end_process_group() -> None:
    """Close the process group a multi-process run opened (torchrun, accelerate launch), all
    ranks together. Left to interpreter exit, gloo's threads can be torn down while still
    joinable and abort a process that has finished its work (SIGABRT, "terminate called
    without an active exception"), which the launcher reports as a failed run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


HUB_FILES = [
    "*.safetensors",  # the backbone's weights (one file or shards) and the kappa head
    "model.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "betaprm_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "*.py",  # a trust_remote_code backbone's own modelling code
    "README.md",
]
"""What --push-to-hub uploads from --output-dir (top-level files only): the model's weights
and configs, its tokenizer and processor files, and the model card. Nothing else leaves:
not the checkpoint-* folders, logs, plots or rejected records, nor train_summary.json, which
holds the run's local paths (the card carries the data's fingerprint and the evaluation
results)."""
HUB_NOT_FILES = ["*/*"]  # huggingface_hub's patterns match across "/": subfolders kept out


def hub_files(folder) -> list[str]:
    """The files of ``folder`` that --push-to-hub uploads, relative to it: ``HUB_FILES``
    matched by huggingface_hub's own filter, as ``upload_folder`` matches them."""
    from huggingface_hub.utils import filter_repo_objects  # the hub client: loaded only for an upload

    root = Path(folder)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return list(filter_repo_objects(files, allow_patterns=HUB_FILES, ignore_patterns=HUB_NOT_FILES))


def upload_command(folder, repo_id: str) -> str:
    """The ``hf upload`` command that sends what --push-to-hub would (``HUB_FILES``)."""
    include = " ".join(f"--include {shlex.quote(p)}" for p in HUB_FILES)
    return f"hf upload {repo_id} {shlex.quote(str(folder))} . {include} --exclude {shlex.quote(HUB_NOT_FILES[0])}"


def open_hub_repo(repo_id: str, private: bool = False) -> str:
    """Create (or find) the --push-to-hub repository before training, so that a run that
    could not upload stops at its start, not after training: offline, without a token, or
    refused by the hub, it is an input error. Returns the repository's URL."""
    from huggingface_hub import HfApi, constants, get_token  # the hub client: loaded only for an upload

    where = f"--push-to-hub {repo_id}"
    if bad := repo_id_problem(repo_id):
        raise BetaPRMInputError(bad)
    if constants.HF_HUB_OFFLINE:
        raise BetaPRMInputError(
            f"{where}: HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it, or train without --push-to-hub "
            "and upload the model later with `hf upload`"
        )
    if get_token() is None:
        raise BetaPRMInputError(f"{where}: no Hugging Face token; log in (`hf auth login`) or set HF_TOKEN")
    try:
        return str(HfApi().create_repo(repo_id, private=private, exist_ok=True))
    except Exception as e:  # network, authentication, permissions, a name the hub refuses
        raise BetaPRMInputError(
            f"{where}: the hub did not create or open the repository ({_reason(e)}); check the network, the name "
            "and that your token may write there"
        ) from None


def _reason(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def push_to_hub(folder, repo_id: str, private: bool = False) -> str:
    """Upload the final BetaPRM's files (``HUB_FILES``) from ``folder`` to ``repo_id``
    through ``huggingface_hub``, creating the repository when missing; returns its URL."""
    from huggingface_hub import HfApi  # the hub client: loaded only for an upload

    if bad := repo_id_problem(repo_id):  # refused here, never offered in the `hf upload` command below
        raise BetaPRMInputError(bad)
    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            allow_patterns=HUB_FILES,
            ignore_patterns=HUB_NOT_FILES,
            commit_message="betaprm train: final BetaPRM",
        )
    except Exception as e:  # network, authentication, permissions: the model is saved locally either way
        raise BetaPRMInputError(
            f"--push-to-hub {repo_id}: the upload failed ({_reason(e)}); the model is saved in {folder}: log in "
            f"(`hf auth login` or HF_TOKEN) and upload it with `{upload_command(folder, repo_id)}`"
        ) from None
    return str(url)
