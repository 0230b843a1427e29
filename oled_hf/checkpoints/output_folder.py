"""Where a checkpoint-writing command may write: a new or empty folder, or any folder with ``overwrite``.

``save_pretrained`` deletes every ``model-*.safetensors`` of the folder that its new index does not
name, and writes through symlinks: ``make-tiny`` into a checkpoint folder used to delete its shards,
and into a ``prepare``d folder it would have rewritten the official shards its links point to.
These checks run before anything is written, so a refused command leaves the folder as it was; the
writers then build in a temporary sibling folder (:func:`oled_hf.fileio.write_folder_atomically`),
so a failed one leaves it as it was too.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..fileio import check_writable_folder
from .hub import expand_user

# Names the project's writers create (save_pretrained, the tokenizer, the model code); only these are
# detached before an overwrite, so unrelated links in the folder are left alone.
CHECKPOINT_PATTERNS = ("*.safetensors", "*.json", "*.py", "*.jinja", "*.model", "tokenizer*", "vocab*",
                       "merges.txt")
LISTED = 3  # how many of a folder's names an error shows
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # save_pretrained's shard names


def listing(folder: Path) -> str:
    """A few of ``folder``'s names for an error message: ``config.json, model.safetensors and 4 more``.

    A checkpoint's config and weights come first: they say at a glance what would be lost.
    """
    names = sorted((p.name for p in folder.iterdir()), key=_weight_first)
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def _weight_first(name: str) -> tuple[int, str]:
    return (0 if name == "config.json" else 1 if ".safetensors" in name else 2), name


def check_output_folder(out: str | os.PathLike, *, overwrite: bool, argument: str = "OUT") -> Path:
    """``out`` as a Path once it is safe to write there; a ValueError naming it otherwise.

    Safe means: missing, an empty folder, or (``overwrite=True``) a folder whatever it holds. A file
    is never a folder to write into. Nothing is created here, so callers validate everything else
    first and only then ``mkdir``.
    """
    path = expand_user(out, argument)  # ~nouser/x: one line naming OUT, not a RuntimeError traceback
    if path.exists() and not path.is_dir():
        raise ValueError(f"{argument} {out} is a file, not a folder: give a new or empty folder")
    if path.is_dir() and not overwrite and any(path.iterdir()):
        raise ValueError(f"{argument} {out} already holds files ({listing(path)}); writing a checkpoint there "
                         f"would replace or delete them: give a new or empty folder, or pass --overwrite "
                         f"(overwrite=True) to replace them")
    check_writable_folder(nearest_folder(path.parent), field=argument, path=out)  # before the free-disk check:
    return path  # a read-only mount reports 0 bytes free, and "needs 0.0 GiB, 0.0 GiB free" said nothing useful


def nearest_folder(path: Path) -> Path:
    """``path`` or its closest existing ancestor: where the writer's temporary folder (and any missing parents)
    will be created."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def is_linked(path: Path) -> bool:
    """Whether removing ``path`` loses no data: a symlink, or a file with another hard link."""
    if path.is_symlink():
        return True
    return path.is_file() and path.stat().st_nlink > 1


def detach_links(folder: Path, patterns: tuple[str, ...] = CHECKPOINT_PATTERNS) -> list[str]:
    """Unlink the symlinks and hard links among ``folder``'s checkpoint files; return their names.

    Writers open a file by name, so a symlink or hard link would have them rewrite the file it
    shares, which may belong to another checkpoint (``prepare`` links official shards). Removing a
    link removes a name only: the data stays under its other name.
    """
    detached = []
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            if path.name not in detached and is_linked(path):
                path.unlink()
                detached.append(path.name)
    return detached


def remove_stale_shards(folder: Path, keep: Iterable[str]) -> list[str]:
    """Delete ``folder``'s weight shards (``model-XXXXX-of-XXXXX.safetensors``) not in ``keep``; return their names.

    A checkpoint rewritten with ``overwrite`` gets a new index; an old shard it does not name would
    be dead weight that looks like part of the checkpoint. ``save_pretrained`` deletes the same names
    when it writes into a folder; writing into a temporary folder first, the project does it here.
    Only plain files: a link there was detached before.
    """
    keep = set(keep)
    removed = []
    for path in sorted(folder.iterdir()):
        if SHARD_NAME.fullmatch(path.name) and path.name not in keep and path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path.name)
    return removed


OS_ERROR = re.compile(r"os error (\d+)")  # how safetensors' Rust writer reports the OS error


@contextlib.contextmanager
def safetensors_os_errors() -> Iterator[None]:
    """A safetensors write that failed on the OS (full disk, ``ulimit -f``) raised as that OSError.

    safetensors says ``Error while serializing: I/O error: File too large (os error 27)``; as an
    OSError it reaches :func:`oled_hf.fileio.write_folder_atomically`, which names the folder.
    """
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as err:
        found = OS_ERROR.search(str(err))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code)) from err
