"""Expert-cache policies: one interface (``base.CachePolicy``), one short file per policy."""

from .base import CachePolicy, available_policies, make_policy
from .lfu import LFUPolicy
from .lru import LRUPolicy
from .moe_infinity import MoEInfinityPolicy
from .oled import OledPolicy
from .prefetch import Prefetcher, PrefetchPolicy
from .static import StaticPolicy
from .tide import TidePolicy

__all__ = [
    "CachePolicy",
    "LFUPolicy",
    "LRUPolicy",
    "MoEInfinityPolicy",
    "OledPolicy",
    "PrefetchPolicy",
    "Prefetcher",
    "StaticPolicy",
    "TidePolicy",
    "available_policies",
    "make_policy",
]
