"""Progress for long work (benchmark runs, trace prompts, training steps, eval requests), on stderr.

A leaf module (tqdm and the standard library; transformers, huggingface_hub and datasets only
inside ``quiet_library_bars``), so the CLI, the toy trainers and the eval scripts share it without
importing one another. Everything goes to stderr, so stdout stays the command's result:

* on a terminal, a ``tqdm`` bar;
* in a pipe or a log (stderr not a terminal), a plain line every ``PIPE_INTERVAL_S`` seconds with
  done/total, the elapsed time, the rate and the time left, and a last line with the duration
  (:class:`PipeProgress`);
* with ``--quiet``, nothing.

``quiet_library_bars`` holds transformers', huggingface_hub's and datasets' own bars to the same
rule (off in pipes and with ``--quiet``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

PIPE_INTERVAL_S = 10.0  # seconds between two progress lines in a pipe


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str, unit: str = "it",
             quiet: bool = False, interval: float = PIPE_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
    """A bar over ``iterable`` (or a manual one with ``total``, advanced by ``.update()``, ended by ``.close()``).

    A ``tqdm`` bar on a terminal, a :class:`PipeProgress` in a pipe, a disabled ``tqdm`` with
    ``quiet``: all three iterate, ``update(n)`` and ``close()`` alike (and work as context managers).
    """
    from tqdm import tqdm

    if quiet:
        return tqdm(iterable, total=total, disable=True)
    if bars_enabled():
        return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return PipeProgress(iterable, total=total, desc=desc, unit=unit, interval=interval, clock=clock)


def bars_enabled(quiet: bool = False) -> bool:
    """Whether a bar may be drawn: not ``--quiet`` and stderr is a terminal (a bar in a pipe is noise).

    The same test as ``tqdm(disable=None)``; it is made here, once, because in a pipe the answer is
    not "nothing" but :class:`PipeProgress`, which tqdm has no mode for.
    """
    stream = sys.stderr
    return not quiet and hasattr(stream, "isatty") and stream.isatty()


def duration(seconds: float) -> str:
    """``4.2 s``, ``1m05s``, ``2h03m``: short enough for a log line, exact enough to compare runs."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def rate(n: float, seconds: float, unit: str) -> str:
    """Items per second, or seconds per item when that reads better (fewer than one a second)."""
    if n <= 0 or seconds <= 0:
        return f"- {unit}/s"
    per_second = n / seconds
    return f"{per_second:.2f} {unit}/s" if per_second >= 1 else f"{seconds / n:.2f} s/{unit}"


class PipeProgress:
    """What a pipe or a log gets instead of a bar: a line every ``interval`` seconds, one at the end.

    tqdm lacks this mode: in a pipe it either draws nothing (``disable=None``) or redraws its bar
    with carriage returns, which a log keeps as one ever-growing line, and its last state gives no
    duration in words. Lines are written from ``update`` (no timer thread, so nothing is printed
    while one step runs: a step longer than ``interval`` delays the next line to its end).
    ``clock`` is injectable so tests need not sleep.
    """

    def __init__(self, iterable: Iterable | None = None, *, total: int | None, desc: str, unit: str = "it",
                 interval: float = PIPE_INTERVAL_S, clock: Callable[[], float] = time.monotonic, stream=None):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.interval, self.clock, self.stream = interval, clock, stream
        self.n = 0
        self.start = self.last = clock()
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            yield item
            self.update()
        self.close()

    def __enter__(self) -> PipeProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __len__(self) -> int:
        return self.total or 0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.interval and not (self.total and self.n >= self.total):  # close() says it
            self.last = now
            self._write(self.status(now))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._write(self.final(self.clock()))

    def _count(self) -> str:
        return f"{self.n}/{self.total}" if self.total else str(self.n)

    def status(self, now: float) -> str:
        """``desc: done/total unit, elapsed, rate, time left`` (the line a pipe gets every ``interval``)."""
        elapsed = now - self.start
        parts = [f"{self.desc}: {self._count()} {self.unit}", f"{duration(elapsed)} elapsed",
                 rate(self.n, elapsed, self.unit)]
        if self.total and 0 < self.n < self.total:
            parts.append(f"about {duration(elapsed / self.n * (self.total - self.n))} left")
        return ", ".join(parts)

    def final(self, now: float) -> str:
        """``desc: done, n/total unit in DURATION (rate)`` (``stopped`` when fewer than ``total`` were done)."""
        elapsed = now - self.start
        word = "stopped at" if self.total and self.n < self.total else "done,"
        speed = rate(self.n, elapsed, self.unit)
        return f"{self.desc}: {word} {self._count()} {self.unit} in {duration(elapsed)} ({speed})"

    def _write(self, line: str) -> None:
        stream = self.stream or sys.stderr  # looked up at write time: tests and callers may swap sys.stderr
        stream.write(line + "\n")
        stream.flush()


def quiet_library_bars(quiet: bool = False) -> None:
    """Turn off transformers' "Loading weights", huggingface_hub's and datasets' bars by the same rule.

    Those libraries draw their bars on stderr whether or not it is a terminal, so piped logs and
    ``--quiet`` runs got them. Only ever turns bars off (a terminal keeps the libraries' own
    settings, ``HF_HUB_DISABLE_PROGRESS_BARS`` included). A library not imported yet is told through its
    environment variable, which it reads at import; one already imported through its own switch. So
    nothing is imported here, and this module stays importable without them.
    """
    if bars_enabled(quiet):
        return
    # Not imported yet (a command that has not loaded a model): the libraries read these at import, so
    # nothing is imported here for them (transformers alone takes seconds: `trace synth` needs none of it).
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # huggingface_hub's, and transformers' through it
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()  # transformers' flag; it also calls the hub's
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()  # "Generating train split", "Map": drawn on any stderr


def add_quiet_argument(parser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress output (a pipe or log gets a line every "
                             f"{PIPE_INTERVAL_S:g} s and the duration instead of a bar)")
