"""Offline simulation of recorded routing traces (``oled_hf.offload.trace``): replay through any system
and cache size, Belady and the bounds."""

from .belady import BeladyResult, belady_global, belady_min
from .bounds import BOUNDS, lower_bound
from .replay import ReplayResult, compare, compare_systems, format_table, replay

__all__ = [
    "BeladyResult",
    "BOUNDS",
    "ReplayResult",
    "belady_global",
    "belady_min",
    "compare",
    "compare_systems",
    "format_table",
    "lower_bound",
    "replay",
]
