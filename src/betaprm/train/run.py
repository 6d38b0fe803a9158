"""``train``: a BetaPRM (or the standard soft-label PRM) trained with ``PRMTrainer`` from
counts records, and its building blocks (the model to start from, frozen layers, LoRA,
token-budget batches, the model card, the upload). Checkpoints hold the full model state in
safetensors plus the Trainer's optimiser, scheduler, RNG and data position, so
``resume_from_checkpoint`` continues exactly; the final model is a BetaPRM directory.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn
from transformers import TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..batching import pad_id
from ..data.records import read_records
from ..errors import BetaPRMInputError
from ..evaluation.plots import kappa_dynamics
from ..hub import resolve_model
from ..model import BetaPRM, model_kind
from ..progress import progress_bar
from ..provenance import version
from ..scoring import max_positions
from ..vision import freeze_vision
from .checkpoints import (
    RunRecorder,
    check_resume,
    check_train_paths,
    last_checkpoint,
    refuse_used_output_dir,
    rejects_of,
    run_record,
)
from .checks import batch_warnings, check_trackers
from .config import TrainConfig, resolve_global_batch, uses_batch_rebalance
from .dataset import CountsCollator, TokenBudgetBatchSampler, encode_records
from .evaluate import card_results, eval_summary, plan_evaluation, undefined_metric_warning
from .finish import card_of, open_hub_repo, push_to_hub, training_hyperparameters
from .trainer import PRMTrainer

logger = logging.getLogger(__name__)


def load_or_create(cfg: TrainConfig):
    """A BetaPRM from a BetaPRM checkpoint or a plain causal LM (new head)."""
    # A folder or a hub name (resolved through the hub cache; a path that is not on disk is
    # an error, never a hub request). A BetaPRM, however named, continues as the BetaPRM it is.
    source = resolve_model(cfg.model)
    if model_kind(source) != "zero-shot":
        return BetaPRM.from_pretrained(
            source.path, trust_remote_code=cfg.trust_remote_code, attn_implementation=cfg.attn_implementation
        )
    # A folder without weights, damaged files or a partial snapshot are refused inside, as
    # for every other command.
    return BetaPRM.from_backbone(
        source,
        marker=cfg.marker,
        reward_tokens=cfg.reward_words,
        kappa_init=cfg.kappa_init,
        kappa_min=cfg.kappa_min,
        kappa_head=cfg.kappa_head,
        chat_template=cfg.chat_template,
        marker_repeat=cfg.marker_repeat,
        trust_remote_code=cfg.trust_remote_code,
        attn_implementation=cfg.attn_implementation,
    )


def freeze_bottom(prm, n: int) -> int:
    """Freeze the input embeddings and the bottom ``n`` decoder layers of ``prm``'s
    backbone (``--freeze-layers``); returns the number of decoder layers. With nothing
    below them left to train, autograd runs no backward pass through the frozen layers.
    A backbone whose output head is tied to its input embeddings keeps that head frozen
    too (the reward words' rows included): the layers above learn to read it."""
    dec = prm._decoder()
    layers = getattr(dec, "layers", None)
    if layers is None:
        layers = getattr(getattr(dec, "language_model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise BetaPRMInputError(
            f"--freeze-layers: cannot find the decoder layers of {type(prm.backbone).__name__} (no .layers list); "
            "train without it, or with --lora-r"
        )
    if n > len(layers):
        raise BetaPRMInputError(
            f"--freeze-layers {n}: the backbone has {len(layers)} decoder layers; freeze at most {len(layers)}"
        )
    prm.backbone.get_input_embeddings().requires_grad_(False)
    for layer in layers[:n]:
        layer.requires_grad_(False)
    return len(layers)


def apply_lora(prm, cfg: TrainConfig) -> None:
    """Wrap the backbone with LoRA adapters; the kappa head and the marker's embedding
    row stay trainable (peft's trainable_token_indices trains that one row only)."""
    try:  # optional dependency: only --lora-r needs it
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise BetaPRMInputError("--lora-r needs peft: `pip install peft`") from None
    targets = cfg.lora_target_modules
    lcfg = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules="all-linear"
        if targets == "all-linear"
        else [t.strip() for t in targets.split(",") if t.strip()],
        trainable_token_indices=[prm.config.marker_id],
    )
    prm.backbone = get_peft_model(prm.backbone, lcfg)
    for p in prm.kappa_head.parameters():
        p.requires_grad_(True)


def _precision(cfg: TrainConfig) -> bool:
    if cfg.precision == "bf16":
        return True
    if cfg.precision == "fp32":
        return False
    return (not cfg.use_cpu) and torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def _grad_accum(cfg: TrainConfig, world: int) -> int:
    per_step = cfg.per_device_train_batch_size * world
    if cfg.global_batch_size % per_step:
        raise BetaPRMInputError(
            f"--global-batch-size {cfg.global_batch_size} is not a multiple of per-device batch "
            f"{cfg.per_device_train_batch_size} x {world} devices = {per_step}; change one of them"
        )
    return cfg.global_batch_size // per_step


def _fixed_counts(dataset, marker_id: int, traces: float) -> tuple[float, float]:
    """``--step-weights data``: the scored steps and auxiliary-LM tokens (next tokens that
    are not markers) of ``traces`` average traces of ``dataset``."""
    steps = sum(len(e["mc_total"]) for e in dataset.examples) / len(dataset)
    tokens = sum(sum(1 for t in e["input_ids"][1:] if t != marker_id) for e in dataset.examples) / len(dataset)
    return steps * traces, tokens * traces


def _token_batches(cfg: TrainConfig, dataset, packing: bool, world: int, say):
    """The token-budget batches (``--max-batch-tokens``) and the accumulation steps
    that reach ``--global-batch-size`` traces per optimiser step on average."""
    lengths = dataset.lengths()
    sampler = TokenBudgetBatchSampler(
        lengths,
        cfg.max_batch_tokens,
        packed=packing,
        seed=cfg.seed,
        group=50 if cfg.group_by_length else None,
        world=world,
    )
    batches = sampler.all_batches()
    per_batch = len(lengths) / len(batches)
    grad_accum = max(1, round(cfg.global_batch_size / (per_batch * world)))
    over = sum(1 for n in lengths if n > cfg.max_batch_tokens)
    say(
        f"token budget {cfg.max_batch_tokens} per forward pass: {len(batches)} batches of {per_batch:.1f} traces "
        f"on average; {grad_accum} accumulation steps x {world} device(s) make about "
        f"{grad_accum * world * per_batch:.0f} traces per optimiser step (--global-batch-size {cfg.global_batch_size})"
        + (f"; {over} traces longer than the budget go one per batch" if over else "")
    )
    return sampler, grad_accum


def hard_label_warning(records, objective: str, data: str) -> str | None:
    """The warning for beta-binomial training on hard labels only (every N = 1), else None.

    With N = 1 the Beta-Binomial likelihood is P(K = 1) = mu whatever kappa is, so only the
    evidence regulariser reaches kappa, and it only pulls kappa down."""
    if objective != "beta-binomial" or any(n != 1 for r in records for n in r.mc_total):
        return None
    return (
        f"every step in {data} has N = 1 (hard labels, e.g. converted Math-Shepherd, PRM800K or boolean TRL data): "
        "the Beta-Binomial likelihood of a single outcome does not depend on kappa, so kappa learns nothing about "
        "reliability (only the evidence regulariser reaches it, pulling it down) and mu trains as with hard-ce. "
        "Use --objective soft-ce or hard-ce for a standard PRM, or make counts with `betaprm label` (N > 1 "
        "continuations per step) to train a BetaPRM."
    )


def train(cfg: TrainConfig, log=None, quiet: bool = False, callbacks=None):
    """Run training; returns ``(prm, trainer, encode_stats)``. The final BetaPRM is
    written to ``cfg.output_dir``. ``quiet`` drops the Trainer's progress bar and printed
    logs (the log history is kept); ``callbacks``: extra ``transformers.TrainerCallback``s
    (e.g. an evaluation every few steps), added to the Trainer's own."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    say = (log or logger.info) if rank == 0 else (lambda *a, **k: None)
    cfg = resolve_global_batch(cfg, world)  # --gradient-accumulation-steps given: the global batch it makes
    grad_accum = _grad_accum(cfg, world) if not cfg.max_batch_tokens else None  # token budget: set below
    set_seed(cfg.seed)
    check_train_paths(cfg)  # nothing it reads is written over or deleted; everything it writes can be
    check_trackers(cfg.report_to)  # an unknown or missing tracker stops now, not after the model loads
    if cfg.push_to_hub and rank == 0:  # a run that could not upload stops now, not after training
        say(f"--push-to-hub: the repository {open_hub_repo(cfg.push_to_hub, cfg.hub_private)} is ready")
    refuse_used_output_dir(cfg, rank)  # before this run writes anything there
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rejects = rejects_of(cfg)
    loaded = read_records(
        cfg.data,
        kind="counts",
        marker=cfg.marker,
        on_error=cfg.on_error,
        rejects=rejects if rank == 0 else None,
        flag="--data",
    )
    say(loaded.summary() + (f" (rejects in {rejects})" if loaded.n_rejected else ""))
    if not loaded.records:
        raise BetaPRMInputError(f"{cfg.data}: no usable records")
    records, plan = plan_evaluation(cfg, loaded.records, say)  # --eval-fraction / --eval-data
    hard = hard_label_warning(records, cfg.objective, cfg.data)
    if hard and rank == 0:
        logger.warning(hard)
    record = run_record(cfg, plan)
    resume = last_checkpoint(cfg.output_dir) if cfg.resume_from_checkpoint == "last" else cfg.resume_from_checkpoint
    if resume:
        check_resume(resume, record, say)  # before the model loads: a wrong resume stops at once

    prm = load_or_create(cfg)
    cfg = cfg.fitted_to(max_positions(prm))  # one length rule for training, held-out data and scoring
    prm.config.objective = cfg.objective  # saved in betaprm_config.json: how the model scores (model_kind)
    card = card_of(cfg, record)  # before training: nothing after it can fail to build the card
    if any(r.images for r in records) and getattr(prm, "processor", None) is None:
        raise BetaPRMInputError(
            f"{cfg.data}: records with images need a vision-language backbone (Qwen2.5-VL, InternVL, ...); "
            f"{cfg.model} is text-only"
        )
    if getattr(prm, "processor", None) is not None:
        n_frozen = freeze_vision(prm.backbone, cfg.train_vision)
        say(
            "vision-language backbone: "
            f"{'vision encoder trains too' if cfg.train_vision else f'vision encoder frozen ({n_frozen} tensors)'}"
        )
    if cfg.objective != "beta-binomial":
        # The standard PRM has no reliability channel: keep kappa at its initial value
        # (and out of the graph, so DDP sees no unused trainable parameters).
        prm.kappa_head.requires_grad_(False)
    if cfg.freeze_layers:
        n_layers = freeze_bottom(prm, cfg.freeze_layers)
        say(f"frozen: the input embeddings and decoder layers 1-{cfg.freeze_layers} of {n_layers}")
    if cfg.lora_r > 0:
        if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true" or os.environ.get("ACCELERATE_USE_FSDP") == "true":
            raise BetaPRMInputError(
                "--lora-r with DeepSpeed or FSDP is not supported yet (the adapters could not be merged into sharded "
                "weights); use one or the other"
            )
        apply_lora(prm, cfg)
    if cfg.gradient_checkpointing:
        prm.backbone.gradient_checkpointing_enable()
        prm.backbone.config.use_cache = False

    with progress_bar(len(records), "tokenising", "rec", disable=rank != 0 or quiet or cfg.disable_tqdm) as bar:
        dataset = encode_records(prm, records, cfg.max_length, cfg.truncate, progress=bar.update)
    say(dataset.stats.describe(cfg.max_length))
    if len(dataset) == 0:
        raise BetaPRMInputError(f"no record fits --max-length {cfg.max_length}; raise it")
    for warning in batch_warnings(cfg, len(dataset), world) if rank == 0 else ():
        logger.warning(warning)  # a global batch larger than the data, a warmup that never ends, ...

    packing = cfg.packing and getattr(prm, "processor", None) is None
    if cfg.packing and not packing:
        say("packing: off (vision-language batches keep padding)")
    held_out = plan.held_out(prm, cfg, packing, say) if plan else None
    token_batches = None
    if cfg.max_batch_tokens:
        token_batches, grad_accum = _token_batches(cfg, dataset, packing, world, say)
    fixed_counts = None
    if cfg.step_weights == "data":
        if not hasattr(dataset, "examples"):
            raise BetaPRMInputError("--step-weights data is for text PRMs; vision-language training keeps batch")
        per_device = cfg.global_batch_size / world
        fixed_counts = _fixed_counts(dataset, prm.config.marker_id, per_device)
        say(
            f"step weights: each optimiser step's losses summed over {fixed_counts[0]:.1f} scored steps and "
            f"{fixed_counts[1]:.0f} tokens per device (the data's means per trace x {per_device:g} traces)"
        )
    args = TrainingArguments(
        output_dir=str(out_dir),
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_steps or cfg.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=grad_accum,
        max_grad_norm=cfg.max_grad_norm,
        **({"optim": cfg.optim} if cfg.optim else {}),  # default: TrainingArguments' own
        run_name=cfg.run_name,
        logging_steps=cfg.logging_steps,
        logging_first_step=cfg.logging_first_step,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        **(plan.training_args(cfg) if plan else {"eval_strategy": "no"}),
        report_to=[r for r in cfg.report_to.split(",") if r and r != "none"] or "none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=_precision(cfg),
        remove_unused_columns=False,
        label_names=["mc_correct", "mc_total"],
        dataloader_num_workers=cfg.dataloader_num_workers,
        use_cpu=cfg.use_cpu,
        ddp_backend=cfg.ddp_backend,
        disable_tqdm=rank != 0 or cfg.disable_tqdm,
    )
    card["hyperparameters"] = training_hyperparameters(cfg, args, world)
    trainer = PRMTrainer(
        model=prm,
        args=args,
        train_dataset=dataset,
        eval_dataset=held_out,
        data_collator=CountsCollator(pad_id(prm.tokenizer), pack=packing),
        objective=cfg.objective,
        lambda_reg=cfg.lambda_reg,
        hard_threshold=cfg.hard_threshold,
        head_lr_multiplier=cfg.head_lr_multiplier,
        kappa_detach=cfg.kappa_detach,
        group_by_length=cfg.group_by_length,
        batch_rebalance=uses_batch_rebalance(cfg),
        packing=packing,
        token_batches=token_batches,
        fixed_counts=fixed_counts,
        aux_lm_weight=cfg.aux_lm_weight,
        callbacks=list(callbacks or []),
    )
    trainer.record_ids = [r.id for r in records]
    trainer.add_callback(RunRecorder(record))  # each checkpoint records its run's settings
    if quiet:
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=resume)

    # The final model: a BetaPRM directory (LoRA merged into the backbone; sharded
    # DeepSpeed ZeRO-3 / FSDP weights gathered first, a collective on every rank).
    sharded = trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled
    # accelerate gathers ZeRO-3 weights through the DeepSpeed engine (model_wrapped), FSDP's
    # through the model itself, as the Trainer's own save_model does.
    engine = trainer.model_wrapped if trainer.is_deepspeed_enabled else trainer.model
    full_state = trainer.accelerator.get_state_dict(engine) if sharded else None
    if hasattr(prm.backbone, "merge_and_unload"):
        prm.backbone = prm.backbone.merge_and_unload()
    evaluation = eval_summary(trainer, plan.source) if plan else None
    undefined = undefined_metric_warning(evaluation, cfg.load_best_model_at_end) if evaluation else None
    if undefined and rank == 0:
        logger.warning(undefined)
        evaluation["warning"] = undefined
    if evaluation and evaluation["final_model"]:
        card.update(card_results(evaluation["final_model"], cfg))
    if trainer.args.should_save:
        prm.save_pretrained(out_dir, state_dict=full_state, card=card)
        summary = {
            "config": asdict(cfg),
            "run": record,
            "version": version(),
            "records": {
                "loaded": len(loaded.records),
                "rejected": loaded.n_rejected,
                **({"held_out": len(plan.records)} if cfg.eval_fraction else {}),
            },
            "truncation": asdict(dataset.stats),
            **({"evaluation": evaluation} if evaluation else {}),
            "log_history": trainer.state.log_history,
        }
        (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.plots and cfg.objective == "beta-binomial":
            Path(cfg.plots).mkdir(parents=True, exist_ok=True)
            kappa_dynamics(trainer.state.log_history, Path(cfg.plots) / "kappa_dynamics.png")
    say(dataset.stats.describe(cfg.max_length))
    say(f"saved the BetaPRM to {out_dir}")
    if cfg.push_to_hub and trainer.args.should_save:
        url = push_to_hub(out_dir, cfg.push_to_hub, cfg.hub_private)
        say(
            f"uploaded the BetaPRM to {url}; load it by name anywhere: `--model {cfg.push_to_hub}` in every betaprm "
            f"command, or BetaPRM.from_pretrained({cfg.push_to_hub!r})"
        )
    return prm, trainer, dataset.stats
