"""Hugging Face hub ids (``inclusionAI/LLaDA2.0-mini``, ``ORG/NAME@REVISION``) as checkpoint folders.

Every ``--model`` of the CLI and ``prepare SRC`` take either a folder or a hub id; an id becomes
the folder ``huggingface_hub.snapshot_download`` returns, the snapshot in the local HF cache
(``models--ORG--NAME/snapshots/COMMIT``, files symlinked into ``blobs/``). We do not resolve ids
ourselves: ``snapshot_download`` already knows the cache layout, ``refs/``, ``HF_HUB_CACHE`` /
``HF_HOME``, ``HF_HUB_OFFLINE`` and ``local_files_only``, and works offline from the cache. What
it cannot do is say, in one line, that a name is neither a folder nor a cached id: that is here.

A local path always wins over an id of the same spelling, so ``org/name`` in the working folder
is that folder, as it is for ``from_pretrained``.
"""

from __future__ import annotations

import os
from pathlib import Path

# What a checkpoint needs (config, weights, index, code, tokenizer, chat template); a hub repo may
# also hold duplicate weights in other formats (``*.bin``, ``*.pth``, GGUF) that are never read.
NEEDED_FILES = ["*.json", "*.safetensors", "*.py", "*.jinja", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
EXAMPLE_ID = "inclusionAI/LLaDA2.0-mini"


def split_revision(name: str) -> tuple[str, str | None]:
    """``ORG/NAME@REVISION`` -> (``ORG/NAME``, ``REVISION``); hub ids cannot contain ``@``."""
    repo, at, revision = name.rpartition("@")
    return (repo, revision) if at and repo and revision else (name, None)


def is_hub_id(name: str) -> bool:
    """Whether ``name`` is spelled as a hub model id ``ORG/NAME`` (optionally ``@REVISION``).

    Only namespaced ids: a bare word is far more often a mistyped folder than one of the few
    legacy hub ids without an organisation, and none of those is a LLaDA2 checkpoint.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo, _ = split_revision(str(name))
    if repo.count("/") != 1:
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE``): only the local cache may answer."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def hub_cache() -> str:
    """The cache folder ``snapshot_download`` reads (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def snapshot_folder(name: str, what: str, *, local_files_only: bool = False) -> Path:
    """The snapshot folder of hub id ``name``, or a ValueError naming ``what`` (``--model``), the
    name, the cache searched and why nothing was found.

    Online (and not ``local_files_only``) a missing snapshot is downloaded (only ``NEEDED_FILES``),
    as ``from_pretrained`` would; offline, only the local cache answers.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    repo, revision = split_revision(name)
    offline = local_files_only or hub_offline()
    try:
        folder = snapshot_download(repo, revision=revision, allow_patterns=NEEDED_FILES,
                                   local_files_only=local_files_only)
    except RevisionNotFoundError:
        raise ValueError(f"{what} {name}: no such folder, and the Hugging Face hub model {repo} has no revision "
                         f"{revision}") from None
    except GatedRepoError:
        raise ValueError(f"{what} {name}: no such folder, and the Hugging Face hub model {repo} is gated: accept "
                         "its terms on the hub and log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{what} {name}: no such folder, and the Hugging Face hub has no model {repo} (or it is "
                         "private: log in with `hf auth login`)") from None
    except OSError as err:  # not in the cache (offline), or the hub could not be reached
        at = f" at revision {revision}" if revision else ""
        if offline:
            off = "local_files_only=True" if local_files_only else "the hub is off: HF_HUB_OFFLINE=1"
            raise ValueError(f"{what} {name}: no such folder, and no cached Hugging Face hub model {repo}{at} in "
                             f"{hub_cache()} ({off}; download it online first or give a checkpoint "
                             "folder)") from None
        raise ValueError(f"{what} {name}: no such folder, and the Hugging Face hub model {repo}{at} is neither "
                         f"in {hub_cache()} nor reachable: {' '.join(str(err).split())}") from None
    return Path(folder)


def resolve_checkpoint(name: str | os.PathLike, what: str, *, local_files_only: bool = False) -> Path:
    """``name`` as a folder: itself when that path exists (a folder wins over an id of the same
    spelling), else the snapshot of the hub id it spells. A name that is neither a path nor an id
    is returned as a Path too, for the caller's "no such folder" message."""
    path = expand_user(name, what)
    if path.exists() or not isinstance(name, str) or not is_hub_id(name):
        return path
    return snapshot_folder(name, what, local_files_only=local_files_only)


def expand_user(name: str | os.PathLike, what: str) -> Path:
    """``name`` with a leading ``~`` or ``~user`` expanded, or a ValueError naming ``what`` and the name.

    ``Path.expanduser`` raises ``RuntimeError`` ("Could not determine home directory") for a user
    that does not exist (``~nonexistentuser/x``) or where ``$HOME`` is unset, which the CLI would
    print as a traceback; it is a mistyped path like any other.
    """
    try:
        return Path(name).expanduser()
    except RuntimeError:
        head = str(name).split("/", 1)[0]
        why = "its home folder is unknown ($HOME is unset)" if head == "~" else f"there is no user {head[1:]!r}"
        raise ValueError(f"{what} {name}: no such folder ({head} cannot be expanded: {why} on this machine)") from None


def hub_id_of(folder: str | os.PathLike) -> str | None:
    """``ORG/NAME`` when ``folder`` is a snapshot in a HF cache (``models--ORG--NAME/snapshots/COMMIT``).

    Why: a snapshot folder is named by its commit hash, which says nothing to a client or reader.
    """
    path = Path(folder)
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    parts = repo[len("models--"):].split("--")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None
