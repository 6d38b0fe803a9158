"""The model card as a ``transformers.Trainer`` user knows it: the training hyperparameters,
the framework versions, the evaluation results as the hub's ``model-index`` (read back with
huggingface_hub's own ``ModelCard.load`` and ``metadata_load``), and a loading snippet that
names the model (the hub repository when pushed, else the folder it was saved in)."""

import importlib.metadata
import json
import math

import pytest
from huggingface_hub import EvalResult, ModelCard, metadata_load

from betaprm import BetaPRM
from betaprm.card import local_name, model_card
from betaprm.data.sources import reads_with_datasets
from betaprm.train import train
from betaprm.train.finish import card_of

from .helpers import make_counts, make_lm_dir, train_config


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_lm_dir(tmp_path_factory.mktemp("lm") / "lm")


def test_a_trained_models_card_reads_back(lm_dir, tmp_path, monkeypatch):
    """A run with held-out evaluation: the card's metadata carries the final evaluation as
    model-index results (the numbers of train_summary.json), the hyperparameters the run
    used and the versions of the packages it ran with; the snippet names the output folder
    as given (the earlier card said PATH_OR_NAME), and no absolute path of the machine."""
    monkeypatch.chdir(tmp_path)
    data = make_counts(tmp_path / "counts.jsonl", n=32)
    cfg = train_config(
        lm_dir,
        data,
        "runs/bprm",
        max_steps=2,
        save_steps=2,
        eval_data=str(make_counts(tmp_path / "held.jsonl", n=8, seed=3)),
        eval_steps=2,
        disable_tqdm=True,
    )
    _, trainer, _ = train(cfg, quiet=True)
    assert trainer.args.disable_tqdm is True  # --disable-tqdm reaches the Trainer's own bar
    out = tmp_path / "runs" / "bprm"
    final = json.loads((out / "train_summary.json").read_text())["evaluation"]["final_model"]

    meta = metadata_load(out / "README.md")
    (entry,) = meta["model-index"]
    assert entry["name"] == "bprm"
    (result,) = entry["results"]
    assert result["task"]["type"] == "process-reward-modeling"
    assert result["dataset"] == {"name": "held.jsonl", "type": "held.jsonl"}  # a local file: its name alone
    got = {m["type"]: m["value"] for m in result["metrics"]}
    want = {k.removeprefix("eval_"): v for k, v in final.items() if k.startswith("eval_") and "_per_second" not in k}
    want.pop("runtime")
    assert set(got) == {k for k, v in want.items() if v is not None and math.isfinite(v)} and "nll" in got
    for k, v in got.items():
        assert v == pytest.approx(want[k], rel=1e-12), k

    # ModelCard.load parses the same results into huggingface_hub's EvalResult objects.
    card = ModelCard.load(out / "README.md")
    nll = next(r for r in card.data.eval_results if r.metric_type == "nll")
    assert isinstance(nll, EvalResult) and nll.metric_value == pytest.approx(final["eval_nll"])

    hp = meta["hyperparameters"]
    assert hp["learning_rate"] == cfg.learning_rate and hp["seed"] == 1 and hp["training_steps"] == 2
    assert hp["train_batch_size"] == 4 and hp["gradient_accumulation_steps"] == 2
    assert hp["total_train_batch_size"] == 8 and hp["num_devices"] == 1
    assert hp["loss"] == "beta-binomial" and hp["kappa_min"] == cfg.kappa_min and hp["lambda_reg"] == cfg.lambda_reg
    assert hp["lr_scheduler_type"] == "cosine" and hp["lr_scheduler_warmup_ratio"] == cfg.warmup_ratio
    assert hp["optimizer"].startswith(("adamw_torch", "adamw_torch_fused")) and "betas=(0.9, 0.999)" in hp["optimizer"]
    assert "lora_r" not in hp and "freeze_layers" not in hp  # off in this run

    versions = meta["framework_versions"]
    for package in ("transformers", "torch", "accelerate"):
        assert versions[package] == importlib.metadata.version(package), package
    assert versions["betaprm"] == BetaPRM.from_pretrained(out).config.betaprm_version
    assert "peft" not in versions and "datasets" not in versions  # no LoRA, a JSONL file

    body = card.text
    for want_text in (
        'BetaPRM.from_pretrained("runs/bprm")',
        "betaprm score --model runs/bprm",
        "- learning_rate: 0.001",
        f"- Transformers {importlib.metadata.version('transformers')}",
        f"| eval_nll | {final['eval_nll']:.4g} |",
    ):
        assert want_text in body, want_text
    assert "PATH_OR_NAME" not in body and str(tmp_path) not in (out / "README.md").read_text()


def test_card_results_names_and_undefined_metrics(tmp_path):
    """A hub repository is the snippet's name and the model-index's; a hub dataset is its
    dataset type; an undefined metric (nan) is n/a in the body and left out of model-index,
    whose values must be numbers."""
    from betaprm.model import BetaPRMConfig

    config = BetaPRMConfig(marker_id=5, reward_token_ids=(6, 7), objective="soft-ce")
    card = model_card(
        config,
        name="me/my-prm",
        results={"eval_f1": 0.625, "eval_f1_negative": float("nan")},
        eval_data={"name": "Qwen/ProcessBench:gsm8k", "split": None, "step": 40},
        hyperparameters={"learning_rate": 2e-5},
    )
    card.save(tmp_path / "README.md")
    meta = metadata_load(tmp_path / "README.md")
    (entry,) = meta["model-index"]
    assert entry["name"] == "my-prm"
    (result,) = entry["results"]
    assert result["dataset"]["type"] == "Qwen/ProcessBench"
    assert result["metrics"] == [{"type": "f1", "value": 0.625, "name": "eval_f1"}]
    text = (tmp_path / "README.md").read_text()
    assert 'BetaPRM.from_pretrained("me/my-prm")' in text and "| eval_f1_negative | n/a |" in text
    assert "(step 40)" in text and "- learning_rate: 2e-05" in text
    # without results, no model-index (huggingface_hub would refuse one without a model name)
    plain = model_card(config, name="me/my-prm")
    assert plain.data.eval_results is None and "model-index" not in plain.data.to_dict()


def test_local_names_and_the_packages_a_run_used(lm_dir, tmp_path, monkeypatch):
    """A folder inside the working folder is named by its relative path, one outside it by
    its own name; LoRA adds peft to the versions, data read through datasets adds datasets."""
    monkeypatch.chdir(tmp_path)
    assert local_name("runs/a") == "runs/a" and local_name(tmp_path / "runs" / "a") == "runs/a"
    assert local_name("/elsewhere/model-x") == "model-x"
    data = make_counts(tmp_path / "counts.jsonl", n=4)
    record = {"settings": {"data": "f00"}}
    assert card_of(train_config(lm_dir, data, "o"), record)["frameworks"] == []
    assert card_of(train_config(lm_dir, data, "o", lora_r=4), record)["frameworks"] == ["peft"]
    assert not reads_with_datasets(data) and reads_with_datasets("owner/some-dataset:train")
    (tmp_path / "jsonl_folder").mkdir()
    (tmp_path / "jsonl_folder" / "train.jsonl").write_text(data.read_text())
    assert not reads_with_datasets(tmp_path / "jsonl_folder")  # read file by file, not by datasets
