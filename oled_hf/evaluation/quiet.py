"""Keep lm-eval's run readable in a log: its bars as progress lines, no git noise.

lm-eval 0.4 has no switch for either: its bars are ``tqdm`` calls with ``disable`` computed from
the process rank, and its results logging runs ``git describe --always`` with git's stderr left
on ours, so every run outside a clone prints "fatal: not a git repository". ``lm_eval_quiet``
replaces those module attributes for the duration of a run and puts them back after:

* always: the git lookup, by :func:`git_commit_hash` (the same lookup, git's stderr discarded);
* in a pipe or log: the request bars (HFLM's "Running generate_until requests") by
  :func:`oled_hf.progress.progress` lines, the per-document "Building contexts" bar by nothing,
  and transformers', the hub's and datasets' bars off (:func:`oled_hf.progress.quiet_library_bars`);
* with ``quiet``: all of those bars off, the adapter's loglikelihood bar too.

On a terminal without ``quiet`` the bars are lm-eval's own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from ..progress import bars_enabled, progress, quiet_library_bars


def git_commit_hash() -> str | None:
    """``lm_eval.loggers.utils.get_git_commit_hash``'s lookup without git's stderr reaching ours.

    lm-eval's own function runs ``git describe --always`` with stderr inherited; outside a clone
    git prints "fatal: not a git repository" there. Same fallback (the ``.git`` folder, read).
    """
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        done = subprocess.run(["git", "describe", "--always"], capture_output=True, check=True)  # noqa: S607
        return done.stdout.decode().strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


def request_bar(iterable=None, *args, total=None, desc=None, disable=False, quiet=False, **_ignored):
    """A stand-in for ``tqdm`` in lm-eval's model code: :func:`progress` lines in a pipe (or nothing)."""
    return progress(iterable, total=total, desc=desc or "lm-eval requests", unit="request",
                    quiet=quiet or bool(disable))


def no_bar(iterable=None, *args, **kwargs):
    """A stand-in for ``tqdm`` where a bar only adds noise to a log (lm-eval's per-document loops)."""
    from tqdm import tqdm

    kwargs["disable"] = True
    return tqdm(iterable, *args, **kwargs)


def silent_progress(*args, **kwargs):
    """:func:`progress` with ``quiet`` forced on (the adapter's own bars under ``--quiet``)."""
    kwargs["quiet"] = True
    return progress(*args, **kwargs)


@contextmanager
def lm_eval_quiet(quiet: bool = False) -> Iterator[None]:
    """Within: lm-eval's git lookup quiet; in a pipe or with ``quiet`` its bars as lines or off."""
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.evaluator
    import lm_eval.models.huggingface

    patches = {(lm_eval.evaluator, "get_git_commit_hash"): git_commit_hash}
    if not bars_enabled(quiet):
        quiet_library_bars(quiet)
        patches[(lm_eval.models.huggingface, "tqdm")] = partial(request_bar, quiet=quiet)
        patches[(lm_eval.api.model, "tqdm")] = no_bar  # "Checking cached requests"
        patches[(lm_eval.api.task, "tqdm")] = no_bar  # "Building contexts", one step per document
    if quiet:
        from . import lm_eval_adapter

        patches[(lm_eval_adapter, "progress")] = silent_progress  # the MC loglikelihood bar
    saved = {key: getattr(*key) for key in patches}
    for (module, name), value in patches.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
