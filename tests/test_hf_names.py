"""The names users of TRL's PRMTrainer and transformers' TrainingArguments expect: underscore
flags, TrainingArguments' names in `betaprm train`, a TRL PRMConfig YAML, required flags and
fixed choices in --help and checked, a subcommand's own usage for an unknown flag."""

import json

import pytest

from betaprm.cli import build_parser, main
from betaprm.cli.flags import config_from_args
from betaprm.cli.score import ScoreConfig
from betaprm.errors import BetaPRMInputError
from betaprm.train.config import TrainConfig, resolve_global_batch


def train_config(*argv):
    return config_from_args(TrainConfig, build_parser().parse_args(["train", *argv]))


REQUIRED = ("--model", "m", "--data", "d.jsonl")


def test_hf_spellings_parse_into_the_config(capsys):
    cfg = train_config(
        *REQUIRED,
        "--learning_rate",
        "3e-5",
        "--per_device_train_batch_size",
        "2",
        "--bf16",
        "--gradient_accumulation_steps",
        "4",
        "--max_grad_norm",
        "0.5",
        "--optim",
        "adamw_torch",
        "--run_name",
        "probe",
        "--attn_implementation",
        "eager",
        "--no-gradient_checkpointing",
    )
    assert cfg.learning_rate == 3e-5 and cfg.per_device_train_batch_size == 2
    assert cfg.precision == "bf16" and cfg.gradient_accumulation_steps == 4 and cfg.max_grad_norm == 0.5
    assert (cfg.optim, cfg.run_name, cfg.attn_implementation) == ("adamw_torch", "probe", "eager")
    assert cfg.global_batch_size is None  # made by the accumulation steps when the run knows its processes
    assert capsys.readouterr().err == ""  # the HF spelling is not deprecated


def test_underscore_spellings_are_hidden_from_help():
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--learning-rate" in text and "--learning_rate" not in text
    assert "--per-device-batch-size" not in text and "--truncation" not in text


def test_old_names_still_work_with_a_deprecation(capsys):
    cfg = train_config(*REQUIRED, "--per-device-batch-size", "2", "--truncation", "keep-steps")
    err = capsys.readouterr().err
    assert cfg.per_device_train_batch_size == 2 and cfg.truncate == "steps"
    assert "--per-device-batch-size is deprecated" in err and "use --per-device-train-batch-size" in err
    assert "--truncation is deprecated" in err and "--truncate keep-steps is deprecated" in err
    assert "use --truncate steps" in err
    assert train_config(*REQUIRED, "--truncate", "reject").truncate == "reject"
    assert TrainConfig(model="m", data="d", truncate="keep-steps").truncate == "steps"  # the library too


def test_bf16_fp16_rules():
    with pytest.raises(BetaPRMInputError, match=r"--bf16 and --precision fp32 contradict"):
        train_config(*REQUIRED, "--bf16", "--precision", "fp32")
    with pytest.raises(BetaPRMInputError, match=r"--fp16 is not supported.*--bf16"):
        train_config(*REQUIRED, "--fp16")
    assert train_config(*REQUIRED, "--bf16", "--precision", "bf16").precision == "bf16"
    assert train_config(*REQUIRED).precision == "auto"


def test_optim_choices():
    with pytest.raises(
        BetaPRMInputError, match=r"--optim must be one of adamw_torch, adamw_torch_fused, got 'adafactor'"
    ):
        train_config(*REQUIRED, "--optim", "adafactor")
    assert train_config(*REQUIRED).optim is None  # TrainingArguments' default, as before


