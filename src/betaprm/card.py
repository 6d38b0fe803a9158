"""The model card (``README.md``) of a saved BetaPRM, made with ``huggingface_hub``'s
model card classes so that the hub reads its metadata: library name, base model, tags,
datasets and licence, the evaluation results as ``model-index`` (``EvalResult``), and the
training hyperparameters and framework versions, in the YAML header; how to load, score
and serve the model (by its hub name, or the folder it was saved in), its objective, marker
and reward tokens, its training data, hyperparameters, versions and results in the body, as
a ``transformers.Trainer`` card lays them out."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .hub import is_hub_name, looks_local

# A data spec that names a file, not a hub dataset (the suffixes data.sources reads).
_DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow", ".gz")

__all__ = ["framework_versions", "license_of", "local_name", "model_card", "write_model_card"]

CARD_NAME = "README.md"

TASK_TYPE = "process-reward-modeling"
"""``model-index``'s task type: a PRM's score at each step marker of a reasoning trace."""

# Packages whose versions every card names (when installed), as the Trainer's card names
# Transformers, Pytorch, Datasets and Tokenizers; ``frameworks=`` adds others (peft, datasets).
_FRAMEWORKS = {
    "transformers": "Transformers",
    "torch": "Pytorch",
    "accelerate": "Accelerate",
    "peft": "PEFT",
    "datasets": "Datasets",
    "tokenizers": "Tokenizers",
}
_ALWAYS = ("transformers", "torch", "accelerate", "tokenizers")

_TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

A process reward model made with betaprm (`pip install betaprm`). At every step
marker `{{ marker }}` of a reasoning trace it gives `mu`, the probability that the trace,
continued from that step, ends correct (softmax over the `{{ yes }}`/`{{ no }}` logits), and
{% if kind == "beta" -%}
`kappa`, how much evidence that belief rests on (trained with the Beta-Binomial likelihood of
Monte Carlo counts): `sigma = sqrt(mu (1 - mu) / (kappa + 1))` is the belief's spread.
{%- else -%}
a `kappa` head that this model's objective ({{ objective }}) did not train: use `mu` alone.
{%- endif %}

## Use

```python
from betaprm import BetaPRM

prm = BetaPRM.from_pretrained("{{ name }}")
scores = prm.score("What is 2 + 3 * 4?", [["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."]])
print(scores[0].mu, scores[0].kappa, scores[0].sigma)
```

```bash
betaprm score --model {{ name }} --input pools.jsonl --output scored.jsonl
betaprm serve --model {{ name }} --port 8000   # /v1/score and OpenRLHF's /get_reward
```

## Details

| | |
|---|---|
| objective | {{ objective }} |
| base model | {{ base_model or "(a local folder)" }} |
| step marker | `{{ marker }}` (token id {{ marker_id }}) |
| reward tokens | `{{ yes }}` (id {{ yes_id }}), `{{ no }}` (id {{ no_id }}) |
| kappa_min | {{ kappa_min }} |
| training data | {{ data or "not recorded" }} |
| betaprm version | {{ version }} |
{% if results %}
## Evaluation results

{% if eval_data %}On {{ eval_data }}:

{% endif -%}
| metric | value |
|---|---|
{% for k, v in results.items() -%}
| {{ k }} | {{ v }} |
{% endfor %}
{%- endif %}
{% if hyperparameters %}
## Training procedure

### Training hyperparameters

The following hyperparameters were used during training:
{% for k, v in hyperparameters.items() %}
- {{ k }}: {{ v }}
{%- endfor %}
{% endif %}
{% if hyperparameters %}###{% else %}##{% endif %} Framework versions
{% for line in versions %}
- {{ line }}
{%- endfor %}
"""


def _data_names(spec) -> tuple[str, str]:
    """``(hub dataset or "", the name a card shows)`` of a data spec: a hub dataset by its name
    (a ``:SPLIT`` dropped from the first), a local file or folder by its name alone, never by
    the path it had on the machine that trained the model."""
    spec = str(spec or "")
    hub = spec.split(":")[0]
    if not is_hub_name(hub) or looks_local(hub) or Path(hub).exists() or hub.endswith(_DATA_FILE_SUFFIXES):
        return "", Path(spec).name
    return hub, spec


def framework_versions(config_version: str = "", frameworks=()) -> dict:
    """``{package: version}`` of betaprm (``config_version``: the one that saved the model),
    transformers, torch, accelerate and tokenizers, and of ``frameworks`` (e.g. ``peft``,
    ``datasets``: what a run used besides), each where installed."""
    out = {"betaprm": config_version} if config_version else {}
    for name in dict.fromkeys([*_ALWAYS, *frameworks]):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def local_name(directory) -> str:
    """How a card names the folder a model is saved in, for loading it: its path relative to
    the working folder when it lies inside it (``runs/bprm``), else its own name: a card
    never carries the machine's absolute paths."""
    path = Path(os.path.abspath(directory))
    try:
        return path.relative_to(Path.cwd()).as_posix() or path.name
    except ValueError:
        return path.name


