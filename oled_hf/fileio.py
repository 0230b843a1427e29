"""Files the project writes: refused if they exist (unless asked), written whole or not at all.

Every writer goes through :func:`write_atomically`: the content goes to a temporary file in the
target's own folder (same file system, so the rename is atomic), then replaces the target in one
``os.replace``. A reader never sees half a file, a failure (full disk, ``ulimit -f``, a read-only
folder) leaves nothing behind, and a symlink at the target is replaced by the new file, never
written through. :func:`check_new_file` is the check before any work: a command refuses a path it
could not write before spending minutes on what it would write there.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def check_new_file(path: str | os.PathLike, *, overwrite: bool, field: str = "path",
                   flag: str = "overwrite=True") -> Path:
    """The file ``path`` names, or ValueError saying why it cannot be written as asked.

    Nothing is created or written: a missing folder is the user's typo far more often than a wish
    for a new directory tree, and a file (or link) already there is the user's until they pass ``flag``.
    """
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{field}={str(path)!r} is a folder; give the path of a file to write")
    parent = target.parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise ValueError(f"{field}={str(path)!r}: its folder {str(parent)!r} {what}; create it first "
                         "(no folders are created)")
    if (target.exists() or target.is_symlink()) and not overwrite:
        raise ValueError(f"{field}={str(path)!r} already exists; pass {flag} to replace it, or choose a new path")
    return target


def write_atomically(save: Callable[[str], object], target: str | os.PathLike) -> None:
    """``save(tmp)`` beside ``target``, then rename over it: a reader never sees half a file."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the file unreadable to others, unlike a plain write
        save(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
