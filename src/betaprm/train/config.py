"""``betaprm train``'s options: ``TrainConfig`` (defaults, help texts, validation) and the
objectives. Free of torch and transformers, so ``betaprm train --help`` is built from it
without loading them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import BetaPRMInputError
from ..options import opt as _f
from ..provenance import same_path

OBJECTIVES = ("beta-binomial", "soft-ce", "hard-ce")


@dataclass
class TrainConfig:
    """``betaprm train`` options. Defaults are the paper's (appendix A.2)."""

    model: str = _f(
        "",
        "a causal LM to start from, or a BetaPRM to continue training: a folder, or a hub name "
        "OWNER/NAME[@REVISION] from the Hugging Face cache or hub",
    )
    data: str = _f(
        "",
        "training records: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT]); see `betaprm "
        "validate`",
    )
    output_dir: str = _f("outputs/betaprm", "where checkpoints and the final BetaPRM are written")
    objective: str = _f(
        "beta-binomial",
        "beta-binomial (BetaPRM: needs counts with N > 1 per step to learn kappa; on hard labels, N = 1, kappa learns "
        "nothing and a warning says so), soft-ce (the standard PRM) or hard-ce",
    )
    lambda_reg: float = _f(0.05, "weight of the evidence regulariser (beta-binomial only)")
    hard_threshold: float = _f(
        0.5, "hard-ce: a step is correct when K/N > this (0 gives Math-Shepherd's 'any success')"
    )
    aux_lm_weight: float = _f(
        0.0,
        "weight of an auxiliary next-token loss on the trace text (keeps a small backbone's pretrained skills; costs "
        "full-vocabulary logits)",
    )
    learning_rate: float = _f(1e-5, "peak learning rate of the backbone")
    head_lr_multiplier: float = _f(10.0, "the kappa head's learning rate is this times learning_rate")
    weight_decay: float = _f(0.05, "AdamW weight decay (not applied to biases, norms or the kappa head)")
    lr_scheduler_type: str = _f("cosine", "transformers scheduler name")
    warmup_ratio: float = _f(0.05, "fraction of steps for linear warmup")
    num_train_epochs: float = _f(1.0, "epochs over the data")
    max_steps: int = _f(-1, "stop after this many optimiser steps (-1: run the epochs)")
    global_batch_size: int = _f(512, "traces per optimiser step, over all devices (reached by gradient accumulation)")
    per_device_batch_size: int = _f(4, "traces per forward pass on each device")
    max_batch_tokens: int = _f(
        0,
        "a token budget per forward pass on each device instead of --per-device-batch-size: each batch holds as "
        "many traces as fit this many positions (packed rows, or padded rows without packing), so short traces go "
        "many at a time and long ones few; --global-batch-size is then reached on average (0: off)",
        aliases=("max_tokens_per_batch",),
    )
    max_length: int = _f(8192, "tokens per trace; longer traces keep the whole steps that fit")
    truncation: str = _f(
        "keep-steps", "keep-steps: cut long traces after the last whole step that fits; reject: leave them out"
    )
    freeze_layers: int = _f(
        0,
        "freeze the input embeddings and the bottom N decoder layers: no backward pass runs through them, so a step "
        "costs less (about N/L of the backward); the layers above, the output head and the kappa head train. The "
        "marker's embedding stays as the backbone has it (a new marker keeps the mean-of-embeddings start)",
    )
    lora_r: int = _f(0, "LoRA rank (0: full fine-tuning)")
    lora_alpha: int = _f(32, "LoRA alpha")
    lora_dropout: float = _f(0.0, "LoRA dropout")
    lora_target_modules: str = _f("all-linear", "comma-separated module names for LoRA, or all-linear")
    precision: str = _f("auto", "auto (bf16 where the GPU supports it, else fp32), bf16 or fp32")
    gradient_checkpointing: bool = _f(False, "trade compute for memory")
    logging_steps: int = _f(10, "log every this many optimiser steps")
    save_steps: int = _f(500, "save a checkpoint every this many optimiser steps")
    save_total_limit: int = _f(2, "keep at most this many checkpoints")
    plots: str | None = _f(
        None,
        "write kappa_dynamics.png (kappa mean and 90th percentile over training, the paper's figure 4) into this "
        "folder",
    )
    report_to: str = _f("none", "none, tensorboard, wandb, ... (comma-separated)")
    seed: int = _f(42, "random seed (model init, data order)")
    resume_from_checkpoint: str | None = _f(
        None, "checkpoint directory to resume from, or 'last' for the newest in output_dir"
    )
    push_to_hub: str | None = _f(
        None,
        "after training, upload the final BetaPRM (the same safetensors directory as --output-dir, without its "
        "checkpoint-* folders) to this hub repository, NAME or OWNER/NAME, created if missing (needs a token: "
        "`hf auth login` or HF_TOKEN)",
    )
    hub_private: bool = _f(False, "with --push-to-hub: create the repository as private")
    license: str | None = _f(
        None,
        "the trained model's licence in its model card (README.md), a hub licence id such as apache-2.0; default: "
        "the base model's, read from its own card, else other",
    )
    overwrite_output_dir: bool = _f(
        False,
        "start anew in an --output-dir that holds an earlier run: its checkpoint-* folders are deleted and its model "
        "files overwritten (without this flag such a directory is refused, unless resuming)",
    )
    on_error: str = _f("fail", "fail: stop on any bad record; skip: leave bad records out (see --rejects)")
    rejects: str | None = _f(None, "where skipped records go (default: OUTPUT_DIR/rejects.jsonl)")
    marker: str = _f("<prm>", "the step marker token")
    reward_tokens: str = _f("Yes,No", "the two reward words, positive first, comma-separated")
    kappa_init: float = _f(4.0, "kappa of a new head before training")
    kappa_min: float = _f(1e-3, "lower bound added to softplus")
    train_vision: bool = _f(
        False,
        "vision-language backbones: also train the vision encoder (by default it is frozen; the projector and "
        "language model train)",
    )
    kappa_detach: bool = _f(
        False,
        "beta-binomial: stop the kappa head's gradient at the backbone, so the backbone is shaped by mu alone and "
        "kappa reads its features",
    )
    chat_template: bool = _f(False, "wrap traces in the tokenizer's chat template (assistant turn)")
    marker_repeat: int = _f(1, "markers written after each step, scores read at the last (1: the paper's layout)")
    trust_remote_code: bool = _f(False, "allow model code from the checkpoint (off unless you trust it)")
    dataloader_num_workers: int = _f(0, "data loader worker processes")
    group_by_length: bool = _f(
        False,
        "draw each batch from traces of similar length, the batches in random order: less padding, faster steps "
        "(text PRMs; vision-language data keeps random batches)",
    )
    batch_rebalance: bool = _f(
        True,
        "deal each optimiser step's traces (a random draw, as without this) into its micro-batches by length, "
        "sorted and balanced in cost (transformers' BatchRebalanceSampler): less padding per forward pass, the same "
        "kind of batches and the same loss. Pays with gradient accumulation (--per-device-batch-size below "
        "--global-batch-size / devices); --group-by-length and --max-batch-tokens make their own batches instead",
    )
    step_weights: str = _f(
        "batch",
        "how an optimiser step's loss weighs its scored steps: batch (the mean over the step's own scored steps) or "
        "data (their sum over a fixed count, the data's mean scored steps per trace times the step's traces: every "
        "scored step weighs the same whatever its batch, as in random batches; for --group-by-length and "
        "--max-batch-tokens, whose batches hold unequal step counts). The auxiliary LM loss likewise per token",
    )
    packing: bool = _f(
        True,
        "lay each batch's traces out without padding (first-fit into rows, position ids per trace, a block-diagonal "
        "causal mask built by transformers): the same batches and loss, fewer tokens computed. Checked against "
        "padding on the first batch; text PRMs only (vision-language batches keep padding)",
    )
    use_cpu: bool = _f(False, "train on CPU even when a GPU is present")
    ddp_backend: str | None = _f(None, "distributed backend (nccl, gloo); default: what accelerate picks")

    def __post_init__(self):
        problems = []
        if not self.model:
            problems.append("--model is required (a causal-LM directory or a BetaPRM checkpoint)")
        if not self.data:
            problems.append("--data is required (counts records: JSONL, parquet, a saved dataset or a hub name)")
        if self.push_to_hub is not None and not re.fullmatch(r"([\w.-]+/)?[\w.-]+", self.push_to_hub):
            problems.append(f"--push-to-hub must be NAME or OWNER/NAME, got {self.push_to_hub!r}")
        if self.objective not in OBJECTIVES:
            problems.append(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.truncation not in ("keep-steps", "reject"):
            problems.append(f"--truncation must be keep-steps or reject, got {self.truncation!r}")
        if self.precision not in ("auto", "bf16", "fp32"):
            problems.append(f"--precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.on_error not in ("fail", "skip"):
            problems.append(f"--on-error must be fail or skip, got {self.on_error!r}")
        if self.step_weights not in ("batch", "data"):
            problems.append(f"--step-weights must be batch or data, got {self.step_weights!r}")
        if self.freeze_layers < 0:
            problems.append(f"--freeze-layers must be >= 0, got {self.freeze_layers}")
        if self.weight_decay < 0:
            problems.append(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.freeze_layers and self.lora_r > 0:
            problems.append("--freeze-layers with --lora-r: LoRA already freezes the backbone's weights; choose one")
        if self.max_batch_tokens < 0:
            problems.append(f"--max-batch-tokens must be >= 0 (0: off), got {self.max_batch_tokens}")
        for name in ("global_batch_size", "per_device_batch_size", "logging_steps", "save_steps"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if len(self.reward_words) != 2:
            problems.append(f"--reward-tokens must be two comma-separated words, got {self.reward_tokens!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            problems.append(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.lora_r < 0:
            problems.append(f"--lora-r must be >= 0, got {self.lora_r}")
        # torch refuses NaN and negative rates only when the optimiser is built (a traceback
        # after the model loaded) and trains on inf or 1e30, ruining the weights at step one.
        if not (math.isfinite(self.learning_rate) and 0 < self.learning_rate <= 1):
            problems.append(
                f"--learning-rate must be a finite number in (0, 1], got {self.learning_rate} (typical: 1e-6 to 1e-4)"
            )
        if not (math.isfinite(self.head_lr_multiplier) and 0 < self.head_lr_multiplier <= 1e4):
            problems.append(
                f"--head-lr-multiplier must be a finite number in (0, 10000], got {self.head_lr_multiplier}"
            )
        if self.rejects and self.data and same_path(self.rejects, self.data):
            problems.append(f"--rejects {self.rejects} is the input --data; writing it would destroy the data")
        if self.overwrite_output_dir and self.resume_from_checkpoint:
            problems.append(
                "--overwrite-output-dir starts anew and --resume-from-checkpoint continues a run: give one of them"
            )
        if problems:
            raise BetaPRMInputError("bad training configuration:\n  " + "\n  ".join(problems))

    @property
    def reward_words(self) -> tuple[str, ...]:
        return tuple(w for w in self.reward_tokens.split(","))


def uses_batch_rebalance(cfg: TrainConfig) -> bool:
    """--batch-rebalance applies: neither --group-by-length nor a token budget makes the batches."""
    return cfg.batch_rebalance and not cfg.group_by_length and not cfg.max_batch_tokens
