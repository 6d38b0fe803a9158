"""A ``betaprm train --config`` file written for TRL's ``PRMConfig`` or transformers'
``TrainingArguments``: their keys mapped onto ``TrainConfig``'s fields.

A key that is a field of ours (``learning_rate``, ``per_device_train_batch_size``, ``bf16``,
...) is used as it is. A key of TrainingArguments or of PRMConfig that betaprm cannot honour
is named in one warning line each, with what it would have done, and left out: such a file
trains rather than stopping on ``do_train: true``. A key of neither stays an error (a typo).
The TrainingArguments field names are read from transformers when the file is loaded (a run,
never ``--help``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..numeric import shown

__all__ = ["PRM_CONFIG_KEYS", "from_file_keys", "training_arguments_fields"]

PRM_CONFIG_KEYS = {
    # TRL 1.13 PRMConfig's own fields (TrainingArguments' are read from transformers):
    # key -> (the value that does what betaprm does anyway, what TRL would have done).
    "max_prompt_length": (
        None,
        "TRL would cut the prompt to this many tokens; betaprm cuts whole steps to fit --max-length",
    ),
    "max_completion_length": (
        None,
        "TRL would cut the steps to this many tokens; betaprm cuts whole steps to fit --max-length",
    ),
    "disable_dropout": (False, "TRL would turn the model's dropout off; betaprm keeps the backbone's config"),
    "step_separator": (None, "TRL would join the steps with it; betaprm writes its marker (--marker) after each step"),
    "train_on_last_step_only": (False, "TRL would train on the last step's label only; betaprm trains on every step"),
    "dataset_num_proc": (1, "TRL would tokenise in this many processes; betaprm tokenises in one"),
    "average_tokens_across_devices": (None, "TRL would average the loss over the tokens of all devices"),
}

# TRL's example scripts read two more dataclasses from the same YAML: ScriptArguments (the data)
# and ModelConfig (the model). Their keys that betaprm cannot honour, each with what TRL would do;
# the ones it maps (model_name_or_path, dataset_name, ...) are read in ``from_file_keys``.
TRL_SCRIPT_KEYS = {
    "dataset_streaming": (False, "TRL would stream the dataset; betaprm reads it whole"),
    "gradient_checkpointing_use_reentrant": (None, "TRL's reentrant checkpointing choice; betaprm keeps torch's"),
    "ignore_bias_buffers": (False, "TRL's DDP workaround for bias buffers"),
    "lora_target_parameters": (None, "TRL would adapt these parameters; betaprm adapts --lora-target-modules"),
    "lora_modules_to_save": (None, "TRL would train these modules fully; betaprm trains the kappa head and LoRA"),
    "lora_task_type": ("CAUSAL_LM", "PEFT's task type; betaprm sets its own"),
    "use_rslora": (False, "TRL would scale LoRA by rank-stabilised alpha"),
    "use_dora": (False, "TRL would use DoRA"),
    "load_in_8bit": (False, "TRL would load the model quantised to 8 bits"),
    "load_in_4bit": (False, "TRL would load the model quantised to 4 bits"),
    "bnb_4bit_quant_type": ("nf4", "bitsandbytes' 4-bit type"),
    "use_bnb_nested_quant": (False, "bitsandbytes' nested quantisation"),
}
_LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
_STRATEGY_WHAT = {
    "save_strategy": "betaprm saves a checkpoint every --save-steps (the runs resume from them)",
    "logging_strategy": "betaprm logs every --logging-steps",
}


class RecipeError(ValueError):
    """A TRL / transformers recipe key whose value betaprm cannot run (the caller words it)."""


HONOURED_VALUES = {
    # TrainingArguments keys whose value is what betaprm train does anyway: no warning.
    "do_train": True,
    "save_strategy": "steps",
    "logging_strategy": "steps",
    "remove_unused_columns": False,
}


def training_arguments_fields() -> dict:
    """transformers' TrainingArguments fields by name (empty when transformers is missing)."""
    try:
        from transformers import TrainingArguments  # heavy: loaded only when a config file is read
    except ImportError:  # pragma: no cover - transformers is a dependency
        return {}
    return {f.name: f for f in dataclasses.fields(TrainingArguments)}


