"""Offline simulation of recorded routing traces (``oled_hf.offload.trace``): replay through any system
and cache size, Belady and the bounds."""

from .belady import BeladyResult, belady_global, belady_min
from .bound import BoundResult, physical_bound
from .replay import ReplayResult, compare, compare_systems, format_table, replay

__all__ = [
    "BeladyResult",
    "BoundResult",
    "ReplayResult",
    "belady_global",
    "belady_min",
    "compare",
    "compare_systems",
    "format_table",
    "physical_bound",
    "replay",
]
