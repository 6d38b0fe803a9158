"""The model card (``README.md``) of a saved BetaPRM, made with ``huggingface_hub``'s
model card classes so that the hub reads its metadata: library name, base model, tags,
datasets and licence in the YAML header; how to load, score and serve the model, its
objective, marker and reward tokens, its training data and any evaluation results in the
body."""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .hub import is_hub_name, looks_local

# A data spec that names a file, not a hub dataset (the suffixes data.sources reads).
_DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow", ".gz")

__all__ = ["license_of", "model_card", "write_model_card"]

CARD_NAME = "README.md"

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

| metric | value |
|---|---|
{% for k, v in results.items() -%}
| {{ k }} | {{ v }} |
{% endfor %}
{%- endif %}
"""


def model_card(
    config,
    *,
    name: str | None = None,
    license: str | None = None,
    data: dict | None = None,
    results: dict | None = None,
) -> ModelCard:
    """A ``ModelCard`` for a BetaPRM with ``config`` (a ``BetaPRMConfig``). ``name``: the
    hub repository (or folder) it is published as; ``data``: ``{"name": ..., "fingerprint":
    ...}`` of its training data (a hub dataset name enters the metadata); ``results``: flat
    evaluation numbers for the body; ``license``: a hub licence id (``other`` when unknown)."""
    objective = config.objective or "beta-binomial"
    kind = "beta" if objective == "beta-binomial" else "standard"
    data_name = str((data or {}).get("name") or "")
    hub_data = data_name.split(":")[0]
    if not is_hub_name(hub_data) or looks_local(hub_data) or Path(hub_data).exists():
        hub_data = ""  # a local file or folder: its fingerprint goes in the body, not in the metadata
    elif hub_data.endswith(_DATA_FILE_SUFFIXES):
        hub_data = ""
    card_data = ModelCardData(
        library_name="betaprm",
        base_model=config.base_model or None,
        tags=["betaprm", "process-reward-model", "prm", "beta-binomial" if kind == "beta" else "standard-prm"],
        datasets=[hub_data] if hub_data else None,
        license=license or "other",
    )
    # The card is published: a local file or folder appears by its name alone, never by the
    # path it had on the machine that trained the model.
    shown = data_name if hub_data else Path(data_name).name
    data_text = f"`{shown}` (fingerprint `{data.get('fingerprint', '?')}`)" if data_name else ""
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
        results=results or {},
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
    """``model_card(config, **kwargs)`` saved as ``directory/README.md``."""
    path = Path(directory) / CARD_NAME
    model_card(config, **kwargs).save(path)
    return path
