"""Command-line flags derived from a config dataclass.

Every field becomes ``--field-name`` with its ``metadata["help"]``; booleans get
``--flag/--no-flag``. ``--config FILE.yaml`` (or .json) supplies defaults, flags given
on the command line override them, and unknown keys in the file are an error. Config
fields are made with ``opt(default, help_text)`` (``betaprm.options``, re-exported here).

A field renamed keeps its old name for one release: ``opt(..., aliases=("old_name",))``
adds a hidden ``--old-name`` flag and accepts ``old_name`` in config files, each with a
deprecation message on stderr naming the new one; a renamed value likewise
(``opt(..., old_values={"old": "new"})``).

Every flag is also accepted in its underscore spelling, ``--learning_rate`` for
``--learning-rate`` (Hugging Face's ``TrainingArguments`` habit), hidden from ``--help``.
``opt(..., required=True)`` shows ``(required)`` in the help and ``choices=(...)`` lists the
values as the metavar; both are checked by ``config_from_args`` for flags and config-file
values alike (``betaprm.options.field_problems``): a required flag may come from the file, so
argparse's own ``required=`` is not used.

A text option made with ``opt(..., joined=",")`` takes several values: the flag repeated
(``--base-url A --base-url B``) joins them with the separator, as the one flag ``--base-url
A,B`` would, and a config file may give them as a list.

A config class may translate a file's foreign keys (another tool's names for its options)
with a classmethod ``from_file_keys(values, path) -> values``, called on the file's keys
before they are checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import sys
from pathlib import Path
from typing import get_type_hints

from ..data.jsonl import BadJSON, decode_utf8, load_json_file, open_input
from ..errors import BetaPRMInputError
from ..numeric import NumberRefused, number, rule_text, shown
from ..options import field_problems, opt
from ..options import flag_name as _flag
from ..progress import disable_bars

__all__ = ["add_config_args", "config_from_args", "expand_path", "load_config_file", "number_flag", "opt"]


def add_config_args(parser: argparse.ArgumentParser, cls) -> None:
    hints = get_type_hints(cls)
    parser.add_argument(
        "--config", metavar="FILE", help="YAML or JSON file of defaults for the flags below (flags win)"
    )
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        help_text = f.metadata.get("help", "")
        # An unset (None) default is explained by the help text itself ("the world's near_miss").
        shown = f"(default: {default!r})" if default is not None else ""
        if f.metadata.get("required"):
            shown = "(required)"
        help_text = f"{help_text} {shown}".strip() if help_text else shown or f"default: {default!r}"
        kwargs = dict(dest=f.name, default=argparse.SUPPRESS, help=help_text)
        choices = f.metadata.get("choices")
        if typ is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typ in (int, float, str, int | None, float | None, str | None):
            base = typ if typ in (int, float, str) else typ.__args__[0]
            kwargs.update(type=_FLAG_TYPES.get(base, base), metavar=f.name.upper())
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported config type {typ}")
        if f.metadata.get("joined") and typ in (str, str | None):
            kwargs["action"] = _joining(f.metadata["joined"])
        if choices is not None and typ is not bool:
            # Listed, not enforced by argparse: a value may come from the file, and a renamed
            # one (old_values) is still accepted; config_from_args checks both.
            kwargs["metavar"] = "{" + ",".join(map(str, choices)) + "}"
        parser.add_argument(_flag(f.name), **kwargs)
        hidden = {**kwargs, "help": argparse.SUPPRESS}
        if "_" in f.name:  # the Hugging Face spelling, --learning_rate: the same flag, not deprecated
            parser.add_argument("--" + f.name, **hidden)
        for old in f.metadata.get("aliases", ()):
            base = argparse.BooleanOptionalAction if typ is bool else _Store
            for spelling in dict.fromkeys((_flag(old), "--" + old)):
                parser.add_argument(spelling, **{**hidden, "action": _deprecated(base, f.name)})


def _number_text(integer: bool):
    """An argparse type that reads a number flag's text (``1e-5``, ``12``). Whether the number
    is allowed (finite, an integer's size, the option's range) is ``config_from_args``' check,
    after the option's own, which words its range."""

    def read(text: str):
        try:
            return int(text) if integer else float(text)
        except ValueError:  # the message shows at most numeric.MAX_SHOWN characters of the text
            raise argparse.ArgumentTypeError(f"must be {rule_text(integer)}, got {shown(text)}") from None

    read.__name__ = "int" if integer else "float"
    return read


_FLAG_TYPES = {int: _number_text(True), float: _number_text(False)}


def number_flag(integer: bool = False, **rule):
    """An argparse type for a flag not made from a config field: the text read and checked by
    ``numeric.number`` (finite, an integer's size, ``rule``'s ``low``/``high``) at once."""

    def read(text: str):
        try:
            return number(text, "", integer=integer, text=True, **rule)
        except NumberRefused as e:
            raise argparse.ArgumentTypeError(e.reason) from None

    read.__name__ = "int" if integer else "float"
    return read


