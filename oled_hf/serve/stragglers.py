"""The clients of just-answered requests, expected back for a short straggler window.

Closed-loop clients (a chat UI, a benchmark, an agent loop) send their next request as soon as the
last is answered, but not at the same instant: on a loaded 2-core machine the resends of a batch of
8 are spread over a few to a few tens of milliseconds. A worker that waits only for requests
already arriving (headers in) starts on the first resend and splits the rest into later batches.
A worker that waits for as many requests as the last batch held, until ``--batch-wait-ms``, makes
the first lone request after a burst wait the whole window for companions that are not coming.

The rule kept here sits between the two: each answered request is *expected back* for a straggler
window ``W`` after its answer, and the worker waits (never past ``--batch-wait-ms``) while some
answered request is still expected. ``W`` follows the resend gaps this server has seen (the time
from an answer to the next request's arrival, paired oldest answer first): ``STRAGGLER_FACTOR``
times their 90th percentile, at least ``STRAGGLER_FLOOR_S``, at most ``STRAGGLER_MAX_S`` and
``--batch-wait-ms``; not below ``STRAGGLER_INITIAL_S`` (capped the same way) until
``MIN_SAMPLES`` gaps are seen (the first resends of a burst are its quickest: one or two of them
would set ``W`` below the later ones). So a
lone request after a burst waits at most ``W`` (tens of milliseconds), never the whole window, and
a lone client waits not at all: its own answer is paired with its own resend.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

STRAGGLER_FLOOR_S = 0.005
STRAGGLER_MAX_S = 0.100
STRAGGLER_INITIAL_S = 0.050
STRAGGLER_FACTOR = 1.5
GAP_SAMPLES = 64
MIN_SAMPLES = 16


def straggler_window(gaps: collections.abc.Sequence[float], cap_s: float) -> float:
    """``W`` in seconds from the observed resend gaps (module docstring), never above ``cap_s``."""
    ordered = sorted(gaps)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else 0.0
    floor = STRAGGLER_INITIAL_S if len(ordered) < MIN_SAMPLES else STRAGGLER_FLOOR_S
    return min(cap_s, STRAGGLER_MAX_S, max(floor, STRAGGLER_FACTOR * p90))


@dataclass
class Stragglers:
    """Answer times not yet paired with a new request, and the resend gaps seen (not thread-safe:
    the job queue calls it under its lock). ``cap_s``: ``--batch-wait-ms`` in seconds."""

    cap_s: float
    answered: collections.deque = field(default_factory=collections.deque)  # oldest first
    gaps: collections.deque = field(default_factory=lambda: collections.deque(maxlen=GAP_SAMPLES))

    @property
    def horizon_s(self) -> float:
        """How long an answer may still be paired with a resend: gaps past it say nothing about ``W``."""
        return min(self.cap_s, 2 * STRAGGLER_MAX_S)

    def window(self) -> float:
        return straggler_window(self.gaps, self.cap_s)

    def answer(self, now: float) -> None:
        if self.cap_s > 0:
            self.answered.append(now)

    def arrive(self, now: float) -> None:
        """A generation request reached the server: it is the resend of the oldest answer still recent."""
        self._prune(now)
        if self.answered:
            self.gaps.append(now - self.answered.popleft())

    def awaited_until(self, now: float) -> float | None:
        """Until when the worker may wait for an answered client's resend; None when none is awaited."""
        self._prune(now)
        if not self.answered:
            return None
        until = self.answered[-1] + self.window()
        return until if until > now else None

    def _prune(self, now: float) -> None:
        while self.answered and now - self.answered[0] > self.horizon_s:
            self.answered.popleft()
