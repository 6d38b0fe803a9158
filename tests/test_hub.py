"""Models by hub name: a real Hugging Face cache layout built here, offline (no network),
read through ``huggingface_hub`` by ``betaprm.hub``, in the Python API and in every
command that takes ``--model``; the kind (beta, standard, zero-shot) from the model's own
config; the model card."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from betaprm import BetaPRM, BetaPRMInputError
from betaprm.hub import resolve_model
from betaprm.model import load_prm, model_kind
from betaprm.provenance import model_fingerprint
from betaprm.scoring import score_traces

from .helpers import make_counts, make_lm_dir

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TRACES = [("add these", ["1 + 2 = 3", "3 + 4 = 7"]), ("add these", ["2 + 2 = 5"])]


def add_to_hub_cache(folder: Path, cache: Path, repo_id: str, commit: str = COMMIT, branch: str = "main") -> Path:
    """Lay ``folder`` out in ``cache`` as huggingface_hub does after a download: files in
    blobs/ (named by their hash), the snapshot of ``commit`` as links to them, and
    refs/``branch`` naming the commit. Returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.rglob("*")):
        if not f.is_file():
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / f.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snap


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A BetaPRM (beta-binomial), a standard PRM (soft-ce) and a plain LM, as folders and
    in a hub cache as owner/beta-prm, owner/std-prm and owner/plain-lm."""
    d = tmp_path_factory.mktemp("hub")
    lm = make_lm_dir(d / "lm")
    paths = {"plain": lm}
    for name, objective in (("beta", "beta-binomial"), ("std", "soft-ce")):
        prm = BetaPRM.from_backbone(str(lm))
        with torch.no_grad():
            prm.kappa_head.weight.normal_(0, 0.3)
        prm.config.objective = objective
        prm.save_pretrained(d / name)
        paths[name] = d / name
    cache = d / "cache"
    add_to_hub_cache(paths["beta"], cache, "owner/beta-prm")
    add_to_hub_cache(paths["std"], cache, "owner/std-prm")
    add_to_hub_cache(paths["plain"], cache, "owner/plain-lm")
    return paths, cache


@pytest.fixture
def offline_hub(models, monkeypatch):
    """The cache above as the Hugging Face cache, offline (constants and environment both:
    in-process calls read the constants, subprocesses the environment)."""
    from huggingface_hub import constants

    _, cache = models
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _mu(prm):
    return [s.mu for s in score_traces(prm, TRACES)], [s.kappa for s in score_traces(prm, TRACES)]


def test_resolve_names_revisions_and_paths(models, offline_hub, monkeypatch):
    paths, cache = models
    src = resolve_model("owner/beta-prm")
    assert src.is_hub and src.revision == COMMIT and src.path.parent.name == "snapshots"
    assert (src.path / "betaprm_config.json").is_file()
    assert resolve_model(f"owner/beta-prm@{COMMIT}").path == src.path == resolve_model("owner/beta-prm", COMMIT).path
    local = resolve_model(str(paths["beta"]))
    assert not local.is_hub and local.path == paths["beta"]
    with pytest.raises(BetaPRMInputError, match="HF_HUB_OFFLINE"):
        resolve_model("owner/missing")
    with pytest.raises(BetaPRMInputError, match="no such folder"):  # a path is never sent to the hub
        resolve_model(str(paths["beta"]) + "-typo")
    # a relative path whose first folder exists here is a path too (the earlier code asked the hub)
    monkeypatch.chdir(paths["beta"].parent)
    for missing in ("./missing", "beta/missing-run", "beta/missing-run@best"):
        with pytest.raises(BetaPRMInputError, match="no such folder"):
            resolve_model(missing)
    with pytest.raises(BetaPRMInputError, match="a revision applies to hub names only"):
        resolve_model(str(paths["beta"]), "main")
    # one model, one fingerprint, however it is named
    assert model_fingerprint("owner/beta-prm") == model_fingerprint(paths["beta"])


def test_python_api_by_hub_name_equals_the_folder(models, offline_hub):
    """``BetaPRM.from_pretrained`` and ``load_prm`` by hub name give the folder's scores and
    kind (the earlier code refused the name, and load_prm scored it zero-shot)."""
    paths, _ = models
    for name, folder, kind in (("owner/beta-prm", "beta", "beta"), ("owner/std-prm", "std", "standard")):
        by_name, by_path = BetaPRM.from_pretrained(name), BetaPRM.from_pretrained(paths[folder])
        for a, b in zip(_mu(by_name), _mu(by_path)):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        prm, k = load_prm(name, "cpu")
        assert k == kind == model_kind(paths[folder]) == model_kind(name)
        np.testing.assert_array_equal(_mu(prm)[1][0], _mu(by_path)[1][0])  # the trained kappa head, not a fresh one
    assert load_prm("owner/plain-lm", "cpu")[1] == "zero-shot"
    with pytest.raises(BetaPRMInputError, match=r"owner/plain-lm \(hub snapshot .*\) is not a BetaPRM: no betaprm"):
        BetaPRM.from_pretrained("owner/plain-lm")


def test_a_betaprm_that_cannot_load_is_an_error_never_zero_shot(models, tmp_path):
    """A folder with a kappa head but no betaprm_config.json, or with a damaged config, is
    refused (the earlier code scored the first as a plain LM, zero-shot)."""
    paths, _ = models
    broken = tmp_path / "broken"
    shutil.copytree(paths["beta"], broken)
    (broken / "betaprm_config.json").unlink()
    with pytest.raises(BetaPRMInputError, match="kappa_head.safetensors but no betaprm_config.json"):
        load_prm(broken, "cpu")
    shutil.copy(paths["beta"] / "betaprm_config.json", broken / "betaprm_config.json")
    (broken / "kappa_head.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(BetaPRMInputError, match="cannot read the kappa head"):
        load_prm(broken, "cpu")


def test_objective_in_the_config_and_older_folders(models, tmp_path):
    """The objective is read from betaprm_config.json; a folder of an older version (no
    objective there) still reads it from train_summary.json."""
    paths, _ = models
    assert json.loads((paths["std"] / "betaprm_config.json").read_text())["objective"] == "soft-ce"
    old = tmp_path / "old"
    shutil.copytree(paths["std"], old)
    cfg = json.loads((old / "betaprm_config.json").read_text())
    del cfg["objective"], cfg["base_model"]
    (old / "betaprm_config.json").write_text(json.dumps(cfg))
    assert model_kind(old) == "beta"  # no record of the objective: a BetaPRM, as before
    (old / "train_summary.json").write_text(json.dumps({"config": {"objective": "hard-ce"}}))
    assert model_kind(old) == "standard" and load_prm(old, "cpu")[1] == "standard"


def test_model_card_is_written_and_parses(models, offline_hub, tmp_path):
    """save_pretrained writes README.md whose metadata huggingface_hub reads: library name,
    base model (the hub name the backbone came from), tags, datasets, licence."""
    from huggingface_hub import ModelCard

    from betaprm.card import license_of, model_card

    paths, cache = models
    # a base model with a card of its own on the hub: its licence is inherited by train
    base = tmp_path / "base"
    shutil.copytree(paths["plain"], base)
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n# base\n")
    add_to_hub_cache(base, cache, "owner/base-lm")
    assert license_of(resolve_model("owner/base-lm").path) == "apache-2.0"
    prm = BetaPRM.from_backbone("owner/base-lm")
    assert prm.config.base_model == "owner/base-lm"
    prm.config.objective = "beta-binomial"
    prm.save_pretrained(
        tmp_path / "out",
        card={
            "name": "me/my-prm",
            "license": "apache-2.0",
            "data": {"name": "owner/counts:train", "fingerprint": "abc123"},
            "results": {"processbench_avg_f1": 12.5},
        },
    )
    card = ModelCard.load(tmp_path / "out" / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "betaprm" and meta["base_model"] == "owner/base-lm"
    assert meta["license"] == "apache-2.0" and meta["datasets"] == ["owner/counts"]
    assert {"betaprm", "process-reward-model", "beta-binomial"} <= set(meta["tags"])
    body = card.text
    for want in (
        'BetaPRM.from_pretrained("me/my-prm")',
        "betaprm serve --model me/my-prm",
        "| objective | beta-binomial |",
        f"(token id {prm.config.marker_id})",
        "`abc123`",
        "| processbench_avg_f1 | 12.5 |",
    ):
        assert want in body, want
    # the card is not part of the model: the fingerprint ignores it
    before = model_fingerprint(tmp_path / "out")
    (tmp_path / "out" / "README.md").write_text("changed")
    assert model_fingerprint(tmp_path / "out") == before and model_kind(tmp_path / "out") == "beta"
    # a local data file is no hub dataset: the metadata leaves it out, the body keeps its fingerprint
    (tmp_path / "train.jsonl").write_text("")
    for local in ("train.jsonl", str(tmp_path / "train.jsonl"), "data/missing.jsonl"):
        card = model_card(prm.config, data={"name": local, "fingerprint": "f00"})
        assert card.data.datasets is None and "`f00`" in card.text, local


# ---------------------------------------------------------------- every command


def _pools(path: Path) -> Path:
    recs = [
        {"id": f"p{i}", "question": f"add these {i}", "answer": "7", "candidates": [{"steps": s} for _, s in TRACES]}
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.parametrize("cmd", ["eval-steps", "eval-calibration", "eval-bon", "score"])
def test_commands_by_hub_name_equal_the_folder(cmd, models, offline_hub, tmp_path, capsys):
    """The same results and the same kind by hub name as by folder."""
    from betaprm.cli import main

    paths, _ = models
    data = Path(__file__).parent / "data" / "processbench_sample"
    args = {
        "eval-steps": ["--data", str(data), "--truncate", "steps"],  # the tiny model has 1,024 positions
        "eval-calibration": ["--data", str(make_counts(tmp_path / "counts.jsonl", n=12))],
        "eval-bon": ["--pools", str(_pools(tmp_path / "bon.jsonl")), "--val-fraction", "0.5"],
        "score": ["--input", str(_pools(tmp_path / "pools.jsonl"))],
    }[cmd]
    outs = []
    for model in ("owner/beta-prm", str(paths["beta"])):
        out = tmp_path / f"{len(outs)}.{'jsonl' if cmd == 'score' else 'json'}"
        flag = "--output" if cmd == "score" else "--out"
        assert main([cmd, "--model", model, *args, flag, str(out)]) == 0
        printed = capsys.readouterr().out
        assert f"{model} (beta" in printed, printed[:400]
        if cmd == "eval-bon":  # the pools were scored in place by the first run; score them afresh
            _pools(tmp_path / "bon.jsonl")
        outs.append(out)
    if cmd == "score":
        a, b = (out.read_text() for out in outs)
        assert a == b and "mu" in a
        for out, model in zip(outs, ("owner/beta-prm", str(paths["beta"]))):
            meta = json.loads(Path(str(out) + ".meta.json").read_text())
            assert meta["info"]["model_kind"] == "beta" and meta["info"]["model"] == model
        assert json.loads(Path(str(outs[0]) + ".meta.json").read_text())["info"]["model_revision"] == COMMIT
        return
    a, b = (json.loads(out.read_text()) for out in outs)
    for r in (a, b):
        r.pop("provenance")["info"]
        r.pop("model", None)
    assert a == b and a.get("model_kind", "beta") == "beta"


def test_aca_search_and_train_by_hub_name(models, offline_hub, tmp_path):
    from betaprm.cli import main

    for cmd in ("aca", "search"):
        outs = []
        for model in ("owner/beta-prm", str(models[0]["beta"])):
            out = tmp_path / f"{cmd}{len(outs)}.jsonl"
            assert main([cmd, "--model", model, "--n-problems", "3", "--out", str(out)]) == 0
            outs.append(out.read_text())
            meta = json.loads(Path(str(out) + ".meta.json").read_text())
            assert meta["info"]["model_kind"] == "beta"
        assert outs[0] == outs[1], cmd
    # train continues a BetaPRM named on the hub as the BetaPRM it is (its kappa head kept)
    counts = make_counts(tmp_path / "counts.jsonl", n=8)
    out = tmp_path / "trained"
    args = ["train", "--model", "owner/std-prm", "--data", str(counts), "--output-dir", str(out)]
    assert main([*args, "--max-steps", "1", "--global-batch-size", "4", "--learning-rate", "1e-6"]) == 0
    trained = BetaPRM.from_pretrained(out).kappa_head.weight.detach()
    start = BetaPRM.from_pretrained(models[0]["std"]).kappa_head.weight.detach()
    # one tiny step from the saved head (drawn at scale 0.3), not from a fresh one
    assert start.abs().max() > 0.3 and torch.allclose(trained, start, atol=1e-3)
    assert json.loads((out / "betaprm_config.json").read_text())["objective"] == "beta-binomial"
    assert (out / "README.md").is_file() and model_kind(out) == "beta"


def test_serve_by_hub_name(models, offline_hub):
    from .test_serve import Server

    paths, cache = models
    served = []
    for model in ("owner/beta-prm", paths["beta"]):
        s = Server(model, env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
        try:
            status, res = s.request("POST", "/v1/score", {"question": TRACES[0][0], "steps": TRACES[0][1]})
            assert status == 200
            served.append(res)
            status, info = s.request("GET", "/v1/models")
            assert status == 200 and info["data"][0]["kind"] == "beta"
        finally:
            s.stop()
    assert served[0] == served[1]
