"""Outputs that know where they came from.

Every resumable output ``OUT`` (JSONL, appended) is written through ``open_output``:

- ``OUT.meta.json`` (the sidecar) records the *settings* that made its records: the
  command's options that change results, with the model as a fingerprint of its files.
  The JSONL lines stay records; the sidecar is written before the first record. A rerun
  compares its settings with the sidecar's and stops, naming each key that differs,
  instead of appending records of other settings to the ones already there;
- ``OUT.lock`` is held (``fcntl.flock``, exclusive, non-blocking) for as long as the run
  writes, so a second process on the same output stops at once instead of writing every
  record a second time. The OS drops the lock when the holder exits or is killed, so a
  killed run never leaves a stale lock. A run that ends removes its lock file; a process
  that locked a file just removed sees that the path no longer names its file and
  locks again, so removing never lets two writers in. A failed run also removes a
  sidecar it wrote when no record was written;
- existing records without a sidecar are refused unless ``--adopt-output`` says to take
  them as this run's (``OutputOptions``): a moved-away sidecar must not let records of
  another model be resumed under this one's settings.
- the part files ``OUT.part0``, ``OUT.part1``, ... of processes sharing a run
  (``betaprm.distributed``) hold records of ``OUT`` too: the checks above count them.

``check_paths`` refuses an output (or rejects, or plot) path that is one of the command's
inputs or another of its outputs, and one that cannot be written, before any work starts.

Over 400 lines because everything that decides whether an output may be written (paths,
locks, sidecars, strict JSON) is kept in one place, so every command applies the same rules.

Settings leave out what does not change a record: batch sizes (scores do not depend on
how traces are batched), devices, progress, output and input paths. The input file is
not part of the settings either: a rerun after records were added to it scores the new
ones, which is what resuming is for.

A rerun skips the records already there (``completed_ids``, which also cuts off a last
line an interrupted write left without its newline). Records are written with
``json_line``: strict JSON (no NaN or Infinity, which most JSON readers reject), or an
error naming the record and the field before anything of that record is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import time
from pathlib import Path

from .errors import BetaPRMInputError
from .hub import resolve_model
from .options import opt
from .progress import progress_bar

logger = logging.getLogger(__name__)

META_SUFFIX = ".meta.json"
LOCK_SUFFIX = ".lock"

# Files betaprm writes next to a model that are not the model: a run's summary and
# checkpoint bookkeeping must not change the model's fingerprint.
_NOT_MODEL = {"train_summary.json", "betaprm_run.json", "trainer_state.json", "training_args.json"}
_MODEL_SUFFIXES = {".json", ".safetensors", ".bin", ".gguf", ".model", ".tiktoken", ".jinja", ".txt"}
_WHOLE = 16 << 20  # files up to this size are hashed whole
_BLOCK = 1 << 20
_SAMPLES, _SAMPLE = 64, 256 << 10  # a larger file: this many blocks of this size, evenly spaced


def version() -> str:
    """This betaprm's version, as recorded in every output's provenance."""
    try:
        return importlib.metadata.version("betaprm")
    except Exception:  # running from a source tree without installation
        return "0+unknown"


def _hash_file(h, path: Path) -> None:
    """Feed ``path`` to ``h``: whole when small; a large (weights) file by its size, its
    first and last MiB (a safetensors header, with every tensor's name, dtype, shape and
    offset, is at the start) and 64 evenly spaced 256 KiB blocks in between: at most
    18 MiB read whatever the size, so fingerprinting a GB checkpoint takes moments.
    Training changes every tensor it updates, so two checkpoints differ in the blocks
    read; it is a cheap identity, not a proof that no byte changed."""
    size = path.stat().st_size
    h.update(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        if size <= _WHOLE:
            for chunk in iter(lambda: f.read(_BLOCK), b""):
                h.update(chunk)
            return
        blocks = [(0, _BLOCK), (size - _BLOCK, _BLOCK)] + [
            (size * i // (_SAMPLES + 1), _SAMPLE) for i in range(1, _SAMPLES + 1)
        ]
        for offset, n in blocks:
            f.seek(offset)
            h.update(f.read(n))


def model_fingerprint(path) -> str:
    """A short hex id of a model directory's contents: its weights, configs and tokenizer
    files (by name and content, not by path or modification time, so a copied or moved
    model keeps its fingerprint). A hub name is resolved to its snapshot (``betaprm.hub``:
    the cache, or a download, as loading the model would), so a hub name and a folder holding
    the same files share one fingerprint."""
    p = Path(path)
    if not p.is_dir():
        p = resolve_model(path).path
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if (
            f.is_file()
            and f.suffix in _MODEL_SUFFIXES
            and f.name not in _NOT_MODEL
            and not f.name.endswith(META_SUFFIX)
        ):
            h.update(f.name.encode() + b"\0")
            _hash_file(h, f)
    return h.hexdigest()[:16]


def file_fingerprint(path) -> str:
    """sha256 of a file's bytes (streamed), shortened to 16 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_BLOCK), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def data_fingerprint(spec) -> str:
    """A data source's fingerprint (``data.sources``): a file's bytes; a folder's files,
    all of them, by relative name and content; a hub name as itself. ``:SPLIT`` after a
    folder or name is kept."""
    spec = str(spec)
    p = Path(spec)
    if p.is_file():
        return file_fingerprint(p)
    name, split = (spec.rsplit(":", 1) + [""])[:2] if not p.exists() and ":" in spec else (spec, "")
    root = Path(name)
    if not root.is_dir():
        return f"name:{spec}"
    h = hashlib.sha256()
    for f in sorted(x for x in root.rglob("*") if x.is_file() and not x.name.endswith(".lock")):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        _hash_file(h, f)
    return h.hexdigest()[:16] + (f":{split}" if split else "")


