"""The expert-cache state and per-access planning, shared by the live runtime and trace replay.

Pure bookkeeping: which expert sits in which slot of a global slot pool, and, for one MoE layer
access, which requested experts are hits, which to copy (into which slot, evicting whom) and which
to compute on the CPU. The live runtime executes the plan; replay only counts it. Because both
call the very same :meth:`CacheState.plan`, a replayed trace reproduces the live run's counters.

Rules of a plan (see ``plan``): hits are computed first, from their slots. Copies are issued in
ascending priority; each takes a free slot of the layer, else evicts the lowest-priority resident
expert not requested now, else (the request exceeds the layer's capacity) the lowest-priority
expert of this access that was already computed. The live runtime computes each copied expert
right after it lands, so reusing a slot within an access is safe, and the device never holds
more than ``capacities[layer]`` experts of a layer.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .dispatch import Dispatcher
from .policies.base import CachePolicy, as_numpy
from .stats import CacheStats


@dataclass
class LayerPlan:
    """What one MoE layer access does with its requested experts."""

    hits: list[int]  # requested experts resident now (compute on the GPU from their slots)
    copies: list[tuple[int, int, int | None]]  # (expert, slot, evicted_expert_or_None), execution order
    cpu: list[int]  # requested experts to compute on the CPU from the host store
    slot_of: dict[int, int]  # expert -> slot for every GPU-computed expert of this access
    layer: int = -1
    counts: np.ndarray | None = None  # tokens routed to each expert, [num_experts]


class SlotMove(NamedTuple):
    """A slot handed from one layer to another by :meth:`CacheState.set_capacities`."""

    layer: int  # the layer that gave the slot up
    slot: int
    evicted_expert: int  # the expert of ``layer`` dropped from it, -1 if the slot was free


def _check_capacities(capacities: list[int], num_layers: int, num_experts: int) -> list[int]:
    caps = [int(c) for c in capacities]
    if len(caps) != num_layers:
        raise ValueError(f"capacities has {len(caps)} entries, expected one per MoE layer ({num_layers})")
    bad = [(l, c) for l, c in enumerate(caps) if not 1 <= c <= num_experts]
    if bad:
        raise ValueError(
            f"capacities must be in [1, num_experts={num_experts}] per layer; got {bad[:4]} (layer, slots)"
        )
    return caps


class CacheState:
    """Residency of every MoE layer's experts in one global pool of ``sum(capacities)`` slots."""

    def __init__(self, num_layers: int, num_experts: int, capacities: list[int], expert_bytes: int = 0) -> None:
        self.num_layers = int(num_layers)
        self.num_experts = int(num_experts)
        self.capacities = _check_capacities(capacities, self.num_layers, self.num_experts)
        self.total_slots = sum(self.capacities)
        self.expert_bytes = int(expert_bytes)
        self.slot_owner = np.repeat(np.arange(self.num_layers), self.capacities)
        self.slot_expert = np.full(self.total_slots, -1, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(self.capacities)))
        # free slots per layer, popped from the end (lowest slot id first)
        self._free = [list(range(int(starts[l + 1]) - 1, int(starts[l]) - 1, -1)) for l in range(self.num_layers)]
        self._slot_of: list[dict[int, int]] = [{} for _ in range(self.num_layers)]
        self._resident = np.zeros((self.num_layers, self.num_experts), dtype=bool)
        self._unhit = np.zeros((self.num_layers, self.num_experts), dtype=bool)  # copied, not yet hit
        self.stats = CacheStats(self.num_layers)

    # ------------------------------------------------------------------ queries
    def resident(self, layer: int) -> dict[int, int]:
        """Expert -> slot of the layer's resident experts (a copy)."""
        return dict(self._slot_of[layer])

    def resident_mask(self, layer: int) -> np.ndarray:
        return self._resident[layer].copy()

    def slots_of_layer(self, layer: int) -> list[int]:
        return np.flatnonzero(self.slot_owner == layer).tolist()

    # ------------------------------------------------------------------ planning
    def plan(
        self,
        layer: int,
        topk_ids: Any,
        topk_weights: Any,
        policy: CachePolicy,
        dispatcher: Dispatcher,
        counts: np.ndarray | None = None,
    ) -> LayerPlan:
        """Plan one access and apply it to the residency and the stats.

        Call after ``policy.observe_access`` for the same access (the policy's priorities and reuse
        predictions then include it). ``topk_weights`` is unused here (the policy has seen it) and
        kept for a uniform signature; ``counts`` (tokens per expert) may be passed if known.
        """
        if policy.capacities is not self.capacities:
            policy.set_capacities(self.capacities)
        if counts is None:
            counts = np.bincount(as_numpy(topk_ids).reshape(-1), minlength=self.num_experts)
        req = np.flatnonzero(counts)
        res = self._resident[layer]
        hit_mask = res[req]
        hits = req[hit_mask]
        misses = req[~hit_mask]
        copies_e, cpu_e = misses, misses[:0]
        if misses.size and dispatcher.cpu_enabled:
            adm = policy.admission(layer)
            copy_mask = dispatcher.decide(
                counts[misses],
                policy.reuse_array(layer)[misses],
                None if adm is None else adm[misses],
                self.capacities[layer] - hits.size,
                counts[hits],
            )
            copies_e, cpu_e = misses[copy_mask], misses[~copy_mask]
        hits_l = hits.tolist()
        slot_of_layer = self._slot_of[layer]
        plan_slots = {e: slot_of_layer[e] for e in hits_l}
        self._unhit[layer][hits] = False
        copies = self._place(layer, copies_e, counts, hits_l, policy, plan_slots) if copies_e.size else []

        st = self.stats
        st.accesses[layer] += 1
        st.hits[layer] += len(hits_l)
        st.misses[layer] += int(misses.size)
        st.copies[layer] += len(copies)
        st.bytes_copied[layer] += len(copies) * self.expert_bytes
        st.cpu_experts[layer] += int(cpu_e.size)
        st.cpu_expert_tokens[layer] += int(counts[cpu_e].sum())
        st.gpu_expert_tokens[layer] += int(counts[hits].sum() + counts[copies_e].sum())
        return LayerPlan(hits_l, copies, cpu_e.tolist(), plan_slots, layer, counts)

    def _place(
        self,
        layer: int,
        copies_e: np.ndarray,
        counts: np.ndarray,
        hits: list[int],
        policy: CachePolicy,
        plan_slots: dict[int, int],
    ) -> list[tuple[int, int, int | None]]:
        """Assign slots to the copies (ascending priority) and evict as the module rules say."""
        prio = policy.priority_array(layer)
        copies_e = copies_e[np.argsort(prio[copies_e], kind="stable")]  # ids ascending: ties by id
        free = self._free[layer]
        victims: list[int] = []
        need = copies_e.size - len(free)
        if need > 0:
            cand = np.flatnonzero(self._resident[layer] & (counts == 0))
            victims = cand[np.argsort(prio[cand], kind="stable")][:need].tolist()
        slot_of_layer = self._slot_of[layer]
        computed: list[tuple[float, int]] | None = None
        copies: list[tuple[int, int, int | None]] = []
        vi = 0
        for e in copies_e.tolist():
            evicted: int | None = None
            if free:
                slot = free.pop()
            else:
                if vi < len(victims):
                    evicted = victims[vi]
                    vi += 1
                else:  # request exceeds capacity: stream through a computed expert's slot
                    if computed is None:
                        pl = prio.tolist()
                        computed = [(pl[x], x) for x in hits] + [(pl[x], x) for x, _, _ in copies]
                        heapq.heapify(computed)
                    evicted = heapq.heappop(computed)[1]
                slot = slot_of_layer.pop(evicted)
                self._evict(layer, evicted)
            slot_of_layer[e] = slot
            self._resident[layer, e] = True
            self._unhit[layer, e] = True
            self.slot_expert[slot] = e
            plan_slots[e] = slot
            copies.append((e, slot, evicted))
            if computed is not None:
                heapq.heappush(computed, (float(prio[e]), e))
        return copies

    def _evict(self, layer: int, expert: int) -> None:
        self._resident[layer, expert] = False
        st = self.stats
        st.evictions[layer] += 1
        if self._unhit[layer, expert]:
            st.dead_on_arrival[layer] += 1
            self._unhit[layer, expert] = False

    # ------------------------------------------------------------------ rebalancing
    def set_capacities(self, new: list[int], policy: CachePolicy | None) -> list[SlotMove]:
        """Move slots between layers; the total stays fixed.

        Shrinking layers give up free slots first, then the slots of their lowest-priority
        experts (evicted); growing layers receive those slots empty. Returns one move per slot.
        """
        caps = _check_capacities(new, self.num_layers, self.num_experts)
        if sum(caps) != self.total_slots:
            raise ValueError(f"capacities sum to {sum(caps)}, but the slot pool has {self.total_slots} slots")
        released: list[SlotMove] = []
        for l, (old, cap) in enumerate(zip(self.capacities, caps)):
            give = old - cap
            free = self._free[l]
            while give > 0 and free:
                released.append(SlotMove(l, free.pop(), -1))
                give -= 1
            if give > 0:
                resident = np.fromiter(self._slot_of[l].keys(), dtype=np.int64)
                prio = policy.priority_array(l) if policy is not None else np.zeros(self.num_experts)
                for e in resident[np.lexsort((resident, prio[resident]))][:give].tolist():
                    slot = self._slot_of[l].pop(e)
                    self._evict(l, e)
                    self.stats.rebalance_evictions[l] += 1
                    self.slot_expert[slot] = -1
                    released.append(SlotMove(l, slot, e))
        it = iter(released)
        for l, (old, cap) in enumerate(zip(self.capacities, caps)):
            for _ in range(cap - old):
                slot = next(it).slot
                self.slot_owner[slot] = l
                self._free[l].append(slot)
        self.capacities = caps
        if policy is not None:
            policy.set_capacities(self.capacities)
        return released

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""
        seen: set[int] = set()
        for l in range(self.num_layers):
            owned = set(np.flatnonzero(self.slot_owner == l).tolist())
            used = set(self._slot_of[l].values())
            free = set(self._free[l])
            assert len(self._slot_of[l]) <= self.capacities[l], f"layer {l} holds more than its capacity"
            assert len(owned) == self.capacities[l], f"layer {l} owns {len(owned)} slots, capacity {self.capacities[l]}"
            assert used | free == owned and not used & free, f"layer {l}: slot lists disagree with ownership"
            assert len(used) == len(self._slot_of[l]), f"layer {l}: two experts share a slot"
            assert not owned & seen, f"layer {l} shares slots with another layer"
            seen |= owned
            for e, s in self._slot_of[l].items():
                assert self.slot_expert[s] == e and self._resident[l, e], f"layer {l}: expert {e} slot mismatch"
            assert int(self._resident[l].sum()) == len(self._slot_of[l]), f"layer {l}: residency mask mismatch"
        assert sum(self.capacities) == self.total_slots == len(seen), "slot pool size changed"
