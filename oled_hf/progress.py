"""Progress bars for long work (benchmark runs, trace prompts, training steps): tqdm on stderr.

A leaf module (tqdm and the standard library; transformers only inside ``quiet_library_bars``), so
the CLI, the toy trainer and the eval scripts share it without importing one another. Bars go to
stderr, so stdout stays the command's result; they are off when stderr is not a terminal (pipes,
CI logs, tests) or with ``--quiet``, and ``quiet_library_bars`` holds transformers' to the same rule.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str = "it",
             quiet: bool = False):
    """A ``tqdm`` bar over ``iterable`` (or a manual one with ``total``, advanced by ``.update()``)."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=not bars_enabled(quiet))


def bars_enabled(quiet: bool = False) -> bool:
    """Whether bars may be drawn: not ``--quiet`` and stderr is a terminal (a bar in a pipe is noise)."""
    stream = sys.stderr
    return not quiet and hasattr(stream, "isatty") and stream.isatty()


def quiet_library_bars(quiet: bool = False) -> None:
    """Turn off transformers' "Loading weights" and huggingface_hub's download bars by the same rule.

    Those libraries draw their bars on stderr whether or not it is a terminal, so piped logs and
    ``--quiet`` runs got them. Only ever turns bars off (a terminal keeps the libraries' own
    settings, ``HF_HUB_DISABLE_PROGRESS_BARS`` included). Imports transformers only when it has
    something to turn off, so this module stays importable without it.
    """
    if bars_enabled(quiet):
        return
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    logging.disable_progress_bar()  # transformers' flag; it also calls the hub's
    disable_progress_bars()


def add_quiet_argument(parser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (there is none either when stderr is not a terminal)")
