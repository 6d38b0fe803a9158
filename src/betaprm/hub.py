"""Where a model comes from: a local folder, or a Hugging Face hub name resolved to a
local snapshot through ``huggingface_hub`` (its cache; offline when ``HF_HUB_OFFLINE``
is set), so that every command and ``BetaPRM.from_pretrained`` read the same files
whichever way the model was named.

A hub name is ``NAME`` or ``OWNER/NAME``, optionally ``@REVISION`` (a branch, tag or
commit). A name that looks like a path (``looks_local``) and is not a folder is an error,
never a hub request. A revision must be a git ref name or a commit hash (``check_revision``)
and the snapshot folder it names must lie inside the cache: the cache reads a branch's commit
from ``refs/REVISION``, so ``@../../x`` would otherwise open a folder named in any file. A
name is resolved once per process, so every part of a command reads one snapshot.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BetaPRMInputError

__all__ = ["ModelSource", "resolve_model"]

_REPO_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# What `git check-ref-format` refuses in a branch or tag name: control characters, space and
# ~^:?*[\ anywhere; "..", "@{" or "//"; a leading "/" or "-"; a trailing "/" or "."; a part
# that starts with "." or ends with ".lock".
_BAD_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^[/-]|[/.]$|(?:^|/)\.|\.lock(?:/|$)")
# What a model needs, top-level files only (huggingface_hub's patterns match across "/", so
# subfolders are ignored explicitly): other formats and copies (GGUF, ONNX, Flax, TF,
# original/, Mistral's consolidated.safetensors beside the sharded weights) stay on the hub.
_TOKENIZER_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja"]
_MODEL_FILES = [*_TOKENIZER_FILES, "*.safetensors", "*.py", "README.md"]
_NOT_MODEL_FILES = ["*/*", "consolidated*", "training_args*", "optimizer*"]
# Resolved names, per process: every part of one command reads the same snapshot even when
# the hub's branch moves meanwhile, and the hub is asked once.
_RESOLVED: dict[tuple[str, str | None, str], Path] = {}


@dataclass(frozen=True)
class ModelSource:
    """A model resolved to files on disk: ``path`` (the folder read), ``name`` (what the
    user gave, without the revision), ``revision`` (the commit of a hub snapshot; None for
    a local folder)."""

    path: Path
    name: str
    revision: str | None = None

    @property
    def is_hub(self) -> bool:
        return self.revision is not None


def split_revision(spec: str) -> tuple[str, str | None]:
    """``OWNER/NAME@REV`` -> ``("OWNER/NAME", "REV")``; anything else unchanged with None."""
    name, sep, rev = spec.rpartition("@")
    if sep and name and rev and _REPO_ID.fullmatch(name):
        return name, rev
    return spec, None


def check_revision(revision: str, where: str) -> None:
    """Stop unless ``revision`` is a 40-hex commit hash or a name git accepts for a branch or
    tag (``refs/pr/1`` included); ``where`` starts the message."""
    if _COMMIT.fullmatch(revision) or (revision != "@" and not _BAD_REF.search(revision)):
        return
    raise BetaPRMInputError(
        f"{where}: {revision[:100]!r} is not a revision; give a branch or tag name (git's rules: no '..', '@{{', "
        "'//', spaces, control characters or any of ~^:?*[\\, no leading '/' or '-', no part starting with '.' or "
        "ending with '.lock') or a 40-character commit hash"
    )


def repo_id_problem(repo_id: str, flag: str = "--push-to-hub") -> str | None:
    """Why the hub would refuse ``repo_id`` as a repository to create, by huggingface_hub's own
    rules (letters, digits, ``-``, ``_``, ``.``; no ``--`` or ``..``; ...), or None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id  # see _snapshot

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        reason = str(e).split(":")[0]  # without the name it repeats
        return f"{flag} must be NAME or OWNER/NAME as the hub allows them, got {repo_id[:120]!r}: {reason}"
    return None


def is_hub_name(spec: str) -> bool:
    """Whether ``spec`` (revision already split off) could be a hub repository id."""
    return bool(_REPO_ID.fullmatch(spec)) and not spec.startswith(".") and ".." not in spec


def looks_local(text: str) -> bool:
    """Whether a name that is not on disk is meant as a local path: absolute, ``./``, ``~``,
    a backslash, more than one ``/``, or a first folder that exists here (``runs/bprm`` with
    ``runs/`` present). Such a name is never sent to the hub."""
    first = text.split("/", 1)[0]
    return (
        text.startswith(("/", "~", "."))
        or "\\" in text
        or text.count("/") > 1
        or ("/" in text and Path(first).is_dir())
    )


