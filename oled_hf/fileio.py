"""Files the project writes: refused if they exist (unless asked), written whole or not at all.

Every writer goes through :func:`write_atomically` (or :func:`write_bytes_atomically`): the content
goes to a temporary file in the target's own folder (same file system, so the rename is atomic),
is flushed to disk, then replaces the target in one ``os.replace``. A reader never sees half a
file, a failure (full disk, ``ulimit -f``, a read-only folder) leaves nothing behind and is one
OSError naming the target and the OS error, and a symlink at the target is replaced by the new
file, never written through.

A folder of files (a checkpoint) goes through :func:`write_folder_atomically`: it is built in a
temporary sibling folder and renamed into place, so a failure half-way leaves no file of it.

:func:`check_new_file` is the check before any work: a command refuses a path it could not write
(an existing file without the overwrite flag, a missing or read-only folder) before spending
minutes on what it would write there.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

logger = logging.getLogger(__name__)


def check_new_file(path: str | os.PathLike, *, overwrite: bool, field: str = "path",
                   flag: str = "overwrite=True") -> Path:
    """The file ``path`` names, or ValueError saying why it cannot be written as asked.

    Nothing is created or left behind: a missing folder is the user's typo far more often than a
    wish for a new directory tree, a file (or link) already there is the user's until they pass
    ``flag``, and a folder that refuses a new file (read-only, full) is found now, by creating and
    removing a probe file, not after the work (:func:`check_writable_folder`).
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
    check_writable_folder(parent, field=field, path=path)
    return target


def check_new_files(folder: str | os.PathLike, names: Iterable[str], *, overwrite: bool, field: str = "folder",
                    flag: str = "overwrite=True", create: bool = False) -> Path:
    """``folder`` once the files ``names`` can be written into it as asked, else ValueError naming why.

    The check a command that writes a few named files into a folder (a report folder, a data folder)
    makes before any work: ``folder`` must be a folder (or, with ``create``, a missing one whose
    parent exists: the one folder the user named is made, never a tree of them from a typo), none of
    ``names`` may exist there without ``flag``, and the folder (or the parent it will be made in) must
    accept a new file. Nothing is created here.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{field}={str(folder)!r} is a file, not a folder; give a folder to write into")
    if not folder.is_dir():
        parent = folder.parent
        if not create or not parent.is_dir():
            where = f"its folder {str(parent)!r} does not exist" if create else "does not exist"
            raise ValueError(f"{field}={str(folder)!r}: {where}; create it first (no folders are created"
                             f"{' but the one named' if create else ''})")
        check_writable_folder(parent, field=field, path=folder)
        return folder
    for name in names:
        target = folder / name
        if target.is_dir():
            raise ValueError(f"{field}={str(folder)!r} has a folder {name} where a file is written; move it first")
        if (target.exists() or target.is_symlink()) and not overwrite:
            raise ValueError(f"{field}={str(folder)!r} already holds {name}; pass {flag} to replace it, "
                             "or choose a new folder")
    check_writable_folder(folder, field=field)
    return folder


def check_writable_folder(folder: str | os.PathLike, *, field: str = "path",
                          path: str | os.PathLike | None = None) -> Path:
    """``folder`` if a file can be created in it now, else ValueError naming it and the OS error.

    Asks the file system, not the permission bits: root ignores the bits, while a read-only mount,
    an immutable folder or a full disk refuse root too. The probe is an empty temporary file,
    removed at once.
    """
    folder = Path(folder)
    try:
        fd, probe = tempfile.mkstemp(prefix=".oled-write-probe.", dir=folder)
    except OSError as err:
        where = f"{field}={str(path)!r}: its folder {str(folder)!r}" if path is not None else \
            f"{field}={str(folder)!r}"
        raise ValueError(f"{where} is not writable ({err.strerror or err}); choose another folder") from None
    os.close(fd)
    os.unlink(probe)
    return folder


def _write_error(target: Path, err: OSError) -> OSError:
    """One OSError naming the target (not the temporary file) and what the OS said."""
    return OSError(err.errno, f"could not write {target}: {err.strerror or err}; nothing was written there")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(save: Callable[[str], object], target: str | os.PathLike) -> None:
    """``save(tmp)`` beside ``target``, then rename over it: a reader never sees half a file.

    An OSError (full disk, ``ulimit -f``, read-only folder) removes the temporary file and is
    raised again as one OSError naming ``target``; any other error removes it too and propagates.
    """
    target = Path(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise _write_error(target, err) from err
    os.close(fd)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the file unreadable to others, unlike a plain write
        save(tmp)
        _fsync(tmp)  # the data is on disk before the name points at it
        os.replace(tmp, target)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _write_error(target, err) from err
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomically(data: bytes, target: str | os.PathLike) -> None:
    """``data`` as the whole content of ``target`` (:func:`write_atomically`)."""

    def save(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    write_atomically(save, target)


def write_text_atomically(text: str, target: str | os.PathLike) -> None:
    """``text`` (UTF-8) as the whole content of ``target`` (:func:`write_atomically`)."""
    write_bytes_atomically(text.encode("utf-8"), target)


def write_folder_atomically(build: Callable[[Path], object], target: str | os.PathLike, *,
                            before_install: Callable[[Path], object] | None = None) -> Path:
    """``build(tmp)`` writes a folder's files into a new temporary sibling of ``target``; then they move in.

    A missing (or empty) ``target`` is replaced by the built folder in one rename. An existing
    folder with files (the caller checked the user allowed that) gets the built entries one
    ``os.replace`` each: a file is replaced whole, a link there is replaced, never written through;
    ``before_install(target)`` runs just before (to detach links, say), after the build succeeded.
    Any failure while building removes the temporary folder and the parent folders this call
    created, so nothing is left behind and ``target`` is as it was; an OSError is raised again as
    one OSError naming ``target``.
    """
    target = Path(target)
    created = _make_parents(target.parent)
    reclaim_leftovers(target)
    try:
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_writer_id()}.", suffix=".tmp", dir=target.parent))
        except OSError as err:
            raise _write_error(target, err) from err
        try:
            try:
                os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the checkpoint from other users
                build(tmp)
                for entry in tmp.iterdir():
                    if entry.is_file() and not entry.is_symlink():
                        _fsync(str(entry))
            except OSError as err:
                raise _write_error(target, err) from err
            if before_install is not None and target.is_dir():
                before_install(target)
            try:
                _install_folder(tmp, target)
            except OSError as err:  # renames within one folder: rare (a folder changed under us)
                raise OSError(err.errno, f"could not move the new files into {target}: {err.strerror or err}; "
                              "some may have moved") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after a whole-folder rename
    except BaseException:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return target


def _writer_id() -> str:
    """``PID@HOST`` of this process, in a temporary folder's name, so a later run can tell whose it was."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
    return f"{os.getpid()}@{host}"