def fingerprint(path) -> str:
    """A file's ``file_fingerprint``, a model directory's ``model_fingerprint`` (it holds
    config.json), any other folder's ``data_fingerprint``, else the name itself (a hub id, a
    served model's name; a missing path is reported where it is used)."""
    p = Path(str(path))
    if p.is_file():
        return file_fingerprint(p)
    if p.is_dir() and (p / "config.json").is_file():
        return model_fingerprint(p)
    return data_fingerprint(path)


def settings_of(cfg, exclude) -> dict:
    """A config dataclass's fields as a dict, less ``exclude`` (the cosmetic ones) and the
    fields marked ``result=False`` (``OutputOptions``': how to treat the output, not what
    makes its records). A field marked ``added=True`` (a setting newer than outputs users
    hold) is left out at its default, which is what those outputs were made with: they
    resume, and a run with another value is told apart from them."""
    return {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name not in exclude
        and f.metadata.get("result", True)
        and not (f.metadata.get("added") and getattr(cfg, f.name) == f.default)
    }


@dataclasses.dataclass
class OutputOptions:
    """The flag every command with a resumable output (``open_output``) shares."""

    adopt_output: bool = opt(
        False,
        "take records already in the output whose settings file (OUT.meta.json) is missing as this run's, and "
        "resume them (without it such an output is refused: its records may come from other settings)",
        result=False,
    )


def differences(old: dict, new: dict, old_info: dict | None = None, new_info: dict | None = None) -> list[str]:
    """One line per key whose value differs: ``--key: VALUE (where) before, VALUE now``.
    ``*_info`` may say where a value came from (a model's path beside its fingerprint)."""
    old_info, new_info = old_info or {}, new_info or {}
    lines = []
    for k in [*new, *(k for k in old if k not in new)]:
        a, b = old.get(k, "<not recorded>"), new.get(k, "<not recorded>")
        if a == b:
            continue
        wa = f" ({old_info[k]})" if k in old_info else ""
        wb = f" ({new_info[k]})" if k in new_info else ""
        lines.append(f"--{k.replace('_', '-')}: {a!r}{wa} before, {b!r}{wb} now")
    return lines


