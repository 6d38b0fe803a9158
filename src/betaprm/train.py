"""Training a BetaPRM (or the standard soft-label PRM) with the transformers Trainer.

Objectives, per supervised marker (averaged over the markers of a micro-batch):

- ``beta-binomial``: ``NLL_BetaBinomial(K | N, mu, kappa) + lambda_reg * |sg(mu) - K/N| * kappa``
- ``soft-ce``: cross-entropy of ``mu`` against ``K/N`` (the standard PRM; kappa unused)
- ``hard-ce``: cross-entropy against ``1[K/N > hard_threshold]``

Losses are computed in float32 whatever the backbone dtype. The kappa head has its own
optimiser parameter group with ``head_lr_multiplier`` times the learning rate (a real
group, not a gradient hook: under Adam a scaled gradient barely changes the step), and
no weight decay on biases and norms. Checkpoints hold the full model state in
safetensors plus the Trainer's optimiser, scheduler, RNG and data position, so
``resume_from_checkpoint`` continues exactly; the final model is a BetaPRM directory.

One module over 400 lines on purpose: the config, the Trainer subclass (loss, optimiser
groups, checkpoint format, divergence stop) and ``train`` share the run record and the
checkpoint format, and are read together when something in a run goes wrong.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from .beta import beta_binomial_nll, evidence_regularizer, soft_ce_loss
from .card import license_of
from .errors import BetaPRMInputError, TrainingDivergedError
from .hub import resolve_model
from .options import opt as _f
from .provenance import same_path

logger = logging.getLogger(__name__)

OBJECTIVES = ("beta-binomial", "soft-ce", "hard-ce")
STATE_NAME = "model.safetensors"


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
    max_tokens_per_batch: int = _f(
        0,
        "a token budget per forward pass on each device instead of --per-device-batch-size: each batch holds as "
        "many traces as fit this many positions (packed rows, or padded rows without packing), so short traces go "
        "many at a time and long ones few; --global-batch-size is then reached on average (0: off)",
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
        "--global-batch-size / devices); --group-by-length and --max-tokens-per-batch make their own batches instead",
    )
    step_weights: str = _f(
        "batch",
        "how an optimiser step's loss weighs its scored steps: batch (the mean over the step's own scored steps) or "
        "data (their sum over a fixed count, the data's mean scored steps per trace times the step's traces: every "
        "scored step weighs the same whatever its batch, as in random batches; for --group-by-length and "
        "--max-tokens-per-batch, whose batches hold unequal step counts). The auxiliary LM loss likewise per token",
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
        if self.max_tokens_per_batch < 0:
            problems.append(f"--max-tokens-per-batch must be >= 0 (0: off), got {self.max_tokens_per_batch}")
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


# ---------------------------------------------------------------------- state files
def save_state(state_dict: dict, path) -> None:
    """Safetensors of a full state dict; tensors that share storage (tied embeddings)
    are written once and recorded as aliases."""
    from safetensors.torch import save_file

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
    from safetensors import safe_open
    from safetensors.torch import load_file

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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=True))
    else:
        model.load_state_dict(sd, strict=True)


# ---------------------------------------------------------------------- trainer
def _trainer_class():
    from transformers import Trainer

    class BetaPRMTrainer(Trainer):
        """A Trainer whose loss is the PRM objective at the markers."""

        def __init__(
            self,
            *args,
            objective: str,
            lambda_reg: float,
            hard_threshold: float,
            head_lr_multiplier: float,
            aux_lm_weight: float = 0.0,
            kappa_detach: bool = False,
            group_by_length: bool = False,
            batch_rebalance: bool = False,
            packing: bool = False,
            token_batches=None,
            fixed_counts: tuple[float, float] | None = None,
            **kwargs,
        ):
            super().__init__(*args, **kwargs)
            # --step-weights data: (scored steps, LM tokens) that divide every optimiser
            # step's summed losses on this device, instead of the step's own counts.
            self.fixed_counts = fixed_counts
            self.token_batches = token_batches  # data/dataset.TokenBudgetBatchSampler, or None
            self.aux_lm_weight = aux_lm_weight
            self.objective = objective
            self.lambda_reg = lambda_reg
            self.hard_threshold = hard_threshold
            self.head_lr_multiplier = head_lr_multiplier
            self.group_by_length = group_by_length
            self.batch_rebalance = batch_rebalance
            self.kappa_detach = kappa_detach
            self.packing_unchecked = packing
            # The loss of an optimiser step is the mean over the step's scored steps on this
            # device, however the step is cut into micro-batches (get_batch_samples counts
            # them; compute_loss weights each micro-batch by its share): the Trainer must not
            # divide it by the accumulation steps again, nor pass the count to the model.
            self.model_accepts_loss_kwargs = False
            self.loss_is_scaled_for_ga = True
            self._buf: dict[str, list] = {}
            # Ids of the records in each micro-batch since the last optimiser step, to
            # name them if the step turns out non-finite (set by train()).
            self.record_ids: list[str] | None = None
            self._step_rows: list[torch.Tensor] = []
            self.add_callback(_NonFiniteStop(self))

        # ---- non-finite loss or gradient: stop before the optimiser writes NaN weights
        def training_step(self, model, inputs, num_items_in_batch=None):
            rows = inputs.pop("record_index", None)
            if rows is not None:
                self._step_rows.append(rows)
            loss = super().training_step(model, inputs, num_items_in_batch)
            # The Trainer itself tests every step's loss for NaN/inf (logging_nan_inf_filter),
            # so this adds no synchronisation of its own that matters.
            if not torch.isfinite(loss).all():
                self.diverged(f"non-finite loss ({loss.item()})")
            return loss

        def diverged(self, what: str):
            rows = torch.cat(self._step_rows).tolist() if self._step_rows else []
            ids = [self.record_ids[i] for i in rows] if self.record_ids and rows else []
            shown = ", ".join(repr(i) for i in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
            raise TrainingDivergedError(
                f"training stopped at optimiser step {self.state.global_step + 1}: {what}"
                + (f" in the batch of records {shown}" if ids else "")
                + ". Nothing of this step was applied and the last checkpoint is intact. Check those records' "
                "counts, or start anew with a lower --learning-rate or a longer --warmup-ratio (another --output-dir, "
                "or --overwrite-output-dir; a resume must keep the checkpoint's settings)."
            )

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
            if self.fixed_counts is not None:
                self._step_lm_tokens = self.fixed_counts[1]
                return batches, self.fixed_counts[0]
            # This device's scored steps in the optimiser step, and the auxiliary loss's tokens
            # (not gathered: DDP averages the devices' means).
            if self.aux_lm_weight > 0:
                prm = self.accelerator.unwrap_model(self.model)
                self._step_lm_tokens = sum(
                    int(self._lm_targets(prm, b["input_ids"], b.get("lm_keep")).sum()) for b in batches
                )
            return batches, sum(int(b["mc_total"].numel()) for b in batches)

        # ---- a token budget per forward pass (data/dataset.TokenBudgetBatchSampler)
        def get_train_dataloader(self):
            if self.token_batches is None:
                return super().get_train_dataloader()
            from torch.utils.data import DataLoader

            loader = DataLoader(
                self.train_dataset,
                batch_sampler=self.token_batches,
                collate_fn=self.data_collator,
                num_workers=self.args.dataloader_num_workers,
                pin_memory=self.args.dataloader_pin_memory,
            )
            # accelerate deals the batches out to the processes in turn (their count divides
            # by the number of processes, so none is repeated).
            return self.accelerator.prepare(loader)

        # ---- batches of similar length, in random order (data/dataset.LengthBucketSampler)
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            if self.group_by_length and hasattr(dataset, "lengths"):
                from .data.dataset import LengthBucketSampler

                return LengthBucketSampler(
                    dataset.lengths(), self.args.train_batch_size, seed=self.args.data_seed or self.args.seed
                )
            if self.batch_rebalance and hasattr(dataset, "lengths"):
                # Built here rather than by train_sampling_strategy="batch_rebalance": the
                # lengths come from the dataset without encoding it again, and the order
                # follows --seed (the Trainer's own would always use 42). The Trainer passes
                # it as a batch sampler and keeps accelerate from sharding it a second time.
                from transformers.trainer_pt_utils import BatchRebalanceSampler

                args = self.args
                world = max(1, args.world_size)
                return BatchRebalanceSampler(
                    dataset.lengths(),
                    effective_batch_size=args.train_batch_size * args.gradient_accumulation_steps * world,
                    dp_size=world,
                    grad_accum=args.gradient_accumulation_steps,
                    seed=args.data_seed or args.seed,
                    rank=args.process_index if world > 1 else 0,
                    drop_last=args.dataloader_drop_last,
                )
            return super()._get_train_sampler(train_dataset)

        # ---- loss
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs.pop("record_index", None)
            lm_keep = inputs.pop("lm_keep", None)
            k = inputs.pop("mc_correct").float()
            n = inputs.pop("mc_total").float()
            if self.packing_unchecked and "position_ids" in inputs:
                self.packing_unchecked = not self._check_packing(model, inputs)
            out = model(**inputs, return_hidden=self.aux_lm_weight > 0, detach_kappa=self.kappa_detach)
            mu, kappa = out.mu.float(), out.kappa.float()
            if mu.shape != k.shape:
                raise RuntimeError(
                    f"{mu.shape[0]} markers in the batch but {k.shape[0]} labels: the collator and the model disagree"
                )
            if self.objective == "beta-binomial":
                nll = beta_binomial_nll(mu, kappa, k, n).mean()
                reg = evidence_regularizer(mu, kappa, k, n).mean()
                loss = nll + self.lambda_reg * reg
                parts = {"nll": nll, "reg": reg}
            else:
                target = k if self.objective == "soft-ce" else (k / n > self.hard_threshold).float() * n
                ce = soft_ce_loss(mu, target, n).mean()
                # The NLL of the counts under the (unused) initial kappa is not logged:
                # only what the objective optimises.
                loss, parts = ce, {"ce": ce}
            # Training: this micro-batch's share of the step's mean (1 when not counted).
            share = dict.fromkeys(parts, 1.0 if num_items_in_batch is None else k.numel() / num_items_in_batch)
            loss = loss * share[next(iter(parts))]
            if self.aux_lm_weight > 0:
                lm, n_tokens = self._lm_loss(model, out.hidden_states, inputs["input_ids"], lm_keep)
                # The mean over the step's tokens likewise (get_batch_samples counted them).
                share["lm"] = 1.0 if num_items_in_batch is None else n_tokens / self._step_lm_tokens
                loss = loss + self.aux_lm_weight * lm * share["lm"]
                parts["lm"] = lm
            if model.training:
                # Logged as the loss is: each part weighted by its share of its step.
                for name, val in parts.items():
                    self._buf.setdefault(name, []).append((val.detach() * share[name], share[name]))
                self._buf.setdefault("mu", []).append(mu.detach())
                self._buf.setdefault("kappa", []).append(kappa.detach())
            return (loss, out) if return_outputs else loss

        def _check_packing(self, model, inputs) -> bool:
            """Packed rows must give each trace the hidden states it has alone: compares,
            for every trace that is not first in its row (the ones a mask that ignored
            position ids would let see another trace), the packed forward's hidden states
            with a padded forward of the same traces. False: no such trace in this batch.
            Runs the unwrapped model, whose forward is no collective under DDP, and not at all
            under DeepSpeed or FSDP, whose every forward is one (ranks that disagree on
            checking would hang)."""
            from .scoring import _pad_id, pad_batch

            prm = self.accelerator.unwrap_model(model)
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                logger.info("packing: not checked against padding under DeepSpeed / FSDP")
                return True
            ids, pos = inputs["input_ids"], inputs["position_ids"]
            pad = _pad_id(prm.tokenizer)
            if not bool(((pos[:, 1:] == 0) & (ids[:, 1:] != pad)).any()):  # no row holds a second trace
                return False
            later = []
            for r in range(ids.shape[0]):
                starts = (pos[r] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
                later += [
                    (r, a, b)
                    for a, b in zip(starts[1:-1], starts[2:])
                    if (ids[r, a:b] == prm.config.marker_id).any()  # the padding tail has no marker
                ]
            if not later:
                return False
            with torch.no_grad():
                packed = prm(input_ids=ids, position_ids=pos, return_hidden=True).hidden_states
                alone_ids, alone_mask = pad_batch([ids[r, a:b].tolist() for r, a, b in later], pad)
                alone = prm(
                    input_ids=alone_ids.to(ids.device), attention_mask=alone_mask.to(ids.device), return_hidden=True
                ).hidden_states
            got = torch.cat([packed[r, a:b] for r, a, b in later]).float()
            want = torch.cat([alone[i, : b - a] for i, (r, a, b) in enumerate(later)]).float()
            err = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
            # bf16 (autocast, applied by accelerate inside the model's forward, or bf16 weights)
            # rounds differently in the two layouts; a mask that lets traces see each other
            # moves hidden states by far more than either tolerance.
            exact = next(prm.parameters()).dtype == torch.float32 and not (self.args.bf16 or self.args.fp16)
            if err > (1e-3 if exact else 0.05):
                raise BetaPRMInputError(
                    f"packing check failed: {type(prm.backbone).__name__} gives a packed trace hidden states "
                    f"{err:.3g} (relative) away from the same trace alone, so its attention does not keep packed "
                    "traces apart (it ignores position_ids). Train with --no-packing."
                )
            logger.info("packing: packed traces match padded ones (relative difference %.2g)", err)
            return True

        @staticmethod
        def _lm_targets(prm, input_ids, lm_keep):
            """Which next tokens the auxiliary loss predicts: not markers, not padding."""
            keep = input_ids[:, 1:] != prm.config.marker_id
            return keep if lm_keep is None else keep & lm_keep.to(keep.device)

        def _lm_loss(self, model, hidden, input_ids, lm_keep):
            """Mean next-token cross-entropy over the trace, markers and padding excluded
            (``lm_keep``: the collator's next-token pairs inside one trace), and the number
            of tokens it averages."""
            prm = self.accelerator.unwrap_model(model)
            head = prm.backbone.get_output_embeddings()
            labels = input_ids[:, 1:]
            keep = self._lm_targets(prm, input_ids, lm_keep)
            logits = head(hidden[:, :-1][keep]).float()  # (n_tokens, V)
            return torch.nn.functional.cross_entropy(logits, labels[keep]), int(keep.sum())

        def log(self, logs, start_time=None):
            if self._buf and "loss" in logs:
                for name in ("nll", "reg", "ce", "lm"):
                    if name in self._buf:
                        vals, weights = zip(*self._buf[name])
                        logs[name] = torch.stack(vals).sum().item() / sum(weights)
                kappa = torch.cat(self._buf["kappa"]).float()
                logs["kappa_mean"] = kappa.mean().item()
                logs["kappa_p90"] = torch.quantile(kappa.cpu(), 0.9).item()
                logs["mu_mean"] = torch.cat(self._buf["mu"]).float().mean().item()
                self._buf = {}
            super().log(logs, start_time)

        # ---- optimiser: the kappa head in its own group with a larger learning rate
        def create_optimizer(self, model=None):
            if self.optimizer is not None:
                return self.optimizer
            opt_model = self.model if model is None else model
            decay = set(self.get_decay_parameter_names(opt_model))
            lr = self.args.learning_rate
            groups = {"head": [], "decay": [], "no_decay": []}
            for name, p in opt_model.named_parameters():
                if not p.requires_grad:
                    continue
                if name.startswith("kappa_head.") or ".kappa_head." in name:
                    groups["head"].append(p)
                elif name in decay:
                    groups["decay"].append(p)
                else:
                    groups["no_decay"].append(p)
            param_groups = [
                {"params": groups["decay"], "weight_decay": self.args.weight_decay, "lr": lr},
                {"params": groups["no_decay"], "weight_decay": 0.0, "lr": lr},
                {"params": groups["head"], "weight_decay": 0.0, "lr": lr * self.head_lr_multiplier},
            ]
            param_groups = [g for g in param_groups if g["params"]]
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            kwargs.pop("lr", None)
            self.optimizer = cls(param_groups, lr=lr, **kwargs)
            return self.optimizer

        # ---- checkpoints: the full state in safetensors (no pickle for weights)
        def _save(self, output_dir=None, state_dict=None):
            output_dir = output_dir or self.args.output_dir
            if not self.args.should_save:
                return
            os.makedirs(output_dir, exist_ok=True)
            model = self.accelerator.unwrap_model(self.model)
            save_state(state_dict if state_dict is not None else model.state_dict(), Path(output_dir) / STATE_NAME)
            Path(output_dir, "training_args.json").write_text(self.args.to_json_string())

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            path = Path(resume_from_checkpoint) / STATE_NAME
            if not path.is_file():
                raise BetaPRMInputError(
                    f"{resume_from_checkpoint} is not a betaprm training checkpoint: {STATE_NAME} is missing"
                )
            load_state(model if model is not None else self.model, path, sharded=self.is_fsdp_enabled)

    return BetaPRMTrainer


def _non_finite_stop_class():
    from transformers import TrainerCallback

    class NonFiniteStop(TrainerCallback):
        """Checks the gradients after clipping and before the optimiser step: a NaN or
        inf gradient (from a finite loss too, e.g. an overflow) stops training."""

        def __init__(self, trainer):
            self.trainer = trainer

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            # Under DeepSpeed the gradients are not on the parameters; the loss check in
            # training_step still holds there.
            grads = [p.grad for p in (model or self.trainer.model).parameters() if p.grad is not None]
            # One norm per tensor in its own dtype (no float32 copies of bf16 gradients).
            if grads and not torch.isfinite(torch.stack(torch._foreach_norm(grads))).all():
                self.trainer.diverged("non-finite gradient")
            self.trainer._step_rows = []

    return NonFiniteStop


def _NonFiniteStop(trainer):
    return _non_finite_stop_class()(trainer)


# ---------------------------------------------------------------------- building blocks
def load_or_create(cfg: TrainConfig):
    """A BetaPRM from a BetaPRM checkpoint or a plain causal LM (new head)."""
    from safetensors import SafetensorError

    from .model import BetaPRM, model_kind

    # A folder or a hub name (resolved through the hub cache; a path that is not on disk is
    # an error, never a hub request). A BetaPRM, however named, continues as the BetaPRM it is.
    source = resolve_model(cfg.model)
    if model_kind(source) != "zero-shot":
        return BetaPRM.from_pretrained(source.path, trust_remote_code=cfg.trust_remote_code)
    try:
        return BetaPRM.from_backbone(
            cfg.model,
            marker=cfg.marker,
            reward_tokens=cfg.reward_words,
            kappa_init=cfg.kappa_init,
            kappa_min=cfg.kappa_min,
            chat_template=cfg.chat_template,
            marker_repeat=cfg.marker_repeat,
            trust_remote_code=cfg.trust_remote_code,
        )
    except (OSError, SafetensorError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BetaPRMInputError(
            f"--model {cfg.model}: cannot load a model ({reason}); give a causal-LM directory (config.json, weights, "
            "tokenizer), a BetaPRM checkpoint, or a Hugging Face hub id you can reach"
        ) from None


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
    try:
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
    per_step = cfg.per_device_batch_size * world
    if cfg.global_batch_size % per_step:
        raise BetaPRMInputError(
            f"--global-batch-size {cfg.global_batch_size} is not a multiple of per-device batch "
            f"{cfg.per_device_batch_size} x {world} devices = {per_step}; change one of them"
        )
    return cfg.global_batch_size // per_step


def _fixed_counts(dataset, marker_id: int, traces: float) -> tuple[float, float]:
    """``--step-weights data``: the scored steps and auxiliary-LM tokens (next tokens that
    are not markers) of ``traces`` average traces of ``dataset``."""
    steps = sum(len(e["mc_total"]) for e in dataset.examples) / len(dataset)
    tokens = sum(sum(1 for t in e["input_ids"][1:] if t != marker_id) for e in dataset.examples) / len(dataset)
    return steps * traces, tokens * traces


def _token_batches(cfg: TrainConfig, dataset, packing: bool, world: int, say):
    """The token-budget batches (``--max-tokens-per-batch``) and the accumulation steps
    that reach ``--global-batch-size`` traces per optimiser step on average."""
    from .data.dataset import TokenBudgetBatchSampler

    lengths = dataset.lengths()
    sampler = TokenBudgetBatchSampler(
        lengths,
        cfg.max_tokens_per_batch,
        packed=packing,
        seed=cfg.seed,
        group=50 if cfg.group_by_length else None,
        world=world,
    )
    batches = sampler.all_batches()
    per_batch = len(lengths) / len(batches)
    grad_accum = max(1, round(cfg.global_batch_size / (per_batch * world)))
    over = sum(1 for n in lengths if n > cfg.max_tokens_per_batch)
    say(
        f"token budget {cfg.max_tokens_per_batch} per forward pass: {len(batches)} batches of {per_batch:.1f} traces "
        f"on average; {grad_accum} accumulation steps x {world} device(s) make about "
        f"{grad_accum * world * per_batch:.0f} traces per optimiser step (--global-batch-size {cfg.global_batch_size})"
        + (f"; {over} traces longer than the budget go one per batch" if over else "")
    )
    return sampler, grad_accum


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
    "per_device_batch_size",
    "gradient_checkpointing",
    "packing",
}


def uses_batch_rebalance(cfg: TrainConfig) -> bool:
    """--batch-rebalance applies: neither --group-by-length nor a token budget makes the batches."""
    return cfg.batch_rebalance and not cfg.group_by_length and not cfg.max_tokens_per_batch


def run_record(cfg: TrainConfig) -> dict:
    """The run's settings (data and starting model by fingerprint, the hyperparameters
    that change the result) and, for messages only, where the data and model came from."""
    from .provenance import fingerprint, model_fingerprint, settings_of

    settings = {"data": fingerprint(cfg.data), "model": model_fingerprint(cfg.model), **settings_of(cfg, NOT_RESULTS)}
    # Recorded only when not the default: older checkpoints, without them, still resume.
    for name, default in (("max_tokens_per_batch", 0), ("freeze_layers", 0), ("step_weights", "batch")):
        if getattr(cfg, name) == default:
            del settings[name]
    # Whether the rebalancing sampler orders the batches (the flag is moot under grouping or a
    # token budget): recorded only when it does, so a checkpoint from before it existed (random
    # order) resumes only with --no-batch-rebalance, in its own order.
    if not uses_batch_rebalance(cfg):
        del settings["batch_rebalance"]
    return {"settings": json.loads(json.dumps(settings)), "info": {"data": cfg.data, "model": cfg.model}}


def _refuse_used_output_dir(cfg: TrainConfig, rank: int) -> None:
    """A new run in a directory that holds files stops, unless told to overwrite: the
    Trainer's rotation would delete the earlier run's checkpoints and the final save
    overwrite its model. With --overwrite-output-dir the earlier checkpoints go first, so
    rotation and `--resume-from-checkpoint last` never mix two runs' checkpoints."""
    import shutil

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
        from .model import CONFIG_NAME

        for old in out.glob("checkpoint-*"):
            shutil.rmtree(old)
        # Without its BetaPRM config the earlier final model no longer loads, so a run of
        # this one that stops early cannot leave the directory looking like a finished model.
        for name in (CONFIG_NAME, "train_summary.json"):
            (out / name).unlink(missing_ok=True)


