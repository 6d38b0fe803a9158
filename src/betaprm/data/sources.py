"""Where records come from: a JSONL file, a ``.json`` list, a parquet file, a
``datasets`` ``save_to_disk`` folder, or anything ``datasets.load_dataset`` opens (a hub
name, from the local cache when offline, or a local folder of data files).

A source is named by one string, ``SPEC[:SPLIT]``: ``train.jsonl``, ``counts.parquet``,
``saved_folder``, ``saved_folder:test``, ``Qwen/ProcessBench:gsm8k``. A plain folder of data
files (``gsm8k.json``, ``math.json``) has one split per file, named by the file's stem; JSON,
JSONL and parquet files there are read as files are (line by line, each with its own fields). An existing path
always wins over the ``:SPLIT`` reading, so a file whose name holds a colon still opens.
A broken link or link loop, and a missing name that reads as a local path (``_looks_local``)
and is no hub dataset in the local cache, are a missing file at once, never a hub lookup.
A source with several splits and none named is an error listing them, unless the caller
reads every split (``iter_splits``, as the ProcessBench evaluator does: its splits are
its subsets).

Every reader yields ``(row number, row, problem, raw text)`` like ``records.iter_jsonl``,
so one validator serves every source. Table rows come back as plain dicts with null
cells dropped: a table has a cell for every column, and a null there means the field is
absent from that row (a JSONL line would simply leave it out).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import BetaPRMInputError
from ..hub import looks_local
from .jsonl import Problem, iter_jsonl, load_json_file, open_input

Row = tuple[int, Any, "Problem | None", "str | None"]
LOADABLE = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
"""Data files in a plain folder that become splits, with the datasets builder for each."""
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow", ".gz")
"""A missing path with one of these is a missing file, never tried as a hub name."""


def _table_rows(rows) -> Iterator[Row]:
    for i, row in enumerate(rows, 1):
        yield i, ({k: v for k, v in row.items() if v is not None} if isinstance(row, dict) else row), None, None


def _parquet_rows(path: Path, flag: str | None) -> Iterator[Row]:
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise BetaPRMInputError(
            f"{path}: reading parquet needs pyarrow (`pip install pyarrow`, or the `[datasets]` extra), or convert "
            "it to JSONL first"
        ) from None
    open_input(path, flag).close()
    try:
        rows = pq.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError, ValueError) as e:
        raise BetaPRMInputError(
            f"{flag + ' ' if flag else ''}{path}: not a readable parquet file ({e}); fix: re-export it, or convert it "
            "to JSONL"
        ) from None
    return _table_rows(rows)


def _json_rows(path: Path, flag: str | None) -> Iterator[Row]:
    """A ``.json`` file holding a JSON list; one that starts with anything but ``[`` is read
    as JSON lines (many JSONL files are named .json)."""
    with open_input(path, flag) as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        return iter_jsonl(path, flag)
    data = load_json_file(path, flag, "a JSON list of records")
    if not isinstance(data, list):
        raise BetaPRMInputError(
            f"{path}: a .json input must hold a list of records; use JSONL (.jsonl) for one record per line"
        )
    return ((i, row, None, None) for i, row in enumerate(data, 1))


def is_saved_dataset(path: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _split_spec(spec: str) -> tuple[str, str | None]:
    if Path(spec).exists() or ":" not in spec:
        return spec, None
    name, split = spec.rsplit(":", 1)
    return name, split or None


def _open_dataset(name: str, flag: str | None):
    """A ``Dataset`` or ``DatasetDict`` from a saved folder, or from ``load_dataset``."""
    try:
        import datasets
    except ImportError:
        raise BetaPRMInputError(
            f"{flag + ' ' if flag else ''}{name}: reading a datasets folder or hub name needs `pip install datasets` "
            "(the `[datasets]` extra)"
        ) from None
    p = Path(name)
    if p.is_dir() and is_saved_dataset(p):
        try:
            return datasets.load_from_disk(str(p))
        except (OSError, ValueError) as e:
            raise BetaPRMInputError(
                f"{flag + ' ' if flag else ''}{name}: a save_to_disk folder that datasets cannot read ({e}); fix: "
                "save it again"
            ) from None
    # A plain folder of data files: one split per file, named by its stem (load_dataset alone
    # would put gsm8k.json and math.json together in "train"). Nested layouts are left to it.
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in LOADABLE) if p.is_dir() else []
    try:
        if files:
            kinds = {LOADABLE[f.suffix] for f in files}
            if len(kinds) > 1:
                raise BetaPRMInputError(
                    f"{flag + ' ' if flag else ''}{name}: a folder of data files of several kinds "
                    f"({', '.join(f.name for f in files)}); keep one kind, or name a file"
                )
            return datasets.load_dataset(kinds.pop(), data_files={f.stem: str(f) for f in files})
        return datasets.load_dataset(name)
    except BetaPRMInputError:
        raise
    except Exception as e:  # datasets raises many kinds (ConnectionError, FileNotFoundError, its own)
        where = "a folder of data files" if p.is_dir() else "a hub name"
        raise BetaPRMInputError(
            f"{flag + ' ' if flag else ''}{name}: not a file, and datasets could not load it as {where} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); fix: give a .jsonl, .json or "
            ".parquet file or a save_to_disk folder, or a hub name that is in the local cache (offline: set "
            "HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 so it is read from there without trying the network)"
        ) from None


def _splits(name: str, split: str | None, flag: str | None, want_all: bool) -> list[tuple[str | None, Any]]:
    ds = _open_dataset(name, flag)
    if not hasattr(ds, "keys"):  # one Dataset
        if split is not None:
            raise BetaPRMInputError(
                f"{flag + ' ' if flag else ''}{name}:{split}: {name} holds a single table, not splits; drop ':{split}'"
            )
        return [(None, ds)]
    names = list(ds.keys())
    if split is not None:
        if split not in ds:
            raise BetaPRMInputError(
                f"{flag + ' ' if flag else ''}{name}:{split}: no split {split!r}; it has {', '.join(names)}"
            )
        return [(split, ds[split])]
    if len(names) == 1 or want_all:
        return [(s, ds[s]) for s in names]
    raise BetaPRMInputError(
        f"{flag + ' ' if flag else ''}{name} has {len(names)} splits ({', '.join(names)}); name one as "
        f"{name}:SPLIT, e.g. {name}:{names[0]}"
    )


def _file_rows(path: Path, flag: str | None) -> Iterator[Row]:
    if path.suffix == ".parquet":
        return _parquet_rows(path, flag)
    if path.suffix == ".json":
        return _json_rows(path, flag)
    return iter_jsonl(path, flag)


def _in_hub_cache(name: str) -> bool:
    """Whether a hub dataset ``name`` has been downloaded (``datasets``' cache or the hub's)."""
    folders = []
    try:
        from datasets import config

        folders.append(Path(config.HF_DATASETS_CACHE) / name.replace("/", "___"))
    except ImportError:
        pass
    try:
        from huggingface_hub import constants

        folders.append(Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}")
    except ImportError:
        pass
    return any(f.is_dir() for f in folders)


def _looks_local(name: str) -> bool:
    """A name that reads as a path rather than OWNER/NAME: one word (a hub dataset is named
    OWNER/NAME), or what ``hub.looks_local`` takes for a path (``data/cnts`` with ``data/``
    here)."""
    return "/" not in name or looks_local(name)


def _refuse_missing(spec: str, name: str, flag: str | None) -> None:
    """A path that cannot be a hub name is a missing file at once: sending it to the hub
    costs retries and ends in a message about the hub, not the path."""
    where = f"{flag + ' ' if flag else ''}{spec}"
    for path in {spec, name}:
        if os.path.lexists(path) and not Path(path).exists():
            raise BetaPRMInputError(
                f"{where}: no such file ({path} is a symbolic link to a missing file, or a link loop); fix: the link, "
                "or give the file itself"
            )
    if not Path(spec).exists() and not Path(name).exists() and _looks_local(name) and not _in_hub_cache(name):
        raise BetaPRMInputError(
            f"{where}: no such file or folder (nor a hub dataset of that name in the local cache); check the path "
            "(a hub dataset is named OWNER/NAME[:SPLIT], e.g. Qwen/ProcessBench)"
        )


def iter_splits(spec, flag: str | None = None, all_splits: bool = True) -> list[tuple[str | None, Iterator[Row]]]:
    """``(split name or None, rows)`` for each split the source holds (a file: one, None).
    With ``all_splits`` False a source of several splits must name one."""
    spec = str(spec)
    p = Path(spec)
    name = _split_spec(spec)[0]
    _refuse_missing(spec, name, flag)
    looks_like_path = (
        p.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or p.suffix in FILE_SUFFIXES
    )
    if p.is_file() or (not p.exists() and not Path(name).exists() and looks_like_path):
        return [(None, _file_rows(p, flag))]  # a missing file gets open_input's message
    name, split = _split_spec(spec)
    if split is not None and Path(name).is_file():
        raise BetaPRMInputError(
            f"{flag + ' ' if flag else ''}{spec}: {name} is a file, which has no splits; drop ':{split}'"
        )
    own = _own_files(Path(name))
    if own:
        # Read line by line like a single file (exact rows, errors naming file and line):
        # datasets would cast every file to one schema and refuse files whose fields differ.
        if split is not None:
            if split not in own:
                raise BetaPRMInputError(
                    f"{flag + ' ' if flag else ''}{name}:{split}: no file {split}.* in {name}; it has {', '.join(own)}"
                )
            return [(split, _file_rows(own[split], flag))]
        if len(own) > 1 and not all_splits:
            first = next(iter(own))
            raise BetaPRMInputError(
                f"{flag + ' ' if flag else ''}{name} has {len(own)} data files ({', '.join(own)}); name one as "
                f"{name}:STEM, e.g. {name}:{first}, or give the file"
            )
        return [(stem, _file_rows(f, flag)) for stem, f in own.items()]
    return [(s, _table_rows(ds)) for s, ds in _splits(name, split, flag, all_splits)]


def _own_files(folder: Path) -> dict[str, Path]:
    """A plain folder's JSON, JSONL and parquet files by stem (each a split), when it holds
    only such files; otherwise nothing (datasets reads the folder)."""
    if not folder.is_dir() or is_saved_dataset(folder):
        return {}
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix in LOADABLE)
    if not files or any(f.suffix not in (".jsonl", ".json", ".parquet") for f in files):
        return {}
    if len({f.suffix == ".parquet" for f in files}) > 1:
        return {}  # several kinds: _open_dataset names them
    by_stem: dict[str, Path] = {}
    for f in files:
        if f.stem in by_stem:  # x.json and x.jsonl: one split name for two files
            raise BetaPRMInputError(
                f"{folder}: {by_stem[f.stem].name} and {f.name} would both be split {f.stem!r}; keep one, or name a "
                "file"
            )
        by_stem[f.stem] = f
    return by_stem


def reads_with_datasets(spec) -> bool:
    """Whether ``iter_splits`` reads ``spec`` through the ``datasets`` library (a hub name, a
    ``save_to_disk`` folder, a folder of data files it opens), not file by file itself."""
    spec = str(spec)
    name = _split_spec(spec)[0]
    if Path(spec).is_file() or Path(name).is_file():
        return False
    if Path(name).is_dir():
        return not _own_files(Path(name))
    return True


def iter_rows(spec, flag: str | None = None) -> Iterator[Row]:
    """The rows of one source (see the module docstring)."""
    ((_, rows),) = iter_splits(spec, flag, all_splits=False)
    return rows


def base_dir(spec) -> Path | None:
    """The folder that relative image paths in the source are relative to: the file's
    folder, the saved dataset's folder, or none (a hub dataset: paths must be absolute or
    relative to the working directory)."""
    p = Path(_split_spec(str(spec))[0])
    if p.is_file():
        return p.parent
    if p.is_dir():
        return p
    return None
