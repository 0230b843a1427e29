"""Offline schedules timed on replay's timeline: the upper side of the bracket around the optimum.

A schedule here is one the timeline's rules can run, so its time is an upper bound on the optimum
(the lower side is ``sim/bounds``). :func:`offline_schedules` (``best.py``) is the one entry the
report and ``eval/report/bracket.py`` call: the least of

* ``greedy.py``: Belady retention, per access the number of misses to copy that ends it earliest
  (best over a few reuse credits); myopic in that count, and copies only on demand;
* ``search.py``: the greedy plus prefetches into the copy engine's idle time (best over a few
  variants); still greedy in its choices;
* replay with the ``belady`` retention oracle under the strongest fair dispatch and under pure
  caching (``best.py``); the dispatcher's split stays online there.

None pays planner time (an offline schedule plans nothing on the host). What none of them is: the
optimum. The bracket's width is what the relaxation of the bounds drops plus these schedules' myopia.
"""

from __future__ import annotations

from .best import OfflineRows, offline_schedules

__all__ = ["OfflineRows", "offline_schedules"]