def meta_path(path) -> Path:
    return Path(str(path) + META_SUFFIX)


def _write_json(path: Path, obj) -> None:
    """Write whole or not at all: a kill mid-write leaves the old file (or none)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _lock(path: Path, flag: str):
    import fcntl

    lock = Path(str(path) + LOCK_SUFFIX)
    while True:
        fh = open(lock, "a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise BetaPRMInputError(
                f"another process is writing {path} (it holds {lock}); wait for it to finish, or give this run "
                f"another {flag}"
            ) from None
        # The holder removes the lock file when it ends: a file opened just before that is
        # no longer at this path, and holding it would let a third process lock a new one.
        try:
            st = os.stat(lock)
        except FileNotFoundError:
            st = None
        mine = os.fstat(fh.fileno())
        if st is not None and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
            return fh
        fh.close()


def _unlock(path: Path, fh) -> None:
    """Remove the lock file while still holding it (see ``_lock``), then release it."""
    with contextlib.suppress(OSError):
        os.unlink(str(path) + LOCK_SUFFIX)
    fh.close()


PART_SUFFIX = ".part"


def part_path(path, rank: int) -> Path:
    """The part file of process ``rank`` of ``path`` (``OUT.part0``, ``OUT.part1``, ...): where
    that process appends its records while several share a run (``betaprm.distributed``)."""
    return Path(f"{path}{PART_SUFFIX}{rank}")


def part_files(path) -> list[Path]:
    """The part files of ``path`` on disk, by rank (any number of them: a run resumed under
    fewer processes than the one that left them)."""
    path = Path(path)
    prefix = path.name + PART_SUFFIX
    if not path.parent.is_dir():
        return []
    found = [
        (int(p.name[len(prefix) :]), p)
        for p in path.parent.iterdir()
        if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit() and p.is_file()
    ]
    return [p for _, p in sorted(found)]


def _has_records(path: Path) -> bool:
    """Whether ``path``, or one of its part files, holds anything."""
    return any(p.is_file() and p.stat().st_size > 0 for p in [path, *part_files(path)])


def _check_settings(path: Path, settings: dict, info: dict, flag: str, adopt: bool = False) -> bool:
    """Compare ``settings`` with the sidecar's, or write it; True when this wrote a new sidecar."""
    meta = meta_path(path)
    has_records = _has_records(path)
    if has_records and meta.is_file():
        try:
            old = json.loads(meta.read_text(encoding="utf-8"))
            old_settings, old_info = old["settings"], old.get("info", {})
            if not isinstance(old_settings, dict) or not isinstance(old_info, dict):
                raise TypeError("settings and info must be objects")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            raise BetaPRMInputError(
                f"{meta}: not a betaprm settings file; delete {path} to start anew, or use another {flag}"
            ) from None
        diff = differences(old_settings, settings, old_info, info)
        if diff:
            raise BetaPRMInputError(
                f"{path} holds records made with other settings (recorded in {meta}):\n  "
                + "\n  ".join(diff)
                + f"\nresuming would mix the two in one file: rerun with the recorded settings to resume, "
                f"or write to another {flag}, or delete {path} to start anew"
            )
        return False
    if has_records:
        # Without the sidecar nothing says which model or settings made these records:
        # resuming would label them all as this run's. Only the user can vouch for that.
        if not adopt:
            raise BetaPRMInputError(
                f"{flag} {path}: holds records but no {meta.name} beside it says which settings made them (moved "
                f"or deleted?); fix: put {meta.name} back, or pass --adopt-output to take the records as this "
                f"run's, or give another {flag}"
            )
        logger.warning(
            f"{path}: no {meta.name} records the settings of the existing records; adopting them as this run's"
        )
    # No records yet (or adopted ones): these settings are the file's from now on.
    created = not meta.exists()
    _write_json(meta, {"settings": settings, "info": {**info, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}})
    return created


