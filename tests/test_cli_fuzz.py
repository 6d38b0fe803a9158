"""The command line under hostile option values: every command's numeric options get
nan, infinities, numbers past float range, integers of hundreds of digits and negatives;
its output paths get its own inputs, links to them, paths under a file and folders that
refuse new files; its input paths get missing files, folders and link loops. Each run
ends with exit status 0 or 2, prints no traceback, and leaves every input as it was.

The options are read from the commands' config dataclasses, so a new option is fuzzed
without a change here. Runs are in-process (``betaprm.cli.main``) on tiny inputs: a value
refused at start costs milliseconds, one accepted runs the command for real. ``serve``
stops where it would start serving (serve.run_server is replaced: a server blocks), ``demo``
is checked as far as its config (its run is the slow tier's)."""

import dataclasses
import hashlib
import json
import os
import time
import typing
from pathlib import Path

import pytest

from betaprm.cli import COMMANDS, build_parser, main
from betaprm.cli.flags import config_from_args
from betaprm.errors import BetaPRMInputError

from .helpers import make_counts, make_lm_dir
from .test_authors_checkpoint import _their_checkpoint

HUGE = "1" + "0" * 400
HOSTILE_FLOATS = ["nan", "inf", "-inf", "1e400", "-1e9", HUGE]
HOSTILE_INTS = [HUGE, "-" + HUGE, "-1"]
TIME_BOUND_S = 240  # a hang, not a slow run: the whole harness takes well under a minute

# Options that name files or folders: what each command reads, and what it writes.
INPUT_FIELDS = {"model", "data", "input", "pools", "problems", "eval_data", "baseline", "frontier", "world_config"}
OUTPUT_FIELDS = {"out", "output", "output_dir", "rejects", "plots", "log_samples"}
# Options whose hostile values need not be refused: a seed or a port may be any integer the
# command then checks itself; they still must not crash. Nothing is left out.


