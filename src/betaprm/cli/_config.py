"""Command-line flags derived from a config dataclass.

Every field becomes ``--field-name`` with its ``metadata["help"]``; booleans get
``--flag/--no-flag``. ``--config FILE.yaml`` (or .json) supplies defaults, flags given
on the command line override them, and unknown keys in the file are an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import get_type_hints

from ..errors import BetaPRMInputError


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    hints = get_type_hints(cls)
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON file of defaults for the flags below (flags win)")
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f.metadata.get("help", "")
        # An unset (None) default is explained by the help text itself ("the world's near_miss").
        help_text = (f"{help_text} (default: {default!r})" if default is not None else help_text) if help_text else f"default: {default!r}"
        kwargs = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        if typ is bool:
            parser.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
        elif typ in (int, float, str):
            parser.add_argument(_flag(f.name), type=typ, metavar=f.name.upper(), **kwargs)
        elif typ in (int | None, float | None, str | None):
            inner = typ.__args__[0]
            parser.add_argument(_flag(f.name), type=inner, metavar=f.name.upper(), **kwargs)
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported config type {typ}")


def load_config_file(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise BetaPRMInputError(f"--config {path}: no such file")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:
        raise BetaPRMInputError(f"--config {path}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BetaPRMInputError(f"--config {path}: expected a mapping of option names to values, got {type(data).__name__}")
    return {k.replace("-", "_"): v for k, v in data.items()}


def config_from_args(cls, ns: argparse.Namespace):
    """Dataclass defaults < ``--config`` file < command-line flags."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    if getattr(ns, "config", None):
        values = load_config_file(ns.config)
        unknown = sorted(set(values) - names)
        if unknown:
            raise BetaPRMInputError(f"--config {ns.config}: unknown keys {unknown}; allowed: {sorted(names)}")
    values.update({k: v for k, v in vars(ns).items() if k in names})
    try:
        return cls(**values)
    except TypeError as e:
        raise BetaPRMInputError(f"bad configuration: {e}") from None
