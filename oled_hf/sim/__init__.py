"""Offline simulation: routing traces, replay through any policy and cache size, Belady bounds."""

from .belady import BeladyResult, belady_global, belady_min
from .replay import ReplayResult, compare, format_table, replay
from .trace import Trace, TraceWriter, load_trace

__all__ = [
    "BeladyResult",
    "ReplayResult",
    "Trace",
    "TraceWriter",
    "belady_global",
    "belady_min",
    "compare",
    "format_table",
    "load_trace",
    "replay",
]
