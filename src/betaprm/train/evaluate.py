"""Evaluation while training: held-out data (``--eval-data``, or ``--eval-fraction`` of
``--data``'s problems) scored in one batched pass and turned into metrics with
``evaluation.calibration`` (counts) or ``evaluation.processbench`` (step-labelled items).

``HeldOut`` is the Trainer's ``eval_dataset``; ``PRMTrainer.evaluate`` calls its
``metrics`` and does the rest as the Trainer's own ``evaluate`` does (``eval_`` keys,
``eval_runtime``, the loggers, ``on_evaluate``), so ``eval_steps``,
``metric_for_best_model``, ``best_metric`` / ``best_model_checkpoint`` and
``load_best_model_at_end`` behave as with any transformers Trainer.

Metrics of counts records, per scored step (nats where a likelihood):

- ``loss``: the training objective on the held-out steps (beta-binomial: NLL +
  lambda_reg * regulariser; soft-ce / hard-ce: the cross-entropy).
- ``nll``: -log P(K | N) under the model's predictive distribution: the Beta-Binomial at
  (mu, kappa) for a BetaPRM, the binomial at mu for the standard PRM (soft-ce / hard-ce,
  whose kappa is untrained), the binomial coefficient included.
- ``mae``: mean |mu - K/N|; ``ece``: expected calibration error of mu against K/N (10
  equal-width bins); ``brier``: mean (mu - K/N)^2.
- ``coverage``: the share of steps whose K lies in the central 90% interval of that same
  predictive distribution.

ProcessBench items: ``f1`` is the official average F1 (percent; mu > 0.5 is a correct step,
the first step that is not is the predicted first error), nan where the official script
has nan (a subset without erroneous or without correct items); ``f1_SUBSET``,
``error_acc_SUBSET`` and ``correct_acc_SUBSET`` per subset.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..beta import beta_binomial_nll, evidence_regularizer, soft_ce_loss
from ..data.records import Record, read_records
from ..data.sources import iter_splits
from ..errors import BetaPRMInputError
from ..evaluation.calibration import evaluate_counts, flat_counts
from ..evaluation.processbench import PBItem, evaluate_processbench, read_processbench
from ..formatting import encode_traces, fit_to_length
from ..options import DEFAULT_MAX_BATCH_TOKENS
from ..scoring import score_token_ids, score_traces
from .config import BEST_METRICS, TrainConfig
from .dataset import encode_records

PROCESSBENCH_THRESHOLD = 0.5
"""A step is correct when mu is above this (ProcessBench's published convention)."""
INTERVAL_LEVEL = 0.9


def split_by_question(records: Sequence[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """``--eval-fraction``: (training, held-out) records, the held-out part being
    ``round(fraction * problems)`` of the distinct question texts (at least one), drawn with
    ``seed``; every record of a problem goes to the same side. The draw depends on the set
    of questions only, not on the records' order."""
    questions = sorted({r.question for r in records})
    n_held = max(1, round(fraction * len(questions)))
    if n_held >= len(questions):
        raise BetaPRMInputError(
            f"--eval-fraction {fraction}: --data has {len(questions)} distinct question(s), so holding out "
            f"{n_held} leaves none to train on; give more problems or a smaller --eval-fraction"
        )
    random.Random(seed).shuffle(questions)
    held = set(questions[:n_held])
    return [r for r in records if r.question not in held], [r for r in records if r.question in held]


def eval_format(spec: str) -> str:
    """``counts`` or ``processbench``, from the first record's fields (``label`` and
    ``steps`` without ``mc_correct``: ProcessBench)."""
    for _, rows in iter_splits(spec, "--eval-data"):
        for line, obj, problem, _ in rows:
            if problem is not None:
                raise BetaPRMInputError(f"--eval-data {spec}:{line}: {problem.message}; fix: {problem.fix}")
            if isinstance(obj, dict) and "label" in obj and "steps" in obj and "mc_correct" not in obj:
                return "processbench"
            return "counts"
    raise BetaPRMInputError(f"--eval-data {spec}: holds no records")


@dataclass
class HeldOut:
    """Held-out data ready to score: token ids (or, for a vision-language PRM, traces)
    and what the metrics compare them with. The Trainer's ``eval_dataset``."""

    kind: str  # "counts" or "processbench"
    source: str
    objective: str
    lambda_reg: float = 0.05
    hard_threshold: float = 0.5
    token_ids: list[list[int]] = field(default_factory=list)
    traces: list[tuple] | None = None  # vision-language PRMs: (question, steps, images)
    counts: list[dict] = field(default_factory=list)  # counts: mc_correct, mc_total of the kept steps
    items: list[PBItem] = field(default_factory=list)  # processbench
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    pack: bool = True
    n_truncated: int = 0
    n_left_out: int = 0  # held-out items longer than --max-length that --truncate left out

    def __len__(self) -> int:
        return len(self.traces) if self.traces is not None else len(self.token_ids)

    def score(self, prm) -> list:
        """One pass over the held-out traces (the model put in eval mode and back)."""
        if self.traces is not None:
            was_training = prm.training
            prm.eval()
            try:
                return score_traces(prm, self.traces)
            finally:
                prm.train(was_training)
        return score_token_ids(prm, self.token_ids, max_batch_tokens=self.max_batch_tokens, pack=self.pack)

    def metrics(self, prm) -> dict[str, float]:
        """The metrics of the module docstring, keys without the ``eval_`` prefix."""
        scores = self.score(prm)
        if self.kind == "processbench":
            return processbench_metrics(self.items, [s.mu for s in scores])
        return counts_metrics(*flat_counts(self.counts, scores), self.objective, self.lambda_reg, self.hard_threshold)


def counts_metrics(mu, kappa, k, n, objective: str, lambda_reg: float, hard_threshold: float) -> dict[str, float]:
    """Held-out metrics of per-step (mu, kappa, K, N) for a model trained with ``objective``."""
    beta = objective == "beta-binomial"
    res = evaluate_counts(mu, kappa, k, n, beta=beta, levels=(INTERVAL_LEVEL,))
    dist = "beta_binomial" if beta else "binomial_at_mu"
    t = [torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (mu, kappa, k, n)]
    if beta:
        loss = beta_binomial_nll(*t).mean() + lambda_reg * evidence_regularizer(*t).mean()
    else:
        target = t[2] if objective == "soft-ce" else (t[2] / t[3] > hard_threshold).double() * t[3]
        loss = soft_ce_loss(t[0], target, t[3]).mean()
    return {
        "loss": float(loss),
        "nll": res["nll"][dist],
        "mae": float(np.abs(np.asarray(mu, dtype=np.float64) - np.asarray(k) / np.asarray(n)).mean()),
        "ece": res["ece"],
        "brier": res["brier"],
        "coverage": res["intervals"][f"{dist}_{INTERVAL_LEVEL:g}"]["coverage"],
    }


def processbench_metrics(items: Sequence[PBItem], step_scores) -> dict[str, float]:
    res = evaluate_processbench(items, step_scores, threshold=PROCESSBENCH_THRESHOLD)
    out = {"f1": res["average_f1"]}
    for sub, m in res["subsets"].items():
        out.update({f"f1_{sub}": m["f1"], f"error_acc_{sub}": m["error_acc"], f"correct_acc_{sub}": m["correct_acc"]})
    return out


def read_eval_records(cfg: TrainConfig) -> tuple[str, list]:
    """``--eval-data``'s format and its records (``Record``s or ``PBItem``s), read and
    checked before any model loads."""
    fmt = eval_format(cfg.eval_data)
    if fmt == "processbench":
        return fmt, read_processbench(cfg.eval_data, flag="--eval-data")
    loaded = read_records(cfg.eval_data, kind="counts", marker=cfg.marker, on_error=cfg.on_error, flag="--eval-data")
    if not loaded.records:
        raise BetaPRMInputError(f"--eval-data {cfg.eval_data}: no usable records")
    return fmt, loaded.records


def held_out_data(prm, cfg: TrainConfig, fmt: str, records: list, source: str, packing: bool) -> HeldOut:
    """The held-out records encoded as training encodes its own (``--max-length``,
    ``--truncation``), ready for ``HeldOut.metrics``."""
    h = HeldOut(
        kind=fmt,
        source=source,
        objective=cfg.objective,
        lambda_reg=cfg.lambda_reg,
        hard_threshold=cfg.hard_threshold,
        max_batch_tokens=max(cfg.max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS, cfg.max_length),
        pack=packing,
    )
    vision = getattr(prm, "processor", None) is not None
    if fmt == "counts":
        ds = encode_records(prm, records, cfg.max_length, cfg.truncate)
        if len(ds) == 0:
            raise BetaPRMInputError(f"{source}: no held-out record fits --max-length {cfg.max_length}; raise it")
        h.n_truncated = ds.stats.truncated_records
        if vision:  # MultimodalCountsDataset: (question, kept steps, images, K, N, index)
            h.traces = [(q, steps, images) for q, steps, images, *_ in ds.items]
            h.counts = [{"mc_correct": k, "mc_total": n} for *_, k, n, _ in ds.items]
        else:
            h.token_ids = [e["input_ids"] for e in ds.examples]
            h.counts = [{"mc_correct": e["mc_correct"], "mc_total": e["mc_total"]} for e in ds.examples]
        return h
    if vision:
        h.traces = [(it.problem, it.steps, []) for it in records]
        h.items = list(records)
        return h
    ids = encode_traces(
        prm.tokenizer, prm.config.marker_id, [(it.problem, it.steps) for it in records], prm.config.trace_format
    )
    for it, t in zip(records, ids):
        cut, kept = fit_to_length(t, prm.config.marker_id, cfg.max_length, prm.config.marker_repeat)
        if kept == 0 or (kept < len(it.steps) and cfg.truncate == "reject"):
            h.n_left_out += 1  # nothing to score, or --truncate reject: left out, as training leaves them out
            continue
        h.n_truncated += kept < len(it.steps)
        h.token_ids.append(cut)
        h.items.append(it)
    if not h.items:
        raise BetaPRMInputError(f"{source}: no held-out item fits --max-length {cfg.max_length}; raise it")
    return h


@dataclass
class EvalPlan:
    """What a run evaluates on: the held-out records (``Record``s or ``PBItem``s), their
    format, where they came from, and the metric that picks the best model."""

    fmt: str
    source: str
    records: list
    metric: str

    def held_out(self, prm, cfg: TrainConfig, packing: bool, say) -> HeldOut:
        h = held_out_data(prm, cfg, self.fmt, self.records, self.source, packing)
        say(
            f"evaluating {len(h)} held-out {'items' if self.fmt == 'processbench' else 'records'} every "
            f"{cfg.eval_steps or cfg.save_steps} steps and at the end"
            + (f" ({h.n_truncated} cut to --max-length)" if h.n_truncated else "")
            + (f" ({h.n_left_out} longer than --max-length left out)" if h.n_left_out else "")
            + f"; best model by eval_{self.metric}"
        )
        return h

    def training_args(self, cfg: TrainConfig) -> dict:
        """The ``TrainingArguments`` of evaluation while training."""
        return dict(
            eval_strategy="steps",
            eval_steps=cfg.eval_steps or cfg.save_steps,
            metric_for_best_model=f"eval_{self.metric}",
            greater_is_better=BEST_METRICS[self.metric],
            load_best_model_at_end=cfg.load_best_model_at_end,
            eval_on_start=cfg.eval_on_start,
        )


def plan_evaluation(cfg: TrainConfig, records: list[Record], say) -> tuple[list[Record], EvalPlan | None]:
    """The training records and the evaluation plan (None: no held-out data): ``--eval-fraction``
    splits ``records`` by problem; ``--eval-data`` is read and checked. Before any model loads."""
    if cfg.eval_fraction:
        records, held = split_by_question(records, cfg.eval_fraction, cfg.seed)
        fmt, source = "counts", f"--eval-fraction {cfg.eval_fraction:g} of {cfg.data}"
        say(
            f"held out {len(held)} records of {len({r.question for r in held})} problems ({source}, seed "
            f"{cfg.seed}); training on {len(records)}"
        )
    elif cfg.eval_data:
        fmt, held = read_eval_records(cfg)
        source = f"--eval-data {cfg.eval_data}"
        say(f"held out: {len(held)} {'ProcessBench items' if fmt == 'processbench' else 'records'} ({source})")
    else:
        return records, None
    metric = cfg.best_metric_name or ("f1" if fmt == "processbench" else "nll")
    if (metric == "f1") != (fmt == "processbench"):
        raise BetaPRMInputError(
            f"--metric-for-best-model {metric}: {source} holds "
            + (
                "ProcessBench items, which give f1 only"
                if fmt == "processbench"
                else f"counts, which give {', '.join(m for m in BEST_METRICS if m != 'f1')} (f1 is for ProcessBench "
                "items)"
            )
        )
    return records, EvalPlan(fmt, source, held, metric)


def eval_summary(trainer, source: str) -> dict:
    """The evaluation part of ``train_summary.json``: every evaluation's metrics by step
    (from the log history, so a resumed run has its earlier ones), the last, the best
    (``metric_for_best_model``, ``best_metric``, ``best_model_checkpoint``) and those of
    the final model (the best checkpoint's with ``--load-best-model-at-end``, else the last).
    The best step can be one evaluated but not saved (when --eval-steps does not divide
    --save-steps); the best checkpoint is then an earlier one, as the Trainer keeps it."""
    state, args = trainer.state, trainer.args
    evals = [
        {k: v for k, v in h.items() if k.startswith("eval_") or k == "step"}
        for h in state.log_history
        if any(k.startswith("eval_") and k not in _SPEED_KEYS for k in h)
    ]
    last = evals[-1] if evals else None
    best_step = state.best_global_step or None
    best = next((e for e in reversed(evals) if e["step"] == best_step), None) if best_step else None
    loaded_best = bool(args.load_best_model_at_end and state.best_model_checkpoint)
    ckpt_step = int(Path(state.best_model_checkpoint).name.rsplit("-", 1)[-1]) if state.best_model_checkpoint else None
    at_ckpt = next((e for e in reversed(evals) if e["step"] == ckpt_step), None)
    return {
        "data": source,
        "eval_steps": args.eval_steps,
        "metric_for_best_model": args.metric_for_best_model,
        "greater_is_better": args.greater_is_better,
        "best_metric": state.best_metric,
        "best_step": best_step,
        "best_model_checkpoint": state.best_model_checkpoint,
        "final_model_is": "best checkpoint" if loaded_best else "last step",
        "best": best,
        "last": last,
        "final_model": at_ckpt if loaded_best else last,
        "history": evals,
    }


_SPEED_KEYS = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def undefined_metric_warning(summary: dict, load_best: bool) -> str | None:
    """The warning for a best-model metric that was undefined (nan) at every evaluation,
    else None: no checkpoint can be better than another by it, so the Trainer keeps none
    as the best and ``--load-best-model-at-end`` ends on the last step."""
    metric = summary["metric_for_best_model"]
    values = [e.get(metric) for e in summary["history"]]
    if not values or any(v is not None and v == v for v in values):
        return None
    return (
        f"{metric} was undefined (nan) at all {len(values)} evaluations on {summary['data']}: "
        + ("--load-best-model-at-end kept the last step, not a best checkpoint. " if load_best else "")
        + "F1 needs both erroneous and correct items, the count metrics need scored steps; fix: give held-out data "
        "with both classes, or another --metric-for-best-model"
    )


def card_results(metrics: dict, cfg: TrainConfig) -> dict:
    """The model card's evaluation (``betaprm.card.model_card``'s ``results`` and
    ``eval_data``): the final model's held-out metrics (nan, undefined, as None) and the data
    they come from: --eval-data, or --eval-fraction's share of --data's problems."""
    results = {
        k: None if v is None or v != v else float(v)
        for k, v in metrics.items()
        if k.startswith("eval_") and k not in _SPEED_KEYS
    }
    if cfg.eval_data:
        data = {"name": cfg.eval_data, "split": None}
    else:
        data = {"name": cfg.data, "split": f"held-out {cfg.eval_fraction:g} of its problems"}
    return {"results": results, "eval_data": {**data, "step": metrics["step"]}}