def _default(f):
    if f.default is not dataclasses.MISSING:
        return getattr(f.default, "value", f.default)  # an enum's value
    return None


def _brief(f) -> str:
    text = " ".join(str(f.metadata.get("help", "") or "").split())
    text = text.split(". ")[0].rstrip(".")
    return (text[:100] + "...") if len(text) > 100 else text or "a TrainingArguments setting"


def _warn(path: str, key: str, value, what: str) -> None:
    # numeric.shown: a bounded text of any value (repr of a nested one can be gigabytes)
    text = shown(value, 40)
    if any(word in key for word in ("token", "secret", "key")):  # hub_token: never echoed
        text = "(value not shown)"
    print(f"betaprm: warning: --config {path}: {key}: {text} is not used by betaprm train ({what})", file=sys.stderr)


def from_file_keys(cls, values: dict, path: str) -> dict:
    """``values`` (a --config file's keys) with TRL / TrainingArguments names mapped onto
    ``cls``'s fields: ``report_to`` as a list joined by commas, ``push_to_hub: true`` with
    ``hub_model_id`` (else the --output-dir's name, as transformers does) as our
    ``--push-to-hub NAME``, ``hub_private_repo`` as ``hub_private``; every other key of
    theirs dropped with one warning line each, unless its value is what betaprm does anyway.
    Keys of nobody's are kept, for the caller's unknown-key error."""
    ours = {f.name for f in dataclasses.fields(cls)}
    ours |= {old for f in dataclasses.fields(cls) for old in f.metadata.get("aliases", ())}
    values = _trl_recipe(dict(values), path)
    out = {k: v for k, v in values.items() if k in ours}
    if isinstance(out.get("report_to"), list):
        out["report_to"] = ",".join(map(str, out["report_to"])) or "none"
    if isinstance(out.get("push_to_hub"), bool):  # TrainingArguments' boolean: the repository is hub_model_id
        push = out.pop("push_to_hub")
        if push:
            out["push_to_hub"] = values.get("hub_model_id") or Path(str(values.get("output_dir", ""))).name
    foreign = [k for k in values if k not in ours]
    hf = training_arguments_fields() if foreign else {}
    at_default = []
    for key in foreign:
        value = values[key]
        if key == "hub_model_id" and out.get("push_to_hub") == value:  # read with push_to_hub above
            continue
        if key == "hub_private_repo" and "hub_private" not in values:
            out["hub_private"] = bool(value)
            continue
        if key in HONOURED_VALUES and value == HONOURED_VALUES[key]:
            continue
        if key in PRM_CONFIG_KEYS or key in TRL_SCRIPT_KEYS:
            same, what = PRM_CONFIG_KEYS.get(key) or TRL_SCRIPT_KEYS[key]
            if value != same and value is not None:
                _warn(path, key, value, what)
            continue
        if key in hf:
            if value == _default(hf[key]):
                at_default.append(key)
            else:
                _warn(path, key, value, f"TrainingArguments: {_brief(hf[key])}")
            continue
        out[key] = value  # neither ours nor theirs: the caller's unknown-key error names it
    if at_default:
        print(
            f"betaprm: warning: --config {path}: not used by betaprm train, at TrainingArguments' defaults: "
            + ", ".join(at_default),
            file=sys.stderr,
        )
    return out


