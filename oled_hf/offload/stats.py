"""Per-layer counters of the expert cache, shared by the live runtime and replay.

Units follow peers.md section 3: a hit or miss is one unique (access, layer, expert), i.e. an
expert counted once per forward however many tokens picked it. Token-weighted work is counted
separately (``cpu_expert_tokens``, ``gpu_expert_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTERS = (
    "accesses",  # layer accesses (one per MoE layer per forward)
    "hits",  # requested experts resident at the start of the access
    "misses",  # requested experts not resident (copied or computed on the CPU)
    "copies",  # host-to-device expert copies
    "evictions",  # experts dropped from a slot (by copies or by rebalancing)
    "rebalance_evictions",  # ... of which by layer-adaptive rebalancing
    "dead_on_arrival",  # evicted experts that were never hit after being copied in
    "bytes_copied",
    "cpu_experts",  # misses computed on the CPU
    "cpu_expert_tokens",  # routing entries computed on the CPU
    "gpu_expert_tokens",  # routing entries computed on the GPU
)


@dataclass
class CacheStats:
    """Integer counters per MoE layer (lists indexed by layer)."""

    num_layers: int
    accesses: list[int] = field(default_factory=list)
    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)
    rebalance_evictions: list[int] = field(default_factory=list)
    dead_on_arrival: list[int] = field(default_factory=list)
    bytes_copied: list[int] = field(default_factory=list)
    cpu_experts: list[int] = field(default_factory=list)
    cpu_expert_tokens: list[int] = field(default_factory=list)
    gpu_expert_tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in COUNTERS:
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_layers)

    def reset(self) -> None:
        for name in COUNTERS:
            setattr(self, name, [0] * self.num_layers)

    def total(self, name: str) -> int:
        return int(sum(getattr(self, name)))

    @property
    def hit_rate(self) -> float:
        h, m = self.total("hits"), self.total("misses")
        return h / (h + m) if h + m else 0.0

    def layer_hit_rates(self) -> list[float]:
        return [h / (h + m) if h + m else 0.0 for h, m in zip(self.hits, self.misses)]

    def to_dict(self, per_layer: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {name: self.total(name) for name in COUNTERS}
        out["hit_rate"] = self.hit_rate
        if per_layer:
            out["per_layer"] = {name: list(getattr(self, name)) for name in COUNTERS}
            out["per_layer"]["hit_rate"] = self.layer_hit_rates()
        return out