def test_gradient_accumulation_steps_rule():
    cfg = train_config(*REQUIRED, "--per-device-train-batch-size", "2", "--gradient-accumulation-steps", "4")
    assert resolve_global_batch(cfg, 2).global_batch_size == 16  # 2 x 4 x 2 processes
    same = train_config(
        *REQUIRED,
        "--per-device-train-batch-size",
        "2",
        "--gradient-accumulation-steps",
        "4",
        "--global-batch-size",
        "8",
    )
    assert resolve_global_batch(same, 1).global_batch_size == 8
    with pytest.raises(BetaPRMInputError, match=r"--global-batch-size 8 and --gradient-accumulation-steps 4 disagree"):
        resolve_global_batch(same, 2)
    default = train_config(*REQUIRED)
    assert default.global_batch_size == 512 and resolve_global_batch(default, 8) is default
    with pytest.raises(BetaPRMInputError, match="--gradient-accumulation-steps with --max-batch-tokens"):
        train_config(*REQUIRED, "--gradient-accumulation-steps", "2", "--max-batch-tokens", "4096")
    with pytest.raises(BetaPRMInputError, match="--gradient-accumulation-steps must be >= 1"):
        train_config(*REQUIRED, "--gradient-accumulation-steps", "0")


TRL_YAML = """\
# written for TRL 1.13's PRMConfig (examples/scripts/prm.py)
output_dir: runs/qwen-prm
learning_rate: 2.0e-5
num_train_epochs: 2
max_steps: -1
per_device_train_batch_size: 4
gradient_accumulation_steps: 8
warmup_ratio: 0.1
weight_decay: 0.0
lr_scheduler_type: cosine
logging_steps: 25
save_steps: 200
save_total_limit: 3
seed: 7
report_to: [tensorboard, wandb]
run_name: qwen-prm
gradient_checkpointing: true
bf16: true
max_grad_norm: 0.5
optim: adamw_torch_fused
do_train: true
warmup_steps: 0
tf32: true
logging_first_step: true
push_to_hub: true
hub_model_id: me/qwen-prm
hub_private_repo: true
hub_token: hf_not_a_real_token
max_length: 2048
max_prompt_length: 512
max_completion_length: null
disable_dropout: true
step_separator: "\\n"
train_on_last_step_only: false
dataset_num_proc: 4
"""


def test_trl_prm_config_yaml_loads_with_warnings(tmp_path, capsys):
    path = tmp_path / "trl_prm.yaml"
    path.write_text(TRL_YAML)
    cfg = train_config("--config", str(path), *REQUIRED)
    assert (cfg.output_dir, cfg.learning_rate, cfg.num_train_epochs, cfg.seed) == ("runs/qwen-prm", 2e-5, 2.0, 7)
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (4, 8)
    assert (cfg.warmup_ratio, cfg.weight_decay, cfg.logging_steps, cfg.save_steps, cfg.save_total_limit) == (
        0.1,
        0.0,
        25,
        200,
        3,
    )
    assert cfg.report_to == "tensorboard,wandb" and cfg.run_name == "qwen-prm" and cfg.gradient_checkpointing
    assert cfg.precision == "bf16" and cfg.max_grad_norm == 0.5 and cfg.optim == "adamw_torch_fused"
    assert cfg.push_to_hub == "me/qwen-prm" and cfg.hub_private and cfg.max_length == 2048
    err = capsys.readouterr().err
    assert "hf_not_a_real_token" not in err  # a token is named, never echoed
    lines = err.splitlines()
    named = {k for k in TRL_YAML_KEYS if any(f": {k}: " in line and "not used" in line for line in lines)}
    # Each key not honoured: one line, with what it would have done.
    assert named == {
        "tf32",
        "hub_token",
        "max_prompt_length",
        "disable_dropout",
        "step_separator",
        "dataset_num_proc",
    }, lines
    assert any("step_separator" in line and "--marker" in line for line in lines)
    # warmup_steps: 0 beside warmup_ratio is transformers 4's default, not "no warmup".
    assert cfg.warmup_steps is None and cfg.logging_first_step
    # Honoured, or what betaprm does anyway: not named.
    for key in ("do_train", "train_on_last_step_only", "max_completion_length", "learning_rate", "hub_model_id"):
        assert not any(f": {key}: " in line for line in lines), key


TRL_YAML_KEYS = [line.split(":")[0] for line in TRL_YAML.splitlines() if line and not line.startswith("#")]