def _number(v) -> float | None:
    """A metric as a finite float, or None (undefined: nan, missing, not a number)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def model_card(
    config,
    *,
    name: str | None = None,
    license: str | None = None,
    data: dict | None = None,
    results: dict | None = None,
    eval_data: dict | None = None,
    hyperparameters: dict | None = None,
    frameworks=(),
) -> ModelCard:
    """A ``ModelCard`` for a BetaPRM with ``config`` (a ``BetaPRMConfig``). ``name``: the
    hub repository (or folder) it is published as, named in the loading snippet; ``data``:
    ``{"name": ..., "fingerprint": ...}`` of its training data (a hub dataset name enters the
    metadata); ``results``: ``{metric: number}`` (None or nan: undefined, shown as n/a and
    left out of ``model-index``); ``eval_data``: ``{"name": ..., "split": ..., "step": ...}``,
    where the results come from (default: held-out data); ``hyperparameters``: the training
    settings, in the metadata and the body; ``frameworks``: packages whose versions are named
    besides betaprm, transformers, torch, accelerate and tokenizers; ``license``: a hub
    licence id (``other`` when unknown)."""
    objective = config.objective or "beta-binomial"
    kind = "beta" if objective == "beta-binomial" else "standard"
    data_name = str((data or {}).get("name") or "")
    hub_data, shown = _data_names(data_name)
    versions = framework_versions(config.betaprm_version, frameworks)
    eval_hub, eval_shown = _data_names((eval_data or {}).get("name") or "")
    split = (eval_data or {}).get("split")
    step = (eval_data or {}).get("step")
    model_name = (name or "BetaPRM").rstrip("/").split("/")[-1] or "BetaPRM"
    eval_results = [
        EvalResult(
            task_type=TASK_TYPE,
            task_name="Process reward modelling",
            dataset_type=eval_hub or eval_shown or "held-out",
            dataset_name=(eval_shown or "held-out data") + (f" ({split})" if split else ""),
            dataset_split=split or None,
            metric_type=key.removeprefix("eval_"),
            metric_name=key,
            metric_value=value,
        )
        for key, value in ((k, _number(v)) for k, v in (results or {}).items())
        if value is not None
    ]
    card_data = ModelCardData(
        library_name="betaprm",
        base_model=config.base_model or None,
        tags=["betaprm", "process-reward-model", "prm", "beta-binomial" if kind == "beta" else "standard-prm"],
        datasets=[hub_data] if hub_data else None,
        license=license or "other",
        model_name=model_name if eval_results else None,
        eval_results=eval_results or None,
        hyperparameters=dict(hyperparameters) if hyperparameters else None,
        framework_versions=versions,
    )
    data_text = f"`{shown}` (fingerprint `{data.get('fingerprint', '?')}`)" if data_name else ""
    where = ""
    if eval_data:
        where = f"`{eval_shown or 'held-out data'}`" + (f", {split}" if split else "")
        where += f" (step {step})" if step is not None else ""
    return ModelCard.from_template(
        card_data,
        template_str=_TEMPLATE,
        title=name or "BetaPRM",
        name=name or "PATH_OR_NAME",
        kind=kind,
        objective=objective,
        base_model=config.base_model,
        marker=config.marker,
        marker_id=config.marker_id,
        yes=config.reward_tokens[0],
        no=config.reward_tokens[1],
        yes_id=config.reward_token_ids[0],
        no_id=config.reward_token_ids[1],
        kappa_min=config.kappa_min,
        data=data_text,
        version=config.betaprm_version,
        results={k: "n/a" if _number(v) is None else f"{_number(v):.4g}" for k, v in (results or {}).items()},
        eval_data=where,
        hyperparameters=hyperparameters or {},
        versions=[f"{_FRAMEWORKS.get(k, k)} {v}" for k, v in versions.items()],
    )


def license_of(folder) -> str | None:
    """The licence in a model folder's own card (a hub snapshot's README.md), or None."""
    path = Path(folder) / CARD_NAME
    if not path.is_file():
        return None
    try:
        value = ModelCard.load(path, ignore_metadata_errors=True).data.license
    except Exception:  # a README that is not a card: no licence to inherit
        return None
    return value if isinstance(value, str) else None


def write_model_card(directory, config, **kwargs) -> Path:
    """``model_card(config, **kwargs)`` saved as ``directory/README.md``; without a ``name``
    the card names the folder (``local_name``) in its loading snippet."""
    path = Path(directory) / CARD_NAME
    kwargs["name"] = kwargs.get("name") or local_name(directory)
    model_card(config, **kwargs).save(path)
    return path