def resolve_model(spec, revision: str | None = None, flag: str = "--model", files: str = "model") -> ModelSource:
    """A local folder as it is, or a hub name's snapshot folder (downloaded into the hub
    cache when online; the cache alone when ``HF_HUB_OFFLINE`` is set). ``files``:
    ``model`` (weights, configs, tokenizer, card) or ``tokenizer`` (no weights). Raises
    ``BetaPRMInputError`` naming ``flag`` and the fix when neither can be had."""
    if isinstance(spec, ModelSource):
        return spec
    # "~/w/ckpt" (quoted, so the shell left it) is the home folder's, and so named everywhere
    # (model card, messages); no hub name starts with "~".
    text = os.path.expanduser(os.fspath(spec))
    if Path(text).expanduser().is_dir():
        if revision is not None:
            raise BetaPRMInputError(f"{flag} {text}: a revision applies to hub names only; {text} is a local folder")
        return ModelSource(Path(text).expanduser(), text)
    name, rev_in_name = split_revision(text)
    if rev_in_name is not None and revision is not None and rev_in_name != revision:
        raise BetaPRMInputError(f"{flag} {text}: two revisions given ({rev_in_name!r} and {revision!r}); give one")
    revision = revision or rev_in_name
    if revision is not None:
        check_revision(revision, f"{flag} {text}")
    if Path(text).expanduser().exists():
        raise BetaPRMInputError(f"{flag} {text}: a file, not a model folder; give the folder that holds config.json")
    if not is_hub_name(name) or looks_local(name):
        raise BetaPRMInputError(
            f"{flag} {text}: no such folder (and not a hub name, which is NAME or OWNER/NAME[@REVISION]); check the "
            "path"
        )
    key = (name, revision, files)
    if key not in _RESOLVED:
        _RESOLVED[key] = _snapshot(name, revision, flag, files)
    path = _RESOLVED[key]
    # The cache names each snapshot folder by its commit (snapshots/<commit>/).
    return ModelSource(path, name, path.name)


def unreadable_model(source: ModelSource, error: BaseException, flag: str = "") -> BetaPRMInputError:
    """The error for a model whose files transformers or safetensors could not read (no
    weights, a truncated file, a partial hub snapshot), naming the folder and the fix;
    ``flag`` (``--policy``, ...) starts the message when given."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    start = f"{flag} " if flag else ""
    if source.is_hub:
        return BetaPRMInputError(
            f"{start}{source.name}: the hub snapshot {source.path} is incomplete or damaged ({reason}); download it "
            f"again online (`hf download {source.name} --revision {source.revision} --force-download`)"
        )
    return BetaPRMInputError(
        f"{start}{source.path}: cannot load the model ({reason}); the folder needs config.json, the weights "
        "(*.safetensors) and the tokenizer files, undamaged: save or copy the model there again"
    )


def _offline() -> bool:
    from huggingface_hub import constants  # see _snapshot

    return bool(constants.HF_HUB_OFFLINE)


def _snapshot(name: str, revision: str | None, flag: str, files: str) -> Path:
    """The snapshot folder of ``name`` at ``revision``: top-level model (or tokenizer)
    files, safetensors weights preferred (``pytorch_model*.bin`` fetched only when a model
    has no safetensors)."""
    # huggingface_hub takes a sixth of a second to import: loaded when a hub name is resolved,
    # not when the CLI starts (every path and --help works without it).
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{flag} {name}" + (f"@{revision}" if revision else "")
    patterns = _MODEL_FILES if files == "model" else _TOKENIZER_FILES

    def get(allow):
        return Path(snapshot_download(name, revision=revision, allow_patterns=allow, ignore_patterns=_NOT_MODEL_FILES))

    try:
        path = get(patterns)
        if files == "model" and not any(path.glob("*.safetensors")):
            path = get([*patterns, "pytorch_model*.bin"])
    except LocalEntryNotFoundError:
        if _offline():
            raise BetaPRMInputError(
                f"{where}: no such local folder, and not in the Hugging Face cache while HF_HUB_OFFLINE is set; "
                "download it once online (or unset HF_HUB_OFFLINE), or give the model's folder"
            ) from None
        raise BetaPRMInputError(
            f"{where}: no such local folder, and the hub could not be reached to download it; check the network, or "
            "give the model's folder"
        ) from None
    except RevisionNotFoundError:
        raise BetaPRMInputError(f"{where}: the hub repository has no revision {revision!r}") from None
    except GatedRepoError:
        raise BetaPRMInputError(
            f"{where}: a gated repository; accept its terms on the hub and log in (`hf auth login` or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise BetaPRMInputError(
            f"{where}: no such folder, and no such model on the hub (or it is private: log in with `hf auth login` "
            "or HF_TOKEN)"
        ) from None
    except HfHubHTTPError as e:
        raise BetaPRMInputError(f"{where}: the hub refused the download ({str(e).splitlines()[0][:200]})") from None
    # The snapshot and its files (links to the cache's blobs) must lie inside the cache: a
    # refs/ file that names a path would otherwise open a folder anywhere.
    cache = Path(constants.HF_HUB_CACHE).expanduser().resolve()
    files = path.iterdir() if path.is_dir() else ()
    outside = [p for p in (path, *files) if not p.resolve().is_relative_to(cache)]
    if outside:
        raise BetaPRMInputError(
            f"{where}: the hub cache's snapshot {path} leads outside the cache {cache} (to {outside[0].resolve()}); "
            f"remove that entry from the cache (`hf cache rm model/{name}`) and download the model again"
        )
    return path
