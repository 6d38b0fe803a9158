"""The scoring flags shared by every command that runs a PRM forward pass: batching, the
dtype the model loads in, truncation, progress bars."""

from __future__ import annotations

from dataclasses import dataclass

from ..distributed import discard_parts, processes, shared_output
from ..formatting import TRUNCATE_MODES
from ..options import DEFAULT_MAX_BATCH_TOKENS, opt
from ..progress import ProgressOptions, progress_bar
from ..provenance import (
    check_paths,
    config_file_of,
    fingerprint,
    model_fingerprint,
    part_files,
    settings_of,
    write_result,
)


@dataclass
class BatchOptions:
    max_batch_tokens: int = opt(
        DEFAULT_MAX_BATCH_TOKENS,
        "padded tokens per PRM forward pass: traces are sorted by length and packed up to this budget, which bounds "
        "memory whatever their lengths (lower it if memory runs out). Vision-language PRMs batch --batch-size traces "
        "(default 8) instead: an image's token count is known only after its processor has run",
    )
    batch_size: int | None = opt(
        None, "at most this many traces per PRM forward pass (default: no cap beyond --max-batch-tokens)"
    )

    def batch_problems(self) -> list[str]:
        bad = []
        if self.max_batch_tokens < 1:
            bad.append(f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}")
        if self.batch_size is not None and self.batch_size < 1:
            bad.append(f"--batch-size must be >= 1, got {self.batch_size}")
        return bad


DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class LoadOptions:
    """The dtype of every command that loads a PRM (``load_prm``'s ``dtype``)."""

    dtype: str = opt(
        "auto",
        "the dtype the model's weights load in: auto (the checkpoint's own, as transformers reads it from "
        "config.json), float32, bfloat16 or float16 (half float32's memory; bfloat16 for GPUs that have it). mu "
        "and kappa are computed in float32 from the marker's hidden state whatever it is: scores move by the "
        "backbone's rounding only",
        choices=DTYPES,
        added=True,
    )


@dataclass
class ScoringOptions(BatchOptions, LoadOptions, ProgressOptions):
    truncate: str = opt(
        "error",
        "a trace longer than the model's positions: error (stop, naming it) or steps (score the whole steps that "
        "fit; the rest get no score). Text PRMs only",
        choices=TRUNCATE_MODES,
    )

    def scoring_problems(self) -> list[str]:
        return self.batch_problems()  # --truncate's choices: checked by config_from_args

    def score_with_progress(
        self, prm, traces, names, desc: str = "scoring", resume: tuple[str, dict] | None = None, keys=None
    ):
        """``score_traces`` with these options and a progress bar: every trace's scores, in order.

        Under torchrun the processes share the traces (``scoring.score_shared``, the single
        process's forward passes dealt out by tokens): rank 0 gets every score, the others
        None (their share is done; rank 0 reports). ``resume``: ``(OUT, settings)`` of the
        command's --out: while several processes score, each keeps its scores in
        ``OUT.scores.partR`` (their settings checked in ``OUT.scores.meta.json``, as a
        resumable output's), so a run killed mid-way resumes under any number of processes,
        scoring each trace once (``keys``: the traces' ids there, by default their indices);
        ``write_evaluation`` removes them with the results written.
        A lone process with nothing to resume scores in memory, as it always has."""
        from ..scoring import score_shared, score_traces

        procs = processes()
        state = scores_path(resume[0]) if resume else None
        if procs.world == 1 and (state is None or not part_files(state)):
            with progress_bar(len(traces), desc, "trace", disable=self.disable_tqdm) as bar:
                return score_traces(
                    prm,
                    traces,
                    batch_size=self.batch_size,
                    progress=bar.update,
                    max_batch_tokens=self.max_batch_tokens,
                    truncate=self.truncate,
                    names=names,
                )
        kw = dict(
            batch_size=self.batch_size,
            max_batch_tokens=self.max_batch_tokens,
            truncate=self.truncate,
            progress=None if self.disable_tqdm else desc,
        )
        if state is None:
            return score_shared(prm, traces, procs, names, **kw)
        with shared_output(procs, state, resume[1], {"scores of": resume[0]}, flag="--out"):
            return score_shared(prm, traces, procs, names, state, keys, **kw)


def scores_path(out) -> str:
    """Where the processes of an evaluation writing ``out`` keep their scores until it is
    written: ``OUT.scores`` (its part files and sidecar; the file itself is never written)."""
    return f"{out}.scores"


# Options that do not change an evaluation's results (paths, batching, device): left out of
# the settings recorded in its --out JSON. The model and the data enter as fingerprints.
EVALUATION_NOT_RESULTS = {
    "model",
    "data",
    "out",
    "plots",
    "log_samples",
    "device",
    "batch_size",
    "max_batch_tokens",
    "trust_remote_code",
}


def evaluation_settings(cfg) -> dict:
    """The settings that made an evaluation: the model's and the data's fingerprints and
    every option that changes the numbers (``--limit`` and ``--seed`` among them)."""
    return {
        "model": model_fingerprint(cfg.model),
        "data": fingerprint(cfg.data),
        **settings_of(cfg, EVALUATION_NOT_RESULTS),
    }


def write_evaluation(cfg, res: dict) -> None:
    """``res`` to ``cfg.out`` (JSON) with the settings that made it (``evaluation_settings``)."""
    write_result(cfg.out, res, evaluation_settings(cfg), {"model": cfg.model, "data": cfg.data})
    discard_parts(scores_path(cfg.out))  # the scores kept for a resume: the results are written


def check_eval_outputs(cfg, plot_files=(), outputs=()) -> None:
    """--out and --plots (and the ``plot_files`` written there), and any other ``outputs``
    (flag, path), checked before the model loads: an unwritable path, or one that is --data
    or --model, would otherwise fail after the whole evaluation, losing its results."""
    plots = [(f"--plots ({name})", f"{cfg.plots}/{name}") for name in plot_files] if cfg.plots else []
    check_paths(
        [("--data", cfg.data), ("--model", cfg.model), config_file_of(cfg)],
        [("--out", cfg.out), *outputs, *plots],
        [("--plots", cfg.plots)],
    )