def _trl_recipe(values: dict, path: str) -> dict:
    """A TRL recipe's script keys as ours: ``model_name_or_path`` (with ``model_revision``) as
    ``model``; ``dataset_name`` with ``dataset_train_split`` as ``data`` (``NAME:SPLIT``), and
    its ``dataset_test_split`` as ``eval_data`` when ``eval_strategy`` is ``steps``; ``dtype``
    (or ``torch_dtype``) as the training precision; ``use_peft: false`` leaves the recipe's
    LoRA keys out; the ``*_strategy`` keys checked. Raises ``RecipeError`` for what cannot run."""

    def take(key, default=None):
        return values.pop(key, default)

    def both(theirs, mine):
        if mine in values:
            raise RecipeError(f"{theirs} and {mine} name the same thing; keep one")

    if "model_name_or_path" in values:
        both("model_name_or_path", "model")
        model, revision = str(take("model_name_or_path")), take("model_revision")
        values["model"] = model if revision in (None, "", "main") else f"{model}@{revision}"
    elif take("model_revision") not in (None, "", "main"):
        raise RecipeError("model_revision without model_name_or_path: write the model as OWNER/NAME@REVISION")
    name = take("dataset_name")
    config, train_split, test_split = (
        take("dataset_config"),
        take("dataset_train_split", "train"),
        take("dataset_test_split", "test"),
    )
    if config not in (None, ""):
        raise RecipeError(
            f"dataset_config: {shown(config, 40)}: betaprm reads a hub dataset's default configuration; save that "
            "configuration's split with datasets' save_to_disk (or to JSONL/parquet) and give it as dataset_name"
        )
    evaluate = take("eval_strategy", take("evaluation_strategy", None))
    if evaluate not in (None, "no", "steps"):
        raise RecipeError(
            f"eval_strategy: {shown(evaluate, 20)}: betaprm evaluates every --eval-steps (eval_strategy: steps) or "
            "not at all (no)"
        )
    if name is not None:
        both("dataset_name", "data")
        one_file = Path(str(name)).is_file()  # a file is one split: no :SPLIT after it
        values["data"] = f"{name}:{train_split}" if train_split and not one_file else str(name)
        if evaluate == "steps" and not values.get("eval_data") and not values.get("eval_fraction"):
            if one_file:
                raise RecipeError(
                    f"dataset_name: {shown(name, 60)} is one file, so it has no {test_split!r} split to evaluate on; "
                    "give eval_data (or eval_fraction), or eval_strategy: no"
                )
            values["eval_data"] = f"{name}:{test_split}"
    if evaluate == "steps" and not values.get("eval_data") and not values.get("eval_fraction"):
        raise RecipeError("eval_strategy: steps needs held-out data: dataset_test_split, eval_data or eval_fraction")
    if evaluate == "no" and (values.get("eval_steps") or values.get("load_best_model_at_end")):
        values.pop("eval_steps", None)  # TrainingArguments ignores them without an eval strategy
        values.pop("load_best_model_at_end", None)
    for key, what in _STRATEGY_WHAT.items():
        value = take(key)
        if value not in (None, "steps"):
            _warn(path, key, value, what)
    dtype = take("dtype", take("torch_dtype"))
    if dtype not in (None, "auto"):
        precision = {"bfloat16": "bf16", "float32": "fp32"}.get(str(dtype))
        if precision is None:
            raise RecipeError(f"dtype: {shown(dtype, 20)}: betaprm trains in bfloat16 or float32")
        values.setdefault("precision", precision)
    # transformers 4's files carry warmup_steps: 0 (its default) beside warmup_ratio; in
    # transformers 5 warmup_steps is the one key (a ratio below 1).
    if values.get("warmup_steps") == 0 and "warmup_ratio" in values:
        del values["warmup_steps"]
    if "use_peft" in values:
        if take("use_peft"):
            values.setdefault("lora_r", 16)  # ModelConfig's default rank
        else:
            dropped = [k for k in _LORA_KEYS if values.pop(k, None) is not None]
            if dropped:
                _warn(path, ", ".join(dropped), "(use_peft: false)", "TRL would not use LoRA either")
    return values