def deprecation(old: str, new: str) -> None:
    """The one message a renamed option prints (stderr), then goes on with the new name."""
    print(f"betaprm: warning: {old} is deprecated and will be removed; use {new}", file=sys.stderr)


class _Store(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


def _joining(sep: str):
    """An argparse action that joins a repeated flag's values with ``sep`` (argparse's own
    store would keep the last one and drop the others without a word)."""

    class Joining(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            before = getattr(namespace, self.dest, None)
            setattr(namespace, self.dest, values if before is None else f"{before}{sep}{values}")

    return Joining


def _deprecated(base, new_name: str):
    """An argparse action that stores like ``base`` and says which flag replaces it."""

    class Deprecated(base):
        def __call__(self, parser, namespace, values, option_string=None):
            new = _flag(new_name)
            if option_string.startswith("--no-"):
                new = "--no-" + new[2:]
            deprecation(option_string, new)
            super().__call__(parser, namespace, values, option_string)

    return Deprecated


def _renamed(cls) -> dict[str, str]:
    """Old field name -> new one, from the fields' ``aliases``."""
    return {old: f.name for f in dataclasses.fields(cls) for old in f.metadata.get("aliases", ())}


class _AliasRefused(Exception):
    def __init__(self, mark):
        super().__init__(mark)
        self.mark = mark


@functools.cache
def _yaml_loader():
    """``yaml.SafeLoader`` without aliases, and with YAML 1.2's numbers.

    An alias (``*name``, ``<<: *name``) is refused where it is read: nested aliases make a
    539-byte file a value of billions of items (the "billion laughs"), which any message or
    comparison that walks it would expand. And ``1e-5`` / ``1.0e5`` are floats, as in YAML
    1.2 and on the command line; PyYAML (YAML 1.1) reads them as text, so a TRL config's
    ``learning_rate: 1e-5`` would be refused as a string."""
    import yaml  # loaded when a YAML config is read, not by --help

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _AliasRefused(self.peek_event().start_mark)
            return super().compose_node(parent, index)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?|[-+]?\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def load_config_file(path: str) -> dict:
    p = Path(path)
    if p.suffix == ".json":
        data = load_json_file(p, "--config", "a JSON object of option names to values")
    else:
        import yaml

        with open_input(p, "--config") as f:
            raw = f.read()
        try:
            data = yaml.load(decode_utf8(raw), Loader=_yaml_loader())  # a SafeLoader subclass
        except BadJSON as e:
            raise BetaPRMInputError(f"--config {path}:{e.lineno}: {e.reason}; fix: save the file as UTF-8") from None
        except _AliasRefused as e:
            raise BetaPRMInputError(
                f"--config {path}:{e.mark.line + 1}: uses a YAML alias (*name); aliases and anchors are not read, "
                "since nested ones expand a small file into billions of values; fix: write each value out in full"
            ) from None
        except (yaml.YAMLError, RecursionError) as e:
            raise BetaPRMInputError(f"--config {path}: not valid YAML: {shown(str(e), 300)}") from None
        except ValueError:  # PyYAML's int() of an integer over 4300 digits
            raise BetaPRMInputError(
                f"--config {path}: holds an integer with more than 4300 digits, which no option can use"
            ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BetaPRMInputError(
            f"--config {path}: expected a mapping of option names to values, got {type(data).__name__}"
        )
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise BetaPRMInputError(f"--config {path}: option names must be strings, got {bad_keys[0]!r}")
    return {k.replace("-", "_"): v for k, v in data.items()}


def _typed(cls, values: dict, path: str) -> dict:
    """The file's values checked against the fields' types (as a flag's value would be):
    an int is accepted for a float field, nothing else is converted."""
    hints, out, bad = get_type_hints(cls), {}, []
    joined = {f.name: f.metadata.get("joined") for f in dataclasses.fields(cls)}
    for k, v in values.items():
        typ = hints[k]
        optional = typ in (int | None, float | None, str | None)
        base = typ.__args__[0] if optional else typ
        if v is None and optional:
            out[k] = v
        elif base is bool and isinstance(v, bool) or base is str and isinstance(v, str):
            out[k] = v
        elif joined.get(k) and isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            out[k] = joined[k].join(v)  # several values, as the flag repeated would give them
        elif base in (int, float) and not isinstance(v, str):
            try:  # numeric.number: the one check of flags, config files, records and requests
                x = number(v, k, integer=base is int, what=rule_text(base is int) + (" or null" if optional else ""))
            except NumberRefused as e:
                bad.append(str(e))
            else:
                out[k] = float(x) if base is float else x
        else:
            expected = {bool: "true or false", str: "a string"}.get(base) or rule_text(base is int)
            if joined.get(k):
                expected = "a string or a non-empty list of strings"
            bad.append(f"{k} must be {expected}{' or null' if optional else ''}, got {shown(v)}")
    if bad:
        raise BetaPRMInputError(
            f"--config {path}: wrong value types:\n  "
            + "\n  ".join(bad)
            + "\nfix: write each option as it would be given on the command line"
        )
    return out


def _old_values(cls, values: dict, given: dict) -> None:
    """Renamed values (a field's ``old_values``) replaced by the new ones, with the deprecation
    message naming where the old one was given (``given``: name -> where)."""
    for f in dataclasses.fields(cls):
        old = values.get(f.name)
        new = f.metadata.get("old_values", {}).get(old) if isinstance(old, str) else None
        if new is not None:
            deprecation(f"{given[f.name]} {old}", f"{_flag(f.name)} {new}")
            values[f.name] = new


PATH_FIELDS = frozenset(
    {
        "backbone",
        "baseline",
        "config",
        "data",
        "eval_data",
        "failed",
        "frontier",
        "image_root",
        "input",
        "model",
        "out",
        "output",
        "output_dir",
        "plots",
        "policy",
        "policy_tokenizer",
        "pools",
        "problems",
        "rejects",
        "resume_from_checkpoint",
        "world_config",
    }
)
"""Options that name a file or folder (in any command): a leading ``~`` is the home folder
(``expand_path``), from a flag or a config file alike, and the expanded path is what every
message shows (a quoted ``'~/w/ckpt'`` reaches betaprm unexpanded by the shell)."""


def expand_path(value):
    """``~/x`` and ``~user/x`` as the home folder's ``x``; anything else (a hub name, a
    relative path, None) as it is. Comma-separated lists (``--pools a,b``) item by item."""
    if not isinstance(value, str) or "~" not in value:
        return value
    return ",".join(os.path.expanduser(v) if v.startswith("~") else v for v in value.split(","))


def _number_problems(cls, values: dict, given: dict) -> list[tuple[bool, str]]:
    """``(an integer field, message)`` for each int or float option refused by
    ``numeric.number``: not finite, or an integer too large for any setting."""
    hints, bad = get_type_hints(cls), []
    for k, v in values.items():
        typ = hints.get(k)
        base = typ.__args__[0] if typ in (int | None, float | None) else typ
        if base in (int, float) and v is not None:
            try:
                number(v, given.get(k, _flag(k)), integer=base is int)
            except NumberRefused as e:
                bad.append((base is int, str(e)))
    return bad


def config_from_args(cls, ns: argparse.Namespace):
    """Dataclass defaults < ``--config`` file < command-line flags; then every required flag
    given and every value among its field's choices, all problems named in one error. Paths
    (``PATH_FIELDS``) have ``~`` expanded; numbers are checked by ``numeric.number`` (a
    config file's as they are read; a flag's integer size first, its finiteness after the
    config's own checks, which word the option's range)."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {}
    if getattr(ns, "config", None):
        ns.config = expand_path(ns.config)
        values = load_config_file(ns.config)
        if hasattr(cls, "from_file_keys"):
            values = cls.from_file_keys(values, ns.config)
        for old, new in _renamed(cls).items():
            if old in values:
                deprecation(f"--config {ns.config}: key {old!r}", repr(new))
                if new in values:
                    raise BetaPRMInputError(
                        f"--config {ns.config}: both {old!r} and its new name {new!r} are set; keep {new!r}"
                    )
                values[new] = values.pop(old)
        unknown = sorted(set(values) - names)
        if unknown:
            raise BetaPRMInputError(f"--config {ns.config}: unknown keys {unknown}; allowed: {sorted(names)}")
        values = _typed(cls, values, ns.config)
    given = {k: f"--config {ns.config}: {k}:" for k in values}
    flags = {k: v for k, v in vars(ns).items() if k in names}
    values.update(flags)
    given.update({k: _flag(k) for k in flags})
    values.update({k: expand_path(v) for k, v in values.items() if k in PATH_FIELDS})
    _old_values(cls, values, given)
    numbers = _number_problems(cls, values, given)
    bad = field_problems(cls, values) + [m for integer, m in numbers if integer]
    if bad:
        where = " (on the command line or in the --config file)" if any("required" in b for b in bad) else ""
        raise BetaPRMInputError(f"bad configuration{where}:\n  " + "\n  ".join(bad))
    non_finite = BetaPRMInputError("bad configuration:\n  " + "\n  ".join(m for _, m in numbers))
    try:
        config = cls(**values)
    except BetaPRMInputError:
        raise  # the config's own check, which names the option's range
    except (TypeError, ValueError, OverflowError) as e:
        if numbers:  # a config's check tripped over a nan or inf: say so, not its error
            raise non_finite from None
        if isinstance(e, TypeError):
            raise BetaPRMInputError(f"bad configuration: {e}") from None
        raise
    if numbers:  # nan or inf in an option whose config has no check of its own
        raise non_finite
    # Read by the command's path checks (provenance.config_file_of): the file is an input,
    # which no output may write over.
    config.config_file = getattr(ns, "config", None)
    if getattr(config, "disable_tqdm", False):  # --disable-tqdm: the bars of the whole command, however made
        disable_bars()
    return config