def _leftover_folders(target: Path) -> list[tuple[Path, int | None, str | None]]:
    """Temporary folders that earlier writes of ``target`` left beside it: (folder, writer's pid, its host).

    :func:`write_folder_atomically` removes its folder on any error and on Ctrl-C; a process killed
    outright (SIGKILL, the OOM killer, a lost machine) cannot, and its folder (1.2 GB for a cut
    mini) stays hidden behind its leading dot. Folders named before the writer was (no PID) give None.
    """
    name = re.escape(target.name)
    pattern = re.compile(rf"\.{name}\.(?:(\d+)@([A-Za-z0-9-]+)\.)?[a-z0-9_]{{8}}\.tmp")
    found = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            pid = int(match.group(1)) if match.group(1) else None
            found.append((entry, pid, match.group(2)))
    return sorted(found)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def folder_size(folder: Path) -> int:
    """Bytes of the plain files under ``folder`` (links not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def reclaim_leftovers(target: Path) -> list[Path]:
    """Remove the temporary folders that killed writes of ``target`` on this host left; name the others.

    A folder whose writer (by its PID, on this host) has ended is ours and dead: it is removed,
    with a warning naming it and its size. One whose writer may still run (its PID is alive, it was
    written on another host sharing the folder, or it predates the PID in the name) is left alone
    and named, so its disk use is no longer hidden. Returns the folders removed.
    """
    host = _writer_id().split("@", 1)[1]
    removed = []
    for folder, pid, writer_host in _leftover_folders(target):
        size = size_text(folder_size(folder))
        if pid is not None and writer_host == host and pid != os.getpid() and not _running(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
            logger.warning("removed %s (%s), left by an earlier write of %s whose process (PID %d) ended before it "
                           "finished", folder, size, target, pid)
        else:
            who = f"process {pid} on {writer_host}" if pid is not None else "an earlier write"
            logger.warning("%s holds %s left by %s of %s that has not finished; if no process is writing there, "
                           "remove it: rm -r %s", folder, size, who, target, folder)
    return removed


def size_text(n: int) -> str:
    """``31.9 GiB``, or ``12.0 MiB`` below a GiB (a small folder's size would read "0.0 GiB")."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    try:
        for path in reversed(missing):
            path.mkdir()
            created.append(path)
    except OSError as err:
        for path in reversed(created):
            path.rmdir()
        raise OSError(err.errno, f"could not create folder {path}: {err.strerror or err}") from err
    return created


def _install_folder(tmp: Path, target: Path) -> None:
    """Move the built folder ``tmp`` to ``target`` (see :func:`write_folder_atomically`)."""
    if not target.is_symlink():
        try:
            os.rename(tmp, target)  # target missing or an empty folder: one atomic step
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    entries = sorted(tmp.iterdir(), key=lambda p: (p.name == "config.json", p.name))  # the config last
    for entry in entries:
        there = target / entry.name
        if there.is_dir() and not there.is_symlink():
            raise ValueError(f"{target} has a folder {entry.name} where a file is written; move it or "
                             "choose another folder")
    for entry in entries:
        os.replace(entry, target / entry.name)
