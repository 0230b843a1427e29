"""Offline simulation: routing traces, replay through any system and cache size, Belady and physical bounds."""

from .belady import BeladyResult, belady_global, belady_min
from .bound import BoundResult, physical_bound
from .replay import ReplayResult, compare, compare_systems, format_table, replay
from .trace import Trace, TraceWriter, load_trace

__all__ = [
    "BeladyResult",
    "BoundResult",
    "ReplayResult",
    "Trace",
    "TraceWriter",
    "belady_global",
    "belady_min",
    "compare",
    "compare_systems",
    "format_table",
    "load_trace",
    "physical_bound",
    "replay",
]
