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
        if key in PRM_CONFIG_KEYS:
            same, what = PRM_CONFIG_KEYS[key]
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
