"""Retention policies (one interface, ``base.CachePolicy``, one short file per policy) and the
prefetch part (``prefetch.py``)."""

from .adaptive import AdaptivePolicy
from .base import CachePolicy, available_policies, make_policy
from .horizon import HorizonPolicy
from .learned import LearnedPolicy
from .lfu import LFUPolicy
from .lru import LRUPolicy, PrefetchPolicy
from .mix import MixPolicy
from .moe_infinity import MoEInfinityPolicy
from .oled import OledPolicy
from .oracle import BeladyPolicy, BeladyReusePolicy, LRUReusePolicy, NextOraclePolicy, PreviousSetPolicy
from .phase import PhasePolicy
from .prefetch import Prefetcher, make_prefetcher
from .score import ScorePolicy
from .static import StaticPolicy
from .tide import TidePolicy
from .value import ValuePolicy

__all__ = [
    "AdaptivePolicy",
    "BeladyPolicy",
    "BeladyReusePolicy",
    "CachePolicy",
    "HorizonPolicy",
    "LFUPolicy",
    "LearnedPolicy",
    "LRUPolicy",
    "LRUReusePolicy",
    "MixPolicy",
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
    "ValuePolicy",
    "available_policies",
    "make_policy",
    "make_prefetcher",
]