def test_a_key_of_nobody_is_still_an_error(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("learning_rat: 1.0e-5\ndo_train: true\n")
    with pytest.raises(BetaPRMInputError, match=r"unknown keys \['learning_rat'\]"):
        train_config("--config", str(path), *REQUIRED)


def test_required_and_choices_in_help():
    sub = build_parser()._subparsers._group_actions[0].choices
    train_help = " ".join(sub["train"].format_help().split())
    assert "--model MODEL a causal LM" in train_help and "hub (required)" in train_help
    assert "--objective {beta-binomial,soft-ce,hard-ce}" in train_help
    assert "--truncate {steps,reject}" in train_help and "--precision {auto,bf16,fp32}" in train_help
    score_help = " ".join(sub["score"].format_help().split())
    assert "--truncate {error,steps}" in score_help and "--on-error {fail,skip}" in score_help
    assert "(JSONL, appended) (required)" in score_help and "default: ''" not in score_help
    assert "--aggregate {mean,min,last,prod,lin,rb}" in " ".join(sub["serve"].format_help().split())


def test_required_flags_all_named_and_choices_checked(tmp_path):
    p = build_parser()
    with pytest.raises(BetaPRMInputError) as e:
        config_from_args(ScoreConfig, p.parse_args(["score", "--truncate", "whole"]))
    msg = str(e.value)
    assert "--model is required" in msg and "--input is required" in msg and "--output is required" in msg
    assert "--truncate must be one of error, steps, got 'whole'" in msg
    with pytest.raises(BetaPRMInputError, match=r"--objective must be one of beta-binomial, soft-ce, hard-ce"):
        train_config(*REQUIRED, "--objective", "mse")
    path = tmp_path / "c.yaml"  # the same check for a config file's value
    path.write_text("objective: mse\nmodel: m\ndata: d\n")
    with pytest.raises(BetaPRMInputError, match=r"--objective must be one of .*got 'mse'"):
        train_config("--config", str(path))
    path.write_text(json.dumps({"model": "m", "data": "d"}))  # required flags may come from the file
    assert train_config("--config", str(path)).model == "m"


def test_an_unknown_flag_is_one_line_naming_the_closest(capsys):
    """Not the ~50-line usage: one line, the subcommand's, with the nearest real flag."""
    with pytest.raises(SystemExit) as e:
        main(["train", *REQUIRED, "--lerning-rate", "1e-5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "betaprm train: error: unknown option --lerning-rate; did you mean --learning-rate? "
        "(see betaprm train --help)\n"
    )
    with pytest.raises(SystemExit):
        main(["train", *REQUIRED, "--epochs", "3"])
    assert "unknown option --epochs; did you mean --num-train-epochs?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["score", "--bogus", "x", "stray"])
    err = capsys.readouterr().err
    # no flag is near --bogus: no suggestion; its value x is its own; the stray word is named
    assert err.count("\n") == 1 and "did you mean" not in err and "'x'" not in err and "argument 'stray'" in err
    with pytest.raises(SystemExit):  # argparse's own errors: one line too
        main(["score", "--model"])
    assert capsys.readouterr().err.count("\n") == 1


def test_training_arguments_get_the_hf_settings(tmp_path):
    """One tiny run on CPU: the accumulation steps, clipping, optimiser and run name reach the
    Trainer's TrainingArguments, and the global batch they make is the one recorded."""
    from betaprm.train import train

    from .helpers import make_counts, make_lm_dir

    lm, counts = make_lm_dir(tmp_path / "lm"), make_counts(tmp_path / "counts.jsonl")
    cfg = TrainConfig(
        model=str(lm),
        data=str(counts),
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_grad_norm=0.5,
        optim="adamw_torch",
        run_name="probe",
        max_steps=1,
        save_steps=10,
        use_cpu=True,
    )
    _, trainer, _ = train(cfg, quiet=True)
    args = trainer.args
    assert (args.gradient_accumulation_steps, args.per_device_train_batch_size) == (2, 4)
    assert (args.max_grad_norm, str(args.optim.value if hasattr(args.optim, "value") else args.optim)) == (
        0.5,
        "adamw_torch",
    )
    assert args.run_name == "probe"
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    assert summary["config"]["global_batch_size"] == 8 and summary["config"]["truncate"] == "steps"


def test_a_trl_recipe_with_model_dataset_and_warmup_steps_trains(tmp_path, capsys):
    """A TRL example-script YAML (ScriptArguments + ModelConfig + PRMConfig keys): the model
    and dataset by their TRL names, the test split evaluated with eval_strategy: steps,
    warmup_steps in transformers 5's sense, eval_on_start and logging_first_step honoured."""
    from .helpers import make_counts, make_lm_dir

    lm = make_lm_dir(tmp_path / "lm")
    data = tmp_path / "prm_data"
    data.mkdir()
    make_counts(data / "train.jsonl")
    make_counts(data / "test.jsonl")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model_name_or_path: {lm}\n"
        "model_revision: main\n"
        f"dataset_name: {data}\n"
        "dataset_config: null\n"
        "dataset_train_split: train\n"
        "dataset_test_split: test\n"
        f"output_dir: {tmp_path / 'out'}\n"
        "eval_strategy: steps\n"
        "eval_steps: 2\n"
        "eval_on_start: true\n"
        "logging_first_step: true\n"
        "save_strategy: steps\n"
        "save_steps: 2\n"
        "warmup_steps: 1\n"
        "max_steps: 2\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 1\n"
        "use_peft: false\n"
        "lora_r: 16\n"
        "dtype: float32\n"
        "report_to: []\n"
        "use_cpu: true\n"
    )
    cfg = train_config("--config", str(recipe))
    assert (cfg.model, cfg.data, cfg.eval_data) == (str(lm), f"{data}:train", f"{data}:test")
    assert (cfg.warmup_steps, cfg.lora_r, cfg.precision, cfg.eval_on_start) == (1, 0, "fp32", True)
    assert "lora_r" in capsys.readouterr().err  # named, with use_peft: false
    assert main(["train", "--config", str(recipe)]) == 0
    summary = json.loads((tmp_path / "out" / "train_summary.json").read_text())
    steps = [h["step"] for h in summary["log_history"] if "eval_nll" in h] if "log_history" in summary else None
    state = json.loads(next((tmp_path / "out").glob("checkpoint-*/trainer_state.json")).read_text())
    evals = [h["step"] for h in state["log_history"] if "eval_nll" in h]
    assert evals[0] == 0 and 2 in evals, (evals, steps)  # evaluated on start, then every 2 steps
    assert any(h.get("step") == 1 and "loss" in h for h in state["log_history"])  # the first step logged


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        ("model_name_or_path: a\nmodel: b\ndata: d\n", "model_name_or_path and model name the same thing"),
        ("model: m\ndataset_name: d\ndataset_config: main\n", "default configuration"),
        ("model: m\ndata: d\neval_strategy: epoch\n", "eval_strategy: 'epoch'"),
        ("model: m\ndata: d\neval_strategy: steps\n", "needs held-out data"),
        ("model: m\ndata: d\ndtype: float16\n", "bfloat16 or float32"),
        ("model: m\ndata: d\nwarmup_steps: 2.5\n", "--warmup-steps must be a whole number"),
    ],
)
def test_trl_recipe_keys_that_cannot_run_are_refused_by_name(tmp_path, yaml_text, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml_text)
    with pytest.raises(BetaPRMInputError, match=message):
        train_config("--config", str(path))


@pytest.mark.parametrize(
    "report_to,message",
    [("bogus", "'bogus' is not a tracker transformers knows"), ("tensorboard,wandb", "wandb is not installed")],
)
def test_a_tracker_that_cannot_run_stops_before_data_or_model(tmp_path, capsys, report_to, message):
    """--report-to wandb without wandb, or a name no tracker has: exit 2 and one line, before the
    data is read (here it does not even exist) or the model loads."""
    pytest.importorskip("tensorboard")
    argv = ["train", "--model", str(tmp_path / "m"), "--data", str(tmp_path / "none.jsonl")]
    argv += ["--output-dir", str(tmp_path / "out"), "--report-to", report_to]
    import importlib.util

    if report_to.endswith("wandb") and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