def _sha(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Tiny inputs of every kind, in one folder whose contents must never change."""
    from betaprm import BetaPRM

    root = tmp_path_factory.mktemp("inputs")
    lm = make_lm_dir(root / "lm", hidden=16, layers=1)
    BetaPRM.from_backbone(str(lm)).save_pretrained(root / "prm")
    make_counts(root / "counts.jsonl", n=6)
    pool = {
        "id": "p0",
        "question": "what is 3 + 4?",
        "answer": "7",
        "candidates": [
            {"steps": ["3 + 4 = 7", "The answer is \\boxed{7}"], "mu": [0.9, 0.8], "kappa": [4, 4]},
            {"steps": ["3 + 4 = 8", "The answer is \\boxed{8}"], "mu": [0.3, 0.2], "kappa": [2, 2]},
        ],
    }
    (root / "pools.jsonl").write_text("".join(json.dumps({**pool, "id": f"p{i}"}) + "\n" for i in range(3)))
    pb = [
        {"id": f"g{i}", "problem": "add", "steps": ["1 + 2 = 3", "3 + 4 = 8"], "label": label}
        for i, label in enumerate([1, -1, 0, -1])
    ]
    (root / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pb))
    trl = [{"prompt": "add", "completions": ["1 + 2 = 3", "3 + 4 = 8"], "labels": [True, False]}] * 3
    (root / "trl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trl))
    _their_checkpoint(root / "authors")  # a checkpoint of the paper authors' code, for convert-model
    (root / "a-file").write_text("x\n")
    (root / "opts.yaml").write_text("{}\n")  # a --config file of no options
    (root / "loop").symlink_to(root / "loop")
    return root


def _bases(i: Path, o: Path) -> dict:
    """Each command's valid, small invocation: flag -> value (None: a switch)."""
    prm, counts, pools = str(i / "prm"), str(i / "counts.jsonl"), str(i / "pools.jsonl")
    small = {"--n-problems": "2", "--device": "cpu"}
    return {
        "train": {
            "--model": str(i / "lm"),
            "--data": counts,
            "--output-dir": str(o / "run"),
            "--max-steps": "1",
            "--global-batch-size": "2",
            "--per-device-train-batch-size": "2",
            "--save-steps": "1",
            "--use-cpu": None,
        },
        "score": {"--model": prm, "--input": pools, "--output": str(o / "scored.jsonl"), "--device": "cpu"},
        "validate": {"": counts},
        "convert": {"--from": "trl", "--input": str(i / "trl.jsonl"), "--output": str(o / "conv.jsonl")},
        "label": {"--out": str(o / "label.jsonl"), "--n": "2", "--n-problems": "2"},
        "aca": {"--model": prm, "--final": "lin", "--budget": "4", "--out": str(o / "aca.jsonl"), **small},
        "search": {"--model": prm, "--n": "2", "--width": "2", "--out": str(o / "search.jsonl"), **small},
        "eval-steps": {
            "--model": prm,
            "--data": str(i / "gsm8k.jsonl"),
            "--out": str(o / "pb.json"),
            "--device": "cpu",
        },
        "eval-bon": {"--pools": pools, "--out": str(o / "bon.json"), "--skip-tuned": None},
        "eval-calibration": {"--model": prm, "--data": counts, "--out": str(o / "cal.json"), "--device": "cpu"},
        "serve": {"--model": prm, "--device": "cpu"},
        "demo": {"--quick": None, "--out": str(o / "demo")},
        "convert-model": {"--from": "authors", "--input": str(i / "authors"), "--output": str(o / "converted")},
    }


def _config_class(command: str):
    """The command's config dataclass (None: plain argparse flags)."""
    module = COMMANDS[command]
    for name in dir(module):
        obj = getattr(module, name)
        if dataclasses.is_dataclass(obj) and isinstance(obj, type) and obj.__module__.startswith("betaprm"):
            source = Path(module.__file__).read_text()
            if f"add_config_args(parser, {name})" in source:
                return obj
    return None


def _numeric_fields(cls, command: str) -> list[tuple[str, bool]]:
    """``(flag, is_int)`` of every int or float option of ``cls`` (without one: of the
    command's argparse flags read by ``cli.flags.number_flag``)."""
    if cls is None:
        parser = build_parser()._subparsers._group_actions[0].choices[command]
        return [
            (a.option_strings[0], a.type.__name__ == "int")
            for a in parser._actions
            if a.option_strings and getattr(a.type, "__name__", "") in ("int", "float") and a.type not in (int, float)
        ]
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        base = t.__args__[0] if typing.get_origin(t) in (typing.Union, __import__("types").UnionType) else t
        if base in (int, float) and t is not bool:
            out.append(("--" + f.name.replace("_", "-"), base is int))
    return out


def _path_flags(command: str, cls, fields: set) -> list[str]:
    if cls is not None:
        names = {f.name for f in dataclasses.fields(cls)} & fields
    else:  # convert, validate: their argparse destinations
        parser = build_parser()._subparsers._group_actions[0].choices[command]
        names = {a.dest for a in parser._actions} & fields
    return ["--" + n.replace("_", "-") for n in sorted(names)]


def _cases(i: Path, o: Path):
    """(command, what, argv overrides) for every hostile value of every option, after the
    command's own base invocation (which must succeed, or the harness proves nothing)."""
    bases = _bases(i, o)
    for command, base in bases.items():
        yield command, "as given", {}
        cls = _config_class(command)
        for flag, is_int in _numeric_fields(cls, command):
            for v in HOSTILE_INTS if is_int else HOSTILE_FLOATS:
                yield command, f"{flag} {v[:12]}", {flag: v}
        own = _own_input(base)
        model = base.get("--model")
        for flag in _path_flags(command, cls, OUTPUT_FIELDS):
            if cls is not None:  # the options' --config file is an input too
                yield (
                    command,
                    f"{flag} its --config file",
                    {"--config": str(i / "opts.yaml"), flag: str(i / "opts.yaml")},
                )
            for what, path in (
                *((("its input", own), ("a link to its input", "LINK")) if own else ()),
                *((("a file of its model", str(Path(model) / "config.json")),) if model else ()),
                ("under a file", str(i / "a-file" / "x")),
                ("a folder refusing files", "/proc/betaprm-fuzz/x"),
            ):
                yield command, f"{flag} {what}", {flag: path}
        for flag in _path_flags(command, cls, INPUT_FIELDS):
            for what, path in (
                ("missing", str(i / "missing" / "x.jsonl")),
                ("a link loop", str(i / "loop")),
                ("a plain file", str(i / "a-file")),
            ):
                yield command, f"{flag} {what}", {flag: path}


def _own_input(base: dict) -> str | None:
    """The command's input file in its base invocation (a file, not the model folder)."""
    return next((v for k, v in base.items() if k in ("", "--data", "--input", "--pools") and Path(v).is_file()), None)


def _argv(command: str, base: dict, over: dict) -> list[str]:
    merged = {**base, **over}
    argv = [command]
    for flag, v in merged.items():
        if flag == "":
            argv.append(v)
        elif v is None:
            argv.append(flag)
        else:  # --flag=VALUE: argparse would read "-inf" alone as an option
            argv.append(f"{flag}={v}")
    return argv


def test_every_option_takes_hostile_values_without_a_traceback_or_a_changed_input(
    inputs, tmp_path, capsys, monkeypatch
):
    import betaprm.serve

    served = []

    def run_server(app, sock, settings, on_started=None):  # a server would block here: the port is bound, closed
        served.append(settings)
        return True

    monkeypatch.setattr(betaprm.serve, "run_server", run_server)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    before = _sha(inputs)
    failures, counts = [], {0: 0, 2: 0}
    start = time.monotonic()
    for n, (command, what, over) in enumerate(_cases(inputs, tmp_path / "x")):
        out = tmp_path / f"c{n}"
        out.mkdir()
        own = _own_input(_bases(inputs, out)[command])
        link = out / "link.jsonl"
        if own:
            link.symlink_to(own)
        over = {k: (str(link) if v == "LINK" else v) for k, v in over.items()}
        argv = _argv(command, _bases(inputs, out)[command], over)
        if command == "demo":  # its config only: a demo run is minutes
            code = _config_only(argv)
        else:
            try:
                code = main(argv)
            except SystemExit as e:  # argparse: a value of the wrong type
                code = e.code
            except Exception as e:  # noqa: BLE001 - what the harness is for
                code = f"{type(e).__name__}: {str(e)[:200]}"
        err = capsys.readouterr().err
        if what == "as given" and code != 0:
            failures.append(f"{command}: its base invocation failed (exit {code}): {err.strip()[-300:]}")
        if _sha(inputs) != before:
            failures.append(f"{command} {what}: changed an input")
            break
        if code not in (0, 2) or "Traceback" in err:
            failures.append(f"{command} {what}: exit {code}; {err.strip()[-300:]}")
        else:
            counts[code] += 1
        assert time.monotonic() - start < TIME_BOUND_S, f"stuck at {command} {what}"
    assert not failures, "\n".join(failures)
    assert counts[2] > 100  # the harness reached the options (most hostile values are refused)


def _config_only(argv: list[str]):
    try:
        args = build_parser().parse_args(argv)
        config_from_args(_config_class(argv[0]), args)
    except BetaPRMInputError:
        return 2
    except SystemExit as e:
        return e.code
    return 0


def test_the_harness_finds_every_numeric_option_of_train():
    """The options come from the config dataclasses: a new one is fuzzed without a change here."""
    flags = dict(_numeric_fields(_config_class("train"), "train"))
    assert {"--learning-rate", "--max-steps", "--lambda-reg", "--kappa-min", "--max-length"} <= set(flags)
    assert flags["--max-steps"] is True and flags["--learning-rate"] is False
    assert os.path.basename(__file__) == "test_cli_fuzz.py"


@pytest.mark.parametrize(
    "command, flag",
    [
        ("aca", "--n-problems"),
        ("search", "--n-problems"),
        ("label", "--n-problems"),
        ("aca", "--top-k"),
        ("search", "--max-new-tokens"),
        ("train", "--dataloader-num-workers"),
        ("eval-bon", "--seed"),
    ],
)
def test_a_negative_count_is_refused_at_start(inputs, tmp_path, capsys, command, flag):
    """Fails before this change: these were accepted (a run of no problems, numpy's or the
    data loader's ValueError traceback, or a sampler told to keep -1 tokens)."""
    argv = _argv(command, _bases(inputs, tmp_path)[command], {flag: "-1"})
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
