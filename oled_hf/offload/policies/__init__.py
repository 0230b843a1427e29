"""Retention policies (one interface, ``base.CachePolicy``, one short file per policy) and the
prefetch part (``prefetch.py``)."""

from .adaptive import AdaptivePolicy
from .base import CachePolicy, available_policies, make_policy
from .learned import LearnedPolicy
from .lfu import LFUPolicy
from .lru import LRUPolicy, PrefetchPolicy
from .moe_infinity import MoEInfinityPolicy
from .oled import OledPolicy
from .oracle import BeladyPolicy, BeladyReusePolicy, LRUReusePolicy, NextOraclePolicy, PreviousSetPolicy
from .phase import PhasePolicy
from .prefetch import Prefetcher, make_prefetcher
from .score import ScorePolicy
from .static import StaticPolicy
from .tide import TidePolicy

__all__ = [
    "AdaptivePolicy",
    "BeladyPolicy",
    "BeladyReusePolicy",
    "CachePolicy",
    "LFUPolicy",
    "LearnedPolicy",
    "LRUPolicy",
    "LRUReusePolicy",
    "MoEInfinityPolicy",
    "NextOraclePolicy",
    "OledPolicy",
    "PhasePolicy",
    "PrefetchPolicy",
    "PreviousSetPolicy",
    "Prefetcher",
    "ScorePolicy",
    "StaticPolicy",
    "TidePolicy",
    "available_policies",
    "make_policy",
    "make_prefetcher",
]