def _check_resume(resume: str, record: dict, say=logger.warning) -> None:
    """Stop when the checkpoint's run had other data or hyperparameters: its optimiser
    state and schedule would go on under settings they were not made for."""
    from .provenance import differences

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
        diff = differences(old["settings"], record["settings"], old.get("info"), record["info"])
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


def _run_recorder(record: dict):
    """A callback that writes ``record`` into every checkpoint it saves."""
    from transformers import TrainerCallback

    class RunRecorder(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and folder.is_dir():
                (folder / RUN_NAME).write_text(json.dumps(record, indent=2) + "\n")

    return RunRecorder()


def _last_checkpoint(output_dir: str) -> str:
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    if last is None:
        raise BetaPRMInputError(f"--resume-from-checkpoint last: no checkpoint-* folder in {output_dir}")
    return last


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
    from transformers import TrainingArguments, set_seed

    from .data.dataset import CountsCollator, encode_records
    from .data.records import read_records
    from .model import _version
    from .scoring import _pad_id

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    say = (log or logger.info) if rank == 0 else (lambda *a, **k: None)
    grad_accum = _grad_accum(cfg, world) if not cfg.max_tokens_per_batch else None  # token budget: set below
    set_seed(cfg.seed)
    _refuse_used_output_dir(cfg, rank)  # before this run writes anything there
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rejects = cfg.rejects or str(out_dir / "rejects.jsonl")
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
    hard = hard_label_warning(loaded.records, cfg.objective, cfg.data)
    if hard and rank == 0:
        logger.warning(hard)
    record = run_record(cfg)
    resume = _last_checkpoint(cfg.output_dir) if cfg.resume_from_checkpoint == "last" else cfg.resume_from_checkpoint
    if resume:
        _check_resume(resume, record, say)  # before the model loads: a wrong resume stops at once

    prm = load_or_create(cfg)
    prm.config.objective = cfg.objective  # saved in betaprm_config.json: how the model scores (model_kind)
    card = card_of(cfg, record)  # before training: nothing after it can fail to build the card
    if any(r.images for r in loaded.records) and getattr(prm, "processor", None) is None:
        raise BetaPRMInputError(
            f"{cfg.data}: records with images need a vision-language backbone (Qwen2.5-VL, InternVL, ...); "
            f"{cfg.model} is text-only"
        )
    if getattr(prm, "processor", None) is not None:
        from .vision import freeze_vision

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

    from tqdm.auto import tqdm

    with tqdm(total=len(loaded.records), desc="tokenising", disable=rank != 0 or quiet, unit="rec") as bar:
        dataset = encode_records(prm, loaded.records, cfg.max_length, cfg.truncation, progress=bar.update)
    say(dataset.stats.describe(cfg.max_length))
    if len(dataset) == 0:
        raise BetaPRMInputError(f"no record fits --max-length {cfg.max_length}; raise it")

    packing = cfg.packing and getattr(prm, "processor", None) is None
    if cfg.packing and not packing:
        say("packing: off (vision-language batches keep padding)")
    token_batches = None
    if cfg.max_tokens_per_batch:
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
        warmup_steps=cfg.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=grad_accum,
        logging_steps=cfg.logging_steps,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        report_to=[r for r in cfg.report_to.split(",") if r and r != "none"] or "none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        bf16=_precision(cfg),
        remove_unused_columns=False,
        label_names=["mc_correct", "mc_total"],
        dataloader_num_workers=cfg.dataloader_num_workers,
        use_cpu=cfg.use_cpu,
        ddp_backend=cfg.ddp_backend,
        disable_tqdm=rank != 0,
    )
    trainer = _trainer_class()(
        model=prm,
        args=args,
        train_dataset=dataset,
        data_collator=CountsCollator(_pad_id(prm.tokenizer), pack=packing),
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
    trainer.record_ids = [r.id for r in loaded.records]
    trainer.add_callback(_run_recorder(record))  # each checkpoint records its run's settings
    if quiet:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

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
    if trainer.args.should_save:
        prm.save_pretrained(out_dir, state_dict=full_state, card=card)
        summary = {
            "config": asdict(cfg),
            "run": record,
            "version": _version(),
            "records": {"loaded": len(loaded.records), "rejected": loaded.n_rejected},
            "truncation": asdict(dataset.stats),
            "log_history": trainer.state.log_history,
        }
        (out_dir / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.plots and cfg.objective == "beta-binomial":
            from .evaluation.plots import kappa_dynamics

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


def card_of(cfg: TrainConfig, record: dict) -> dict:
    """The model card's settings for the final model (``betaprm.card.model_card``): its hub
    name, licence (``--license``, else the base model's card's) and training data (its
    fingerprint from the run ``record``)."""
    return {
        "name": cfg.push_to_hub,
        "license": cfg.license or license_of(resolve_model(cfg.model).path),
        "data": {"name": cfg.data, "fingerprint": record["settings"]["data"]},
    }


def end_process_group() -> None:
    """Close the process group a multi-process run opened (torchrun, accelerate launch), all
    ranks together. Left to interpreter exit, gloo's threads can be torn down while still
    joinable and abort a process that has finished its work (SIGABRT, "terminate called
    without an active exception"), which the launcher reports as a failed run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


HUB_IGNORE = ["checkpoint-*", "runs/*", "rejects.jsonl", "*.lock"]
"""What --push-to-hub leaves out of --output-dir: resumable checkpoints, logs, rejects."""


def push_to_hub(folder, repo_id: str, private: bool = False) -> str:
    """Upload the final BetaPRM directory (``HUB_IGNORE`` left out) to ``repo_id`` through
    ``huggingface_hub``, creating the repository when missing; returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            ignore_patterns=HUB_IGNORE,
            commit_message="betaprm train: final BetaPRM",
        )
    except Exception as e:  # network, authentication, permissions: the model is saved locally either way
        raise BetaPRMInputError(
            f"--push-to-hub {repo_id}: the upload failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); the "
            f"model is saved in {folder}: log in (`hf auth login` or HF_TOKEN) and upload it with `hf upload "
            f"{repo_id} {folder}`"
        ) from None
    return str(url)
