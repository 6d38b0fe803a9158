"""``betaprm train``'s options: ``TrainConfig`` (defaults, help texts, validation) and the
objectives. Free of torch and transformers, so ``betaprm train --help`` is built from it
without loading them.

Over 400 lines because every training option lives here with its help text and its check
(the command's one source of flags, config-file keys and settings): split, the checks would
drift from the fields they check."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import BetaPRMInputError
from ..hub import repo_id_problem
from ..options import KAPPA_HEADS, field_problems
from ..options import opt as _f
from ..progress import DISABLE_HELP
from ..provenance import same_path
from . import hf_names

OBJECTIVES = ("beta-binomial", "soft-ce", "hard-ce")
PRECISIONS = ("auto", "bf16", "fp32")
TRUNCATE_MODES = ("steps", "reject")
"""--truncate: steps keeps the whole steps that fit (as scoring's --truncate steps), reject leaves
the trace out."""
DEFAULT_MAX_LENGTH = 8192
"""--max-length when not given and the model has more positions (memory, not the model, limits it)."""
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
"""The TrainingArguments ``optim`` names betaprm's optimiser (AdamW with its own parameter
groups) honours."""
DEFAULT_GLOBAL_BATCH_SIZE = 512

BEST_METRICS = {"loss": False, "nll": False, "mae": False, "ece": False, "brier": False, "f1": True}
"""--metric-for-best-model's choices, each with whether greater is better."""