@contextlib.contextmanager
def open_output(path, settings: dict, info: dict | None = None, flag: str = "--out", adopt: bool = False):
    """Hold ``path``'s lock and make sure its records are ``settings``' for the duration of
    the ``with`` block: a second writer, existing records of other settings, or existing
    records without a sidecar (unless ``adopt``: ``--adopt-output``) raise
    ``BetaPRMInputError`` (``flag`` names the option in the messages). ``info``: what is
    recorded but not compared (paths, the version). The lock file is removed at the end;
    a failed run that wrote no record also removes the sidecar (and empty output) it made."""

    path = Path(path)
    if path.is_dir():
        raise BetaPRMInputError(f"{flag} {path}: is a folder; give the path of the output file (JSONL) inside it")
    settings = json.loads(json.dumps(settings))  # as the sidecar holds them (tuples -> lists)
    info = {**(info or {}), "betaprm": version()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = _lock(path, flag)
    except OSError as e:
        raise BetaPRMInputError(
            f"{flag} {path}: cannot be written ({e.strerror}); check the folder and its permissions"
        ) from None
    existed, created_meta = path.exists(), False
    try:
        try:
            created_meta = _check_settings(path, settings, info, flag, adopt)
        except OSError as e:
            raise BetaPRMInputError(
                f"{flag} {path}: cannot be written ({e.strerror}); check the folder and its permissions"
            ) from None
        yield path
    except BaseException:
        # A run that failed before its first record leaves the folder as it found it, so
        # the next run (perhaps with other settings) does not meet a sidecar of nothing.
        with contextlib.suppress(OSError):
            if created_meta and not _has_records(path):
                meta_path(path).unlink(missing_ok=True)
                if not existed and path.is_file():
                    path.unlink()
        raise
    finally:
        _unlock(path, fh)


# ---------------------------------------------------------------------- output paths
def rejects_path(output) -> str:
    """The default rejects file of ``output``: its whole name plus ``.rejects.jsonl``, so
    ``results.seed1`` and ``results.seed2`` get their own, and ``keep.rejects`` never
    names an unrelated ``keep.rejects.jsonl``."""
    return f"{output}.rejects.jsonl"


def resolved(p: Path) -> Path:
    """``p`` resolved (links and ``..`` followed); a link loop as the absolute path itself."""
    try:
        return p.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return p.absolute()


def same_path(a, b) -> bool:
    """Whether ``a`` and ``b`` name one file: ``os.path.samefile`` when both exist (hard
    links, symlinks), else their resolved paths."""
    a, b = Path(str(a)), Path(str(b))
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return resolved(a) == resolved(b)


def _probe(folder: Path) -> str | None:
    """Why no file can be made in the existing ``folder``, or None: a file is created and
    removed there. Permission bits (``os.access``) say yes to root on a read-only mount or
    in ``/proc``, where only an attempt tells."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".betaprm-probe-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return None


def _write_problem(flag: str, path, folder: bool) -> str | None:
    """Why ``path`` (a file, or a ``folder`` to write files into) cannot be written, or None.
    Decided by trying: an existing file is opened for appending (nothing is written), an
    existing folder gets a file made and removed in it."""
    p = Path(str(path))
    if folder and p.exists() and not p.is_dir():
        return f"{flag} {path}: is a file; give a folder to write into (it is created when missing)"
    if not folder and p.is_dir():
        return f"{flag} {path}: is a folder; give the path of the output file inside it"
    if p.is_file() and not folder:
        try:
            with open(p, "ab"):
                pass
        except OSError as e:
            return f"{flag} {path}: cannot be written ({e.strerror}); fix: give a path you can write"
        # The file itself is writable, but a run also makes files beside it (sidecar, lock, rejects).
    # The nearest existing folder (the folder itself, or the one above the output) decides
    # whether files and missing folders can be made.
    up = resolved(p) if folder and p.is_dir() else resolved(p).parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        return (
            f"{flag} {path}: cannot be written ({up} is a file, so no folder can be made in it); fix: give another "
            "path"
        )
    reason = _probe(up)
    if reason:
        return (
            f"{flag} {path}: cannot be written (no file can be made in {up}: {reason}); fix: give a path you can write"
        )
    return None


def config_file_of(cfg) -> tuple[str, str | None]:
    """``("--config", FILE)``: the config file a command's options came from (None: none),
    an input of the command like its data (``cli.flags.config_from_args`` records it)."""
    return ("--config", getattr(cfg, "config_file", None))


def _in_folder(path, folder) -> bool:
    """Whether ``path`` is a file that exists inside the existing folder ``folder``, or
    would be made there: writing it writes into that folder."""
    f = Path(str(folder))
    if not f.is_dir():
        return False
    p, r = resolved(Path(str(path))), resolved(f)
    return p != r and p.is_relative_to(r)


def check_paths(inputs=(), outputs=(), folders=()) -> None:
    """Refuse, before any work starts, an output that would clobber an input or another
    output, or that cannot be written. ``inputs``, ``outputs`` (files) and ``folders``
    (written into: plots) are ``(flag, path)`` pairs; None paths are left out. An output
    is compared by ``same_path`` with every input and every other output (a plot file's
    flag is written ``--plots (NAME)``); an output that is an existing file inside an input
    folder (a model's ``config.json``) is refused unless it is a betaprm output (with its
    sidecar), which a rerun resumes."""
    inputs = [(f, p) for f, p in inputs if p]
    outputs = [(f, p) for f, p in outputs if p]
    folders = [(f, p) for f, p in folders if p]
    for i, (flag, path) in enumerate(outputs):
        for iflag, ipath in inputs:
            if Path(str(path)).is_file() and not meta_path(path).is_file() and _in_folder(path, ipath):
                raise BetaPRMInputError(
                    f"{flag} {path}: is a file of the input {iflag} {ipath}; writing it would change the input; fix: "
                    f"give {flag.split(' ')[0]} a path outside {ipath}"
                )
            if same_path(path, ipath):
                raise BetaPRMInputError(
                    f"{flag} {path}: is the input {iflag} {ipath}; writing it would destroy the input; fix: give "
                    f"{flag.split(' ')[0]} another path"
                )
        for oflag, opath in outputs[:i]:
            if same_path(path, opath):
                raise BetaPRMInputError(
                    f"{flag} {path}: is also {oflag} {opath}; one would overwrite the other; fix: give "
                    f"{flag.split(' ')[0]} another path"
                )
    for flag, path in folders:
        for iflag, ipath in inputs:
            if same_path(path, ipath) and not Path(str(path)).is_dir():
                raise BetaPRMInputError(
                    f"{flag} {path}: is the input {iflag} {ipath}; fix: give {flag} a folder for the plots"
                )
    # Folders first: a plots folder that is a file is named as such, not through its plots.
    for flag, path, folder in [*((f, p, True) for f, p in folders), *((f, p, False) for f, p in outputs)]:
        problem = _write_problem(flag.split(" ")[0], path, folder)
        if problem:
            raise BetaPRMInputError(problem)


def write_result(path, result: dict, settings: dict, info: dict | None = None) -> None:
    """A JSON result (an evaluation) with a ``provenance`` key: ``settings`` and ``info``
    in the sidecar's layout. NaN there means "undefined" (an accuracy over no problems)
    and is written as null, so the file stays strict JSON."""

    obj = finite_or_null(
        {**result, "provenance": {"settings": settings, "info": {**(info or {}), "betaprm": version()}}}
    )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def write_records(path, records, settings: dict, info: dict | None = None) -> None:
    """Records of one finished run as a whole JSONL file (one per line; NaN written as
    null, as in ``write_result``), with the settings that made them in its sidecar
    ``OUT.meta.json``, as a resumable output has them. Written anew, never appended: a
    rerun replaces both (each file whole or not at all)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(finite_or_null(r), allow_nan=False, ensure_ascii=False) + "\n")
    settings = json.loads(json.dumps(settings))
    info = {**(info or {}), "betaprm": version(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_json(meta_path(path), {"settings": settings, "info": info})
    os.replace(tmp, path)


# ---------------------------------------------------------------------- strict JSON
def _non_finite(obj, where: str = ""):
    """The first non-finite float in ``obj``: ``(path, value)``, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(the value)", obj
    if isinstance(obj, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for w, v in items:
        found = _non_finite(v, w)
        if found:
            return found
    return None


def json_line(record: dict, **kw) -> str:
    """``record`` as one line of strict JSON. A NaN or infinity (which would make the
    line unreadable to strict JSON readers) raises, naming the record's id and the
    field, so nothing of that record is written."""
    try:
        return json.dumps(record, allow_nan=False, **kw) + "\n"
    except ValueError:
        where, value = _non_finite(record) or ("?", "?")
        raise BetaPRMInputError(
            f"record {record.get('id')!r}: field {where} is {value}; the model (or the data) gave a non-finite "
            "value, so the record is not written (check the checkpoint, e.g. a training run whose loss diverged)"
        ) from None


def finite_or_null(obj):
    """``obj`` with every non-finite float replaced by None (JSON null): for results in
    which NaN means "undefined" (an accuracy over no problems), so they stay strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def records_in_order(ids, fresh: dict, out=None) -> list[dict]:
    """One record per id, in ``ids``' order: from ``fresh`` (this run's), else read back
    from ``out`` (an earlier run's, when this one resumed)."""
    if out is None:
        return [fresh[i] for i in ids]
    old = {}
    with open(out, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                old[str(r["id"])] = r
    return [fresh.get(i) or old[i] for i in ids]


class TaskRecords:
    """One record per task, appended to ``out`` (JSONL) as each task finishes, with a
    progress bar; tasks already in ``out`` are skipped (``todo``) and read back at the end
    (``records``), so an interrupted run continues with nothing duplicated.

    ``with TaskRecords(out, ids, "ACA") as rec: ... rec.write(task_id, record)``."""

    def __init__(self, out, ids, what: str, progress: bool = True, desc: str | None = None):
        if len(set(ids)) != len(ids):
            raise BetaPRMInputError(f"{what} tasks need unique ids")
        self.out, self.ids, self.what, self.desc, self.progress = out, list(ids), what, desc or what, progress
        self.done = completed_ids(out) if out else set()
        self.fresh: dict[str, dict] = {}
        self._file = self._bar = None

    def todo(self, tasks) -> list:
        """The tasks (with an ``id``) not in ``out`` yet."""
        return [t for t in tasks if t.id not in self.done]

    def __enter__(self):
        self._file = open(self.out, "a", encoding="utf-8") if self.out else None
        left = len(self.ids) - len(self.done & set(self.ids))
        if self.progress and left:
            self._bar = progress_bar(left, self.desc, "problem")
        return self

    def write(self, task_id: str, record: dict) -> None:
        """``record`` of a finished task: kept, and written (a NaN raises before it is)."""
        self.fresh[task_id] = record
        if self._file:
            self._append(json_line(record))
        if self._bar:
            self._bar.update(1)

    def _append(self, line: str) -> None:
        self._file.write(line)
        self._file.flush()

    def __exit__(self, *exc):
        for handle in (self._file, self._bar):
            if handle:
                handle.close()

    def records(self) -> list[dict]:
        """Every task's record, in ``ids``' order (earlier runs' read back from ``out``)."""
        return records_in_order(self.ids, self.fresh, self.out if self.done else None)


def completed_ids(path) -> set[str]:
    """Ids already in an output file. A last line without its newline is the remains of
    an interrupted write: it is cut off (and said so), every complete line is kept."""
    ids: set[str] = set()
    if not os.path.exists(path):
        return ids
    with open(path, "rb") as f:
        data = f.read()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        logger.warning(f"{path}: removing a partial last line ({len(data) - keep} bytes) left by an interrupted run")
        with open(path, "r+b") as f:
            f.truncate(keep)
    for i, line in enumerate(data[:keep].splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise BetaPRMInputError(
                f"{path}:{i}: existing output line is not a scored record; move the file away or fix it"
            ) from None
    return ids
