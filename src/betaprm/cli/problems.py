"""What `betaprm aca` and `betaprm search` share: the problems (the chain-arithmetic test
split or a problems file), the PRM that scores, the generator, the answer check, and the
settings a resumed --out must match; with `betaprm label`, the generation options, whose
default backend is the demo's chain-arithmetic policy (``synth``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..aca import accuracy_phrase
from ..answers import AnswerChecker, final_answer
from ..data.records import problem_fields, read_objects
from ..distributed import process_device, processes, shared_output
from ..errors import BetaPRMInputError
from ..generation.factory import BACKEND_HELP, RUNTIME_SETTINGS, BackendOptions, build_generator
from ..image_files import ImageRefused, read_image, resolve_image
from ..options import opt as _f
from ..progress import ProgressOptions
from ..provenance import (
    OutputOptions,
    check_paths,
    config_file_of,
    fingerprint,
    model_fingerprint,
    settings_of,
)
from ..synth import World, WorldConfig, synth_answer, synth_is_correct, synth_tasks
from ..synth.experiment import split_seeds
from ..types import Task
from .scoring_options import LoadOptions


@dataclass
class GenerationOptions(BackendOptions):
    """``BackendOptions`` with the demo's chain-arithmetic policy (registered as ``synth`` by
    ``betaprm.synth``) as one more backend, and the default one."""

    backend: str = _f("synth", "synth (the chain-arithmetic policy), " + BACKEND_HELP)


@dataclass
class ProblemOptions(OutputOptions, LoadOptions, ProgressOptions):
    model: str = _f(
        "",
        "the PRM that scores: a BetaPRM (betaprm train output), or a plain causal LM scored zero-shot (its Yes/No "
        "logits; kappa the constant 4.0): a folder, or a hub name OWNER/NAME[@REVISION]",
        required=True,
    )
    out: str = _f("", "JSONL file of per-problem records (appended; a rerun resumes)", required=True)
    problems: str | None = _f(
        None,
        "JSONL problems with id, question and, for an accuracy, answer; optional images (paths relative to the "
        "file's folder, and inside it) (default: the chain-arithmetic test split)",
    )
    image_root: str | None = _f(
        None,
        "the folder the problems' image paths are relative to and must stay inside (default: the problems file's "
        "folder); images go only to a policy that takes them (--backend openai --endpoint chat) and a "
        "vision-language PRM",
    )
    world_config: str | None = _f(None, "chain-arithmetic world settings (JSON), as for betaprm demo")
    seed: int = _f(0, "the demo seed whose test split to use, and the sampling seed")
    n_problems: int = _f(1000, "chain-arithmetic problems (the demo's test split has 1000)")
    device: str = _f("auto", "PRM device: auto, cpu, cuda, ...")

    def problem_checks(self) -> list[str]:
        bad = self.backend_problems() + self.batch_problems()
        if self.n_problems < 1:
            bad.append(f"--n-problems must be >= 1, got {self.n_problems}")
        if self.problems is None and self.backend != "synth":
            bad.append(
                f"--backend {self.backend} needs --problems (text problems); the chain-arithmetic world is generated "
                "by --backend synth"
            )
        if self.image_root is not None and self.problems is None:
            bad.append("--image-root is the folder of a problems file's images; give it with --problems")
        elif self.image_root is not None and not os.path.isdir(self.image_root):
            bad.append(f"--image-root {self.image_root}: no such folder; fix: give the folder that holds the images")
        if self.problems is not None and self.backend == "synth":
            bad.append(
                "--backend synth continues chain-arithmetic problems only; give --backend transformers/openai/vllm "
                "for --problems"
            )
        return bad


# Options that do not change a record (batching, device, paths, how a server is reached,
# how many problems): left out of the settings a resumed --out must match. The model
# and the world's settings file enter as fingerprints of their contents.
NOT_RESULTS = {
    "model",
    "policy",
    "out",
    "problems",
    "image_root",
    "n_problems",
    "world_config",
    "batch_size",
    "max_batch_tokens",
    "device",
} | RUNTIME_SETTINGS


def result_settings(cfg, not_results=NOT_RESULTS) -> dict:
    """What makes --out's records: compared with OUT.meta.json when a run resumes."""
    return {
        "model": model_fingerprint(cfg.model),
        "policy": fingerprint(cfg.policy) if cfg.policy else "",
        "world_config": fingerprint(cfg.world_config) if cfg.world_config else None,
        **settings_of(cfg, not_results),
    }


def run_with_output(cfg, run, not_results=NOT_RESULTS):
    """``run(cfg)`` with --out checked against its earlier settings and locked, before the
    model loads: a wrong resume stops at once."""
    from ..model import model_kind  # torch: loaded when a command runs, not for --help

    plots = getattr(cfg, "plots", None)
    frontier = [f.strip() for f in (getattr(cfg, "frontier", None) or "").split(",") if f.strip()]
    check_paths(
        [
            ("--model", cfg.model),
            ("--policy", cfg.policy),
            ("--problems", cfg.problems),
            ("--world-config", cfg.world_config),
            ("--baseline", getattr(cfg, "baseline", None)),
            *(("--frontier", f) for f in frontier),
            config_file_of(cfg),
        ],
        [
            ("--out", cfg.out),
            ("--plots (aca_tokens.png)", f"{plots}/aca_tokens.png" if plots else None),
            ("--plots (aca_frontier.png)", f"{plots}/aca_frontier.png" if plots and frontier else None),
        ],
        [("--plots", plots)],
    )
    where = {
        "model": cfg.model,
        "model_kind": model_kind(cfg.model),
        "policy": cfg.policy,
        "problems": cfg.problems,
        "world_config": cfg.world_config,
    }
    # Under torchrun rank 0 checks and locks --out; the processes share the problems.
    procs = processes()
    with shared_output(procs, cfg.out, result_settings(cfg, not_results), where, adopt=cfg.adopt_output):
        return run(cfg)