@dataclass
class TrainConfig:
    """``betaprm train`` options. Defaults are the paper's (appendix A.2)."""

    model: str = _f(
        "",
        "a causal LM to start from, or a BetaPRM to continue training: a folder, or a hub name "
        "OWNER/NAME[@REVISION] from the Hugging Face cache or hub",
        required=True,
    )
    data: str = _f(
        "",
        "training records: JSONL, .json, parquet, a save_to_disk folder or a hub name (NAME[:SPLIT]); see `betaprm "
        "validate`",
        required=True,
    )
    # ---- evaluation while training (the Trainer's eval_strategy="steps")
    eval_data: str | None = _f(
        None,
        "held-out data evaluated every --eval-steps and at the end: counts records in any source --data takes (logs "
        "eval_loss, eval_nll, eval_mae, eval_ece, eval_brier, eval_coverage) or ProcessBench items (id, problem, "
        "steps, label; a file or a folder of subsets; logs eval_f1 at threshold 0.5 on mu), told apart by the first "
        "record's fields",
    )
    eval_fraction: float = _f(
        0.0,
        "hold out this fraction of --data's problems (split by question text, so no problem is on both sides; the "
        "draw follows --seed) and evaluate on them while training (0: none; not with --eval-data)",
    )
    eval_steps: int = _f(0, "evaluate every this many optimiser steps, and at the end (0: every --save-steps)")
    eval_on_start: bool = _f(False, "also evaluate before the first optimiser step (a baseline for the curves)")
    metric_for_best_model: str = _f(
        "",
        "the held-out metric that picks the best checkpoint (best_metric, best_model_checkpoint in "
        "trainer_state.json): loss, nll, mae, ece, brier (lower is better) or f1 (ProcessBench; higher is better); "
        "default: nll for counts, f1 for ProcessBench",
    )
    load_best_model_at_end: bool = _f(
        False,
        "end with the best checkpoint's weights (by --metric-for-best-model) as the final model instead of the last "
        "step's; needs held-out data and --save-steps a multiple of --eval-steps, so every checkpoint is evaluated",
    )
    output_dir: str = _f("outputs/betaprm", "where checkpoints and the final BetaPRM are written")
    objective: str = _f(
        "beta-binomial",
        "beta-binomial (BetaPRM: needs counts with N > 1 per step to learn kappa; on hard labels, N = 1, kappa learns "
        "nothing and a warning says so), soft-ce (the standard PRM) or hard-ce",
        choices=OBJECTIVES,
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
    warmup_steps: float | None = _f(
        None,
        "linear warmup as transformers 5 takes it: optimiser steps (an integer >= 1) or a ratio in [0, 1); wins over "
        "--warmup-ratio",
    )
    num_train_epochs: float = _f(1.0, "epochs over the data")
    max_steps: int = _f(-1, "stop after this many optimiser steps (-1: run the epochs)")
    global_batch_size: int | None = _f(
        None,
        f"traces per optimiser step, over all devices, reached by gradient accumulation (default "
        f"{DEFAULT_GLOBAL_BATCH_SIZE}; with --gradient-accumulation-steps it is --per-device-train-batch-size x "
        "that x processes, and giving both is an error unless they agree)",
    )
    per_device_train_batch_size: int = _f(
        4, "traces per forward pass on each device", aliases=("per_device_batch_size",)
    )
    gradient_accumulation_steps: int | None = _f(
        None,
        "forward passes per optimiser step on each device (TrainingArguments' name); default: derived from "
        "--global-batch-size / (--per-device-train-batch-size x processes). Given, the global batch is "
        "per-device x this x processes (not with --max-batch-tokens, whose accumulation follows --global-batch-size)",
    )
    max_grad_norm: float = _f(1.0, "clip the gradient's norm to this before each optimiser step (0: no clipping)")
    optim: str | None = _f(
        None,
        "the optimiser, by TrainingArguments' name: adamw_torch (AdamW) or adamw_torch_fused (its fused kernel), "
        "with the kappa head's own parameter group; default: TrainingArguments' (adamw_torch_fused with torch >= 2.8)",
        choices=OPTIMIZERS,
    )
    max_batch_tokens: int = _f(
        0,
        "a token budget per forward pass on each device instead of --per-device-train-batch-size: each batch holds as "
        "many traces as fit this many positions (packed rows, or padded rows without packing), so short traces go "
        "many at a time and long ones few; --global-batch-size is then reached on average (0: off)",
        aliases=("max_tokens_per_batch",),
    )
    max_length: int | None = _f(
        None,
        f"tokens per trace (default: the model's positions, at most {DEFAULT_MAX_LENGTH}; more than its positions is "
        "refused); longer traces are cut or left out as --truncate says, held-out ones too",
    )
    truncate: str = _f(
        "steps",
        "a trace longer than --max-length: steps (keep the whole steps that fit, labels with them) or reject (leave "
        "it out)",
        choices=TRUNCATE_MODES,
        aliases=("truncation",),
        old_values={"keep-steps": "steps"},
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
    precision: str = _f("auto", "auto (bf16 where the GPU supports it, else fp32), bf16 or fp32", choices=PRECISIONS)
    bf16: bool = _f(False, "TrainingArguments' name for --precision bf16")
    fp16: bool = _f(False, "TrainingArguments' fp16: not supported (an error naming what is); use --bf16")
    attn_implementation: str | None = _f(
        None,
        "the backbone's attention kernel, passed to from_pretrained: eager, sdpa, flash_attention_2, ... (default: "
        "transformers' choice)",
    )
    gradient_checkpointing: bool = _f(False, "trade compute for memory")
    logging_steps: int = _f(10, "log every this many optimiser steps")
    logging_first_step: bool = _f(False, "also log the first optimiser step")
    save_steps: int = _f(500, "save a checkpoint every this many optimiser steps")
    save_total_limit: int = _f(2, "keep at most this many checkpoints")
    plots: str | None = _f(
        None,
        "write kappa_dynamics.png (kappa mean and 90th percentile over training, the paper's figure 4) into this "
        "folder",
    )
    report_to: str = _f("none", "none, tensorboard, wandb, ... (comma-separated)")
    run_name: str | None = _f(None, "the run's name in the trackers of --report-to (W&B, ...); default: --output-dir")
    disable_tqdm: bool = _f(False, DISABLE_HELP, result=False)
    seed: int = _f(42, "random seed (model init, data order)")
    resume_from_checkpoint: str | None = _f(
        None, "checkpoint directory to resume from, or 'last' for the newest in output_dir"
    )
    push_to_hub: str | None = _f(
        None,
        "after training, upload the final BetaPRM to this hub repository, NAME or OWNER/NAME: its weights, configs, "
        "tokenizer files and model card only (not the checkpoint-* folders, train_summary.json, logs, plots or "
        "rejects). The repository is created (if missing) before training starts, so a missing token or network "
        "stops the run at once (a token: `hf auth login` or HF_TOKEN)",
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
    on_error: str = _f(
        "fail", "fail: stop on any bad record; skip: leave bad records out (see --rejects)", choices=("fail", "skip")
    )
    rejects: str | None = _f(None, "where skipped records go (default: OUTPUT_DIR/rejects.jsonl)")
    marker: str = _f("<prm>", "the step marker token")
    reward_tokens: str = _f("Yes,No", "the two reward words, positive first, comma-separated")
    kappa_init: float = _f(4.0, "kappa of a new head before training")
    kappa_min: float = _f(1e-3, "lower bound added to softplus")
    kappa_head: str = _f(
        "linear",
        "the new kappa head's form: linear (a linear map of the marker's hidden state) or layernorm-linear (the "
        "paper authors' head: a LayerNorm, then the linear map); a BetaPRM continued keeps its own",
        choices=KAPPA_HEADS,
    )
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
        "kind of batches and the same loss. Pays with gradient accumulation (--per-device-train-batch-size below "
        "--global-batch-size / devices); --group-by-length and --max-batch-tokens make their own batches instead",
    )
    step_weights: str = _f(
        "batch",
        "how an optimiser step's loss weighs its scored steps: batch (the mean over the step's own scored steps) or "
        "data (their sum over a fixed count, the data's mean scored steps per trace times the step's traces: every "
        "scored step weighs the same whatever its batch, as in random batches; for --group-by-length and "
        "--max-batch-tokens, whose batches hold unequal step counts). The auxiliary LM loss likewise per token",
        choices=("batch", "data"),
    )
    packing: bool = _f(
        True,
        "lay each batch's traces out without padding (first-fit into rows, position ids per trace, a block-diagonal "
        "causal mask built by transformers): the same batches and loss, fewer tokens computed. Checked against "
        "padding on the first batch; text PRMs only (vision-language batches keep padding)",
    )
    use_cpu: bool = _f(False, "train on CPU even when a GPU is present")
    ddp_backend: str | None = _f(None, "distributed backend (nccl, gloo); default: what accelerate picks")

    @classmethod
    def from_file_keys(cls, values: dict, path: str) -> dict:
        """A --config file written for TRL's PRMConfig / transformers' TrainingArguments: their
        names mapped onto these fields, each key betaprm cannot honour named in a warning."""
        try:
            return hf_names.from_file_keys(cls, values, path)
        except hf_names.RecipeError as e:
            raise BetaPRMInputError(f"--config {path}: {e}") from None

    def __post_init__(self):
        problems = field_problems(self)  # required flags, fixed choices (keep-steps read as steps)
        if self.fp16:
            problems.append(
                "--fp16 is not supported: betaprm trains in bf16 or fp32 (fp16's range needs loss scaling the "
                "Beta-Binomial loss is not tuned for); use --bf16 or --precision bf16"
            )
        if self.bf16:
            if self.precision == "fp32":
                problems.append("--bf16 and --precision fp32 contradict each other; give one of them")
            else:
                self.precision = "bf16"
        if self.global_batch_size is None and self.gradient_accumulation_steps is None:
            self.global_batch_size = DEFAULT_GLOBAL_BATCH_SIZE
        if self.gradient_accumulation_steps is not None:
            if self.gradient_accumulation_steps < 1:
                problems.append(f"--gradient-accumulation-steps must be >= 1, got {self.gradient_accumulation_steps}")
            if self.max_batch_tokens:
                problems.append(
                    "--gradient-accumulation-steps with --max-batch-tokens: the token budget's batches hold a varying "
                    "number of traces, so the accumulation is derived from --global-batch-size; give that instead"
                )
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            problems.append(f"--max-grad-norm must be a finite number >= 0 (0: no clipping), got {self.max_grad_norm}")
        if self.push_to_hub is not None and (bad := repo_id_problem(self.push_to_hub)):  # before training
            problems.append(bad)
        if self.freeze_layers < 0:
            problems.append(f"--freeze-layers must be >= 0, got {self.freeze_layers}")
        if self.dataloader_num_workers < 0:
            problems.append(
                f"--dataloader-num-workers must be >= 0 (0: the main process loads), got {self.dataloader_num_workers}"
            )
        if self.weight_decay < 0:
            problems.append(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.freeze_layers and self.lora_r > 0:
            problems.append("--freeze-layers with --lora-r: LoRA already freezes the backbone's weights; choose one")
        if self.max_batch_tokens < 0:
            problems.append(f"--max-batch-tokens must be >= 0 (0: off), got {self.max_batch_tokens}")
        for name in ("global_batch_size", "per_device_train_batch_size", "logging_steps", "save_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if len(self.reward_words) != 2:
            problems.append(f"--reward-tokens must be two comma-separated words, got {self.reward_tokens!r}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            problems.append(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_steps is not None:
            w = self.warmup_steps
            if 0 <= w < 1:  # transformers 5: a float under 1 is a ratio
                self.warmup_ratio, self.warmup_steps = float(w), None
            elif not (w >= 1 and float(w).is_integer()):
                problems.append(f"--warmup-steps must be a whole number of steps >= 1 or a ratio in [0, 1), got {w}")
            else:
                self.warmup_steps = int(w)
        if not 0.0 <= self.hard_threshold <= 1.0:  # compared with K/N: outside [0, 1] every step is one class
            problems.append(f"--hard-threshold must be in [0, 1] (compared with K/N), got {self.hard_threshold}")
        if not 0.0 <= self.lora_dropout < 1.0:
            problems.append(f"--lora-dropout must be a probability in [0, 1), got {self.lora_dropout}")
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
        problems += self._eval_problems()
        if problems:
            raise BetaPRMInputError("bad training configuration:\n  " + "\n  ".join(problems))

    def _eval_problems(self) -> list[str]:
        """What is wrong with the evaluation-while-training flags."""
        problems = []
        held_out = bool(self.eval_data) or self.eval_fraction > 0
        if not (math.isfinite(self.eval_fraction) and 0 <= self.eval_fraction < 1):
            problems.append(f"--eval-fraction must be in [0, 1) (0: none), got {self.eval_fraction}")
        if self.eval_data and self.eval_fraction:
            problems.append(
                "--eval-data and --eval-fraction both give held-out data: give --eval-data, or --eval-fraction to "
                "hold out part of --data"
            )
        if self.eval_steps < 0:
            problems.append(f"--eval-steps must be >= 1 (0: every --save-steps), got {self.eval_steps}")
        metric = self.best_metric_name
        if metric and metric not in BEST_METRICS:
            problems.append(
                f"--metric-for-best-model must be one of {', '.join(BEST_METRICS)}, got {self.metric_for_best_model!r}"
            )
        if not held_out:
            for name, val in (
                ("eval_steps", self.eval_steps),
                ("metric_for_best_model", self.metric_for_best_model),
                ("load_best_model_at_end", self.load_best_model_at_end),
                ("eval_on_start", self.eval_on_start),
            ):
                if val:
                    problems.append(f"--{name.replace('_', '-')} needs held-out data: --eval-data or --eval-fraction")
        elif self.load_best_model_at_end and self.eval_steps > 0 and self.save_steps % self.eval_steps:
            problems.append(
                f"--load-best-model-at-end needs --save-steps ({self.save_steps}) to be a multiple of --eval-steps "
                f"({self.eval_steps}), so that every checkpoint is evaluated (the Trainer's rule); change one of them"
            )
        return problems

    def fitted_to(self, positions: int | None) -> TrainConfig:
        """This config with --max-length set for a model of ``positions`` (None: unknown): the
        positions (at most ``DEFAULT_MAX_LENGTH``) when not given; more than them is refused,
        since a trace past them is read at positions the model never learned (and scoring
        refuses it)."""
        if self.max_length is None:
            return replace(self, max_length=min(positions or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH))
        if positions is not None and self.max_length > positions:
            raise BetaPRMInputError(
                f"--max-length {self.max_length} is more than the {positions} positions of {self.model}: a trace past "
                f"them is trained on positions the model never learned, and scoring refuses it; give --max-length "
                f"{positions} or less, or leave it out (the default is the model's positions)"
            )
        return self

    @property
    def best_metric_name(self) -> str:
        """--metric-for-best-model without an ``eval_`` prefix ('' when not given)."""
        m = self.metric_for_best_model.strip()
        return m[len("eval_") :] if m.startswith("eval_") else m

    @property
    def reward_words(self) -> tuple[str, ...]:
        return tuple(w for w in self.reward_tokens.split(","))


def resolve_global_batch(cfg: TrainConfig, world: int) -> TrainConfig:
    """``cfg`` with its global batch set from --gradient-accumulation-steps when given:
    per-device x steps x ``world`` processes; a --global-batch-size that says otherwise is an
    error. Without the steps, ``cfg`` as it is (the steps are derived from the global batch)."""
    steps = cfg.gradient_accumulation_steps
    if steps is None:
        return cfg
    total = cfg.per_device_train_batch_size * steps * world
    if cfg.global_batch_size is not None and cfg.global_batch_size != total:
        raise BetaPRMInputError(
            f"--global-batch-size {cfg.global_batch_size} and --gradient-accumulation-steps {steps} disagree: "
            f"--per-device-train-batch-size {cfg.per_device_train_batch_size} x {steps} steps x {world} process(es) "
            f"= {total} traces per optimiser step; give only one of them"
        )
    return replace(cfg, global_batch_size=total)


def uses_batch_rebalance(cfg: TrainConfig) -> bool:
    """--batch-rebalance applies: neither --group-by-length nor a token budget makes the batches."""
    return cfg.batch_rebalance and not cfg.group_by_length and not cfg.max_batch_tokens
