"""``PRMTrainer``, the transformers Trainer that trains a BetaPRM: the PRM loss at the markers,
the kappa head's own optimiser group, the batch samplers, the packing check, the checkpoint
format (``checkpoints``) and the stop on a non-finite loss or gradient.

Objectives, per supervised marker (averaged over the markers of a micro-batch):

- ``beta-binomial``: ``NLL_BetaBinomial(K | N, mu, kappa) + lambda_reg * |sg(mu) - K/N| * kappa``
- ``soft-ce``: cross-entropy of ``mu`` against ``K/N`` (the standard PRM; kappa unused)
- ``hard-ce``: cross-entropy against ``1[K/N > hard_threshold]``

Losses are computed in float32 whatever the backbone dtype. The kappa head has its own
optimiser parameter group with ``head_lr_multiplier`` times the learning rate (a real
group, not a gradient hook: under Adam a scaled gradient barely changes the step), and
no weight decay on biases and norms.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback
from transformers.trainer_pt_utils import BatchRebalanceSampler
from transformers.trainer_utils import speed_metrics

from ..batching import pad_batch, pad_id
from ..beta import beta_binomial_nll, evidence_regularizer, soft_ce_loss
from ..errors import BetaPRMInputError, TrainingDivergedError
from .checkpoints import STATE_NAME, load_state, save_state
from .dataset import LengthBucketSampler
from .evaluate import HeldOut

logger = logging.getLogger(__name__)


class PRMTrainer(Trainer):
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
        self.token_batches = token_batches  # dataset.TokenBudgetBatchSampler, or None
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
        self.add_callback(NonFiniteStop(self))

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

    def _get_grad_norm(self, model, grad_norm=None):
        # The step's gradient norm, which the Trainer computes before every optimiser step
        # (clipping, or logging) and which is non-finite exactly when a gradient is: the
        # check costs no pass of its own. Under DeepSpeed there may be none; the loss check
        # in training_step holds there.
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if norm is not None and not math.isfinite(float(norm)):
            self.diverged("non-finite gradient")
        return norm

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

    # ---- a token budget per forward pass (dataset.TokenBudgetBatchSampler)
    def get_train_dataloader(self):
        if self.token_batches is None:
            return super().get_train_dataloader()
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

    # ---- batches of similar length, in random order (dataset.LengthBucketSampler)
    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.group_by_length and hasattr(dataset, "lengths"):
            return LengthBucketSampler(
                dataset.lengths(), self.args.train_batch_size, seed=self.args.data_seed or self.args.seed
            )
        if self.batch_rebalance and hasattr(dataset, "lengths"):
            # Built here rather than by train_sampling_strategy="batch_rebalance": the
            # lengths come from the dataset without encoding it again, and the order
            # follows --seed (the Trainer's own would always use 42). The Trainer passes
            # it as a batch sampler and keeps accelerate from sharding it a second time.
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
        prm = self.accelerator.unwrap_model(model)
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            logger.info("packing: not checked against padding under DeepSpeed / FSDP")
            return True
        ids, pos = inputs["input_ids"], inputs["position_ids"]
        pad = pad_id(prm.tokenizer)
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

    # ---- evaluation while training: held-out metrics (evaluate.HeldOut) through the
    # Trainer's own flow: _maybe_log_save_evaluate -> _evaluate -> evaluate, then
    # _determine_best_metric (best_metric, best_model_checkpoint) and the save.
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Held-out metrics of the model as it is now (``evaluate.HeldOut``: one batched
        scoring pass, the model in eval mode): logged with the ``eval_`` prefix, the runtime
        and throughput added, ``on_evaluate`` called, as the Trainer's own ``evaluate``.
        Every process scores all of the held-out data (the same batches, so sharded
        models' collective forwards stay in step) and gets the same metrics."""
        data = eval_dataset if eval_dataset is not None else self.eval_dataset
        if not isinstance(data, HeldOut):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        self._memory_tracker.start()
        start = time.time()
        model = self.accelerator.unwrap_model(self.model)
        metrics = {f"{metric_key_prefix}_{k}": float(v) for k, v in data.metrics(model).items()}
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(data)))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    def _load_best_model(self):
        """``load_best_model_at_end``: the best checkpoint's weights, read from this
        trainer's own checkpoint format (``_load_from_checkpoint``)."""
        if self.is_deepspeed_enabled:  # the DeepSpeed engine's own checkpoint
            return super()._load_best_model()
        logger.info(
            "loading the best model from %s (%s = %s)",
            self.state.best_model_checkpoint,
            self.args.metric_for_best_model,
            self.state.best_metric,
        )
        self._load_from_checkpoint(self.state.best_model_checkpoint)

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


class NonFiniteStop(TrainerCallback):
    """Lets go of the step's rows once its gradients have passed ``PRMTrainer._get_grad_norm``'s
    check (a NaN or inf gradient, from a finite loss too, e.g. an overflow, stops training
    before the optimiser step)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        # The gradient check itself is in PRMTrainer._get_grad_norm (the norm the Trainer
        # computes anyway); here the step's rows are let go once it has passed.
        self.trainer._step_rows = []
