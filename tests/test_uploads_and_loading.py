"""What leaves for the hub and what is read from it: --push-to-hub uploads the model's own
files only (an allow-list), with no local path in them, to a repository whose name is checked
and which is opened before training starts; a revision is a git ref or a commit and never
leads outside the hub cache; a model folder without weights, with damaged weights or a
partial hub snapshot is one message and exit status 2 in every command, never a traceback."""

import json
import shlex
import shutil
from pathlib import Path

import pytest

from betaprm.cli import main
from betaprm.errors import BetaPRMInputError
from betaprm.hub import resolve_model
from betaprm.train import hub_files, push_to_hub, upload_command

from .helpers import make_counts, make_lm_dir, train_config
from .test_hub import add_to_hub_cache

PROCESSBENCH = str(Path(__file__).parent / "data" / "processbench_sample")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm", hidden=16, layers=1)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache under ``tmp_path``, offline (as tests/test_hub.py's)."""
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


# ---------------------------------------------------------------- uploads


def test_only_the_models_files_are_uploaded(tmp_path):
    """From an output folder holding a run's checkpoints, rejects, plots, logs and summary,
    --push-to-hub (and its printed `hf upload` fallback) sends the model, tokenizer, configs
    and card only (the earlier code sent everything but checkpoint-*, runs/ and rejects.jsonl:
    a --rejects OUT/skipped.jsonl of raw training rows went to the hub)."""
    out = tmp_path / "out"
    model = [
        "README.md",
        "betaprm_config.json",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "kappa_head.safetensors",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    run = [
        "train_summary.json",
        "rejects.jsonl",
        "skipped.jsonl",
        "kappa_dynamics.png",
        "train.log",
        "plots/kappa_dynamics.png",
        "checkpoint-3/model.safetensors",
        "checkpoint-3/config.json",
        "checkpoint-3/trainer_state.json",
        "runs/events.out.tfevents.1",
        ".lock",
    ]
    for rel in model + run:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    assert hub_files(out) == sorted(model)
    # the fallback command sends the same files: hf upload's own filter on its --include/--exclude
    from huggingface_hub.utils import filter_repo_objects

    words = shlex.split(upload_command(out, "me/my-prm"))
    assert words[:5] == ["hf", "upload", "me/my-prm", str(out), "."]
    include = [words[i + 1] for i, w in enumerate(words) if w == "--include"]
    exclude = [words[i + 1] for i, w in enumerate(words) if w == "--exclude"]
    every = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert sorted(filter_repo_objects(every, allow_patterns=include, ignore_patterns=exclude)) == sorted(model)


def test_what_is_published_holds_no_local_path(lm, tmp_path, monkeypatch):
    """A run with --rejects and --plots inside --output-dir and --push-to-hub: the uploaded
    files are the allowed ones, the rejects and the summary stay home, and no uploaded file
    names a local path (the earlier card said `/tmp/.../counts.jsonl`, and the summary,
    uploaded too, held every path of the run)."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import filter_repo_objects

    from betaprm.train import train

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the stand-in below is the hub
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    remote = tmp_path / "remote"

    class StandInHfApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, repo_id, folder_path, allow_patterns=None, ignore_patterns=None, **kw):
            root = Path(folder_path)
            files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
            for rel in filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns):
                (remote / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / rel, remote / rel)

    monkeypatch.setattr(huggingface_hub, "HfApi", StandInHfApi)
    data = make_counts(tmp_path / "counts.jsonl", n=12)
    with open(data, "a") as f:
        f.write('{"id": "bad", "question": "q", "steps": ["s"], "mc_correct": [9], "mc_total": 2}\n')
    out = tmp_path / "out"
    cfg = train_config(
        lm,
        data,
        out,
        max_steps=2,
        save_steps=1,
        on_error="skip",
        rejects=str(out / "skipped.jsonl"),
        plots=str(out / "plots"),
        push_to_hub="me/my-prm",
    )
    train(cfg, quiet=True)
    assert (out / "skipped.jsonl").is_file() and (out / "plots" / "kappa_dynamics.png").is_file()
    sent = sorted(p.relative_to(remote).as_posix() for p in remote.rglob("*") if p.is_file())
    assert sent == hub_files(out)
    assert {"model.safetensors", "kappa_head.safetensors", "betaprm_config.json", "README.md"} <= set(sent)
    assert not {"skipped.jsonl", "train_summary.json"} & set(sent)
    for rel in sent:
        assert str(tmp_path).encode() not in (remote / rel).read_bytes(), rel
    assert "`counts.jsonl` (fingerprint" in (remote / "README.md").read_text()


# ---------------------------------------------------------------- the repository, before training


@pytest.mark.parametrize("name", ["alice/x--y", "alice/x..y", "alice/-x", "alice/x.", "alice/x.git", "a/b/c"])
def test_a_repo_name_the_hub_refuses_stops_before_anything(name, tmp_path, capsys):
    """The hub's own rules (huggingface_hub's validator) at the start: the message is about
    --push-to-hub even with a missing model and data, and nothing is written (the earlier
    check let `alice/x--y` through, to be refused by the hub after training)."""
    out = tmp_path / "out"
    args = ["--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "no.jsonl"), "--output-dir", str(out)]
    assert main(["train", *args, "--push-to-hub", name]) == 2
    err = capsys.readouterr().err
    assert "--push-to-hub must be NAME or OWNER/NAME" in err and repr(name) in err and "Traceback" not in err
    assert not out.exists()
    # nor does the upload itself (called from Python) try it or offer an `hf upload` that would fail
    with pytest.raises(BetaPRMInputError) as refused:
        push_to_hub(tmp_path, name)
    assert "--push-to-hub must be NAME or OWNER/NAME" in str(refused.value) and "hf upload" not in str(refused.value)


def test_a_repo_that_cannot_be_opened_stops_before_training(lm, tmp_path, capsys, monkeypatch):
    """Offline, without a token, or refused by the hub: exit 2 at the start, no model loaded
    and nothing trained or saved (the earlier code trained first and failed at the upload)."""
    import huggingface_hub
    from huggingface_hub import constants

    from betaprm import BetaPRM

    data = make_counts(tmp_path / "counts.jsonl", n=8)

    def run(out):
        args = ["--model", str(lm), "--data", str(data), "--output-dir", str(out), "--max-steps", "1", "--use-cpu"]
        assert main(["train", *args, "--global-batch-size", "4", "--push-to-hub", "me/my-prm"]) == 2
        assert not (out / "model.safetensors").exists() and not list(out.glob("checkpoint-*"))
        return capsys.readouterr().err

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(BetaPRM, "from_backbone", no_model)
    assert "HF_HUB_OFFLINE is set" in run(tmp_path / "offline")  # the tests run offline
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert "no Hugging Face token" in run(tmp_path / "no-token")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_stand_in")

    class RefusingHfApi:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            raise RuntimeError("403 Forbidden: you may not write to me")  # as the hub client says it

    monkeypatch.setattr(huggingface_hub, "HfApi", RefusingHfApi)
    err = run(tmp_path / "refused")
    assert "did not create or open the repository" in err and "403 Forbidden" in err and "Traceback" not in err


# ---------------------------------------------------------------- revisions


def test_a_revision_is_a_ref_or_a_commit(lm, hub_cache, tmp_path, capsys):
    """`OWNER/NAME@../../x` read refs/../../x, a file outside the cache naming a folder
    outside it, and loaded that folder as the model: refused now, in the API and in a
    command (exit 2), as is every name git refuses for a ref."""
    add_to_hub_cache(lm, hub_cache, "alice/tiny")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(lm, elsewhere / "model")
    # models--alice--tiny/refs/ + ../../../ is tmp_path; the commit read there is a path too
    (elsewhere / "evilref").write_text("../../../elsewhere/model")
    assert resolve_model("alice/tiny").path.parent.parent.parent == hub_cache  # the cache itself works
    evil = "alice/tiny@../../../elsewhere/evilref"
    with pytest.raises(BetaPRMInputError, match="is not a revision"):
        resolve_model(evil)
    for bad in (
        "..",
        "a..b",
        "-x",
        "/x",
        "x/",
        ".hidden",
        "x.lock",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?",
        "a*",
        "a[",
        "@{1}",
        "@",
        "a//b",
        "a\tb",
        "a\\b",
        "x.",
    ):
        with pytest.raises(BetaPRMInputError, match="is not a revision"):
            resolve_model("alice/tiny", bad)
    for good in ("v1.0", "refs/pr/1", "feature/x-y_z"):  # valid names, refused only as missing from the cache
        with pytest.raises(BetaPRMInputError, match="HF_HUB_OFFLINE"):
            resolve_model("alice/tiny", good)
    assert main(["eval-steps", "--model", evil, "--data", PROCESSBENCH, "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert "is not a revision" in err and "Traceback" not in err
    assert not (tmp_path / "o.json").exists()


def test_a_snapshot_never_resolves_outside_the_cache(lm, hub_cache, tmp_path):
    """A cache entry whose branch names a folder outside the cache (refs/main holding a
    path) is refused, however the revision was given (the earlier code loaded that folder)."""
    add_to_hub_cache(lm, hub_cache, "alice/moved")
    shutil.copytree(lm, tmp_path / "elsewhere")
    # models--alice--moved/snapshots/ + ../../../ is tmp_path
    (hub_cache / "models--alice--moved" / "refs" / "main").write_text("../../../elsewhere")
    with pytest.raises(BetaPRMInputError, match="leads outside the cache"):
        resolve_model("alice/moved")


# ---------------------------------------------------------------- one loader


def _damaged(lm: Path, where: Path, how: str) -> Path:
    shutil.copytree(lm, where)
    weights = where / "model.safetensors"
    if how == "no weights":
        weights.unlink()
    elif how == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:  # a tokenizer file cut short
        (where / "tokenizer.json").write_bytes((where / "tokenizer.json").read_bytes()[:500])
    return where


@pytest.mark.parametrize("how", ["no weights", "truncated weights", "truncated tokenizer"])
@pytest.mark.parametrize("cmd", ["eval-steps", "serve"])
def test_a_damaged_plain_model_is_exit_2(cmd, how, lm, tmp_path, capsys):
    """A plain causal LM's folder (scored zero-shot) without weights or with a damaged file:
    one message naming the folder and the fix (the earlier code: an OSError or
    SafetensorError traceback, in eval-steps and serve)."""
    bad = _damaged(lm, tmp_path / "bad", how)
    args = {
        "eval-steps": ["--data", PROCESSBENCH, "--out", str(tmp_path / "o.json")],
        "serve": ["--port", "1", "--device", "cpu"],  # stops before any socket is opened
    }[cmd]
    assert main([cmd, "--model", str(bad), *args]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: cannot load the model" in err and "save or copy the model there again" in err
    assert "Traceback" not in err


def test_a_partial_hub_snapshot_is_exit_2(lm, hub_cache, tmp_path, capsys):
    """A hub snapshot whose weights never arrived (an interrupted download): the message names
    the hub name, the snapshot and the command that downloads it again."""
    snap = add_to_hub_cache(lm, hub_cache, "alice/partial")
    (snap / "model.safetensors").unlink()
    assert (
        main(["eval-calibration", "--model", "alice/partial", "--data", str(make_counts(tmp_path / "c.jsonl", 4))])
        == 2
    )
    err = capsys.readouterr().err
    assert "alice/partial: the hub snapshot" in err and "incomplete or damaged" in err
    assert "hf download alice/partial --revision" in err and "Traceback" not in err


def test_a_damaged_policy_is_exit_2(lm, tmp_path, capsys):
    """`label --backend transformers --policy DIR` reads the policy through the same rules."""
    bad = _damaged(lm, tmp_path / "policy", "truncated weights")
    rec = {"id": "a", "question": "What is 1 + 2?", "answer": "3", "steps": ["1 + 2 = 3"]}
    (tmp_path / "t.jsonl").write_text(json.dumps(rec) + "\n")
    args = ["--input", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "o.jsonl"), "--n", "2"]
    assert main(["label", "--backend", "transformers", "--policy", str(bad), *args]) == 2
    err = capsys.readouterr().err
    assert f"--policy {bad}: cannot load the model" in err and "Traceback" not in err
