"""Progress bars for long work (benchmark runs, trace prompts, training steps): tqdm on stderr.

A leaf module (tqdm and the standard library only), so the CLI, the toy trainer and the eval
scripts share it without importing one another. Bars go to stderr, so stdout stays the command's
result; they are off when stderr is not a terminal (pipes, CI logs, tests) or with ``--quiet``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str = "it",
             quiet: bool = False):
    """A ``tqdm`` bar over ``iterable`` (or a manual one with ``total``, advanced by ``.update()``)."""
    from tqdm import tqdm

    stream = sys.stderr
    enabled = not quiet and hasattr(stream, "isatty") and stream.isatty()
    return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, disable=not enabled)


def add_quiet_argument(parser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (there is none either when stderr is not a terminal)")
