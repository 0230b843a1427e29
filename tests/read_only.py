"""A folder that refuses new files, for tests of writers (issue 35 item 4).

Permission bits do not stop root, so as root the folder is made immutable (``chattr +i``, ext4 and
others); where neither works (a file system without the attribute) the test is skipped, never
passed vacuously.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _refuses_files(folder: Path) -> bool:
    try:
        (folder / ".probe").touch()
    except OSError:
        return True
    (folder / ".probe").unlink()
    return False


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` (created if missing) refusing new files inside the block; writable again after it."""
    folder.mkdir(parents=True, exist_ok=True)
    root = os.geteuid() == 0
    if root:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    else:
        folder.chmod(0o555)
        made = True
    try:
        if not made or not _refuses_files(folder):
            pytest.skip("cannot make a folder read-only here (no chattr +i for root)")
        yield folder
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        else:
            folder.chmod(0o755)