def setup(cfg) -> SimpleNamespace:
    """The PRM and its scorer, the tasks, the generator and the answer check of a run:
    ``prm, scorer, tasks, generator, answer_of, is_correct, world`` (None on a problems
    file) and ``close()`` (stops the answer checker's workers)."""

    from ..model import load_prm  # torch: loaded when a command runs, not for --help
    from ..scoring import PRMScorer

    # A problems file is read, its images checked, before the model loads: a bad path stops at once.
    where: dict = {}
    tasks = read_problems(cfg.problems, cfg.image_root, where) if cfg.problems is not None else None
    procs = processes()
    device = process_device(cfg.device)  # under torchrun: this process's own GPU
    prm, kind = load_prm(cfg.model, device, dtype=cfg.dtype)
    if procs.main:
        print(
            f"{cfg.model} ({kind}) scores the candidates" + (f", {procs.world} processes" if procs.world > 1 else "")
        )
    run = SimpleNamespace(
        prm=prm, scorer=PRMScorer(prm, cfg.batch_size, cfg.max_batch_tokens), close=lambda: None, procs=procs
    )
    if cfg.problems is None:
        run.world = World(WorldConfig.from_json(cfg.world_config) if cfg.world_config else World().cfg)
        run.tasks = synth_tasks(run.world.sample_problems(cfg.n_problems, split_seeds(cfg.seed).test_problems, "test"))
        tok = prm.tokenizer
        run.generator = build_generator(
            cfg, seed=cfg.seed, world=run.world, count_tokens=lambda t: len(tok.encode(t, add_special_tokens=False))
        )
        run.answer_of, run.is_correct = synth_answer, synth_is_correct
        return run
    run.world = None
    run.tasks = tasks
    with_images = next((t for t in tasks if t.images), None)
    if with_images is not None and not prm.is_vision:
        raise BetaPRMInputError(
            f"{where[with_images.id]}: field 'images': {cfg.model} is a text-only PRM and cannot score images, so "
            "they are not sent to the policy either; fix: use a vision-language BetaPRM or remove the images"
        )
    run.generator = build_generator(cfg, seed=cfg.seed)
    if with_images is not None and not getattr(run.generator, "takes_images", False):
        raise BetaPRMInputError(
            f"{where[with_images.id]}: field 'images': --backend {cfg.backend}"
            + (f" --endpoint {cfg.endpoint}" if cfg.backend == "openai" else "")
            + " does not take images, so none are sent; fix: --backend openai --endpoint chat with a "
            "vision-language policy, or remove the images"
        )
    checker = AnswerChecker()
    run.answer_of, run.close = final_answer, checker.close

    def is_correct(task, ans):
        return None if task.answer is None else checker.check(task.answer, ans)

    run.is_correct = is_correct
    return run


def read_problems(path: str, image_root: str | None = None, where: dict | None = None) -> list:
    """Problems (id, question, optional answer and images) with file:line errors. Image
    paths are relative to ``image_root`` (default: the file's folder) and must stay inside
    it; ``where``, when given, receives each problem's ``file:line`` by id."""
    tasks, seen = [], set()
    for at, r in read_objects(
        path,
        ("id", "question"),
        "id, question and, for an accuracy, answer (the reference)",
        flag="--problems",
    ):
        # Without an answer the problem is still solved: its record has the choice, no verdict.
        if "answer" in r:
            rid, question, answer = problem_fields(r, at)
        else:
            rid, question, _ = problem_fields({**r, "answer": "-"}, at)
            answer = None
        if rid in seen:
            raise BetaPRMInputError(f"{at}: id {rid!r} appears twice; ids must be unique")
        seen.add(rid)
        if where is not None:
            where[rid] = at
        tasks.append(Task(rid, question, answer, images=_images(r, at, path, image_root)))
    return tasks


def _images(r: dict, where: str, path: str, image_root: str | None = None) -> list[str]:
    """A problem's ``images`` as real paths inside ``image_root`` (default: the problems
    file's folder), each decoded as an image within the size caps: they may be sent to a
    server, so nothing else is let through."""
    imgs = r.get("images", [])
    if not isinstance(imgs, list) or not all(isinstance(p, str) and p for p in imgs):
        raise BetaPRMInputError(f"{where}: field 'images' must be a list of image paths, got {imgs!r:.80}")
    root = image_root if image_root is not None else Path(path).parent
    out = []
    for p in imgs:
        try:
            real = resolve_image(p, root)
            read_image(real)
        except ImageRefused as e:
            raise BetaPRMInputError(f"{where}: field 'images': {e}") from None
        out.append(real)
    return out


def summary_line(name: str, s: dict, out: str, extra: str = "") -> str:
    """The closing line of a run: accuracy (or that there were no answers), tokens."""
    return (
        f"{name}: {s['n']} problems, {accuracy_phrase(s)}, {s['tokens']} generated tokens "
        f"({s['tokens'] / max(s['n'], 1):.0f} per problem){extra}"
        + (f", {s['check_failed']} answer checks failed" if s["check_failed"] else "")
        + f" -> {out}"
    )
