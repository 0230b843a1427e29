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

Rule 4 (reuse copies; on where the dispatch part is ``cpu+reuse``, ``Dispatcher.reuse_copies``): of
the misses sent to the CPU, up to ``reuse_copies`` whose predicted reuse is at least ``reuse_min``
(highest reuse first, ties by id) are *also* copied into a slot after the access's own copies:
the CPU result serves this access, the copy serves the next one. Each takes a free slot, else
evicts the lowest-priority resident expert not requested now, and only one of lower priority than
itself; the first candidate that finds no such slot ends the rule. The copy engine is otherwise
idle while the CPU computes the misses, so these copies cost bandwidth and slots, not latency.

The rules are written once, in ``kernels.plan_access`` (compiled by numba, or the same function
run as Python, ``oled_hf.offload.kernels``); this module holds the state arrays it works on and the
bookkeeping outside an access (prefetch admission, rebalancing, reconciliation).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import kernels
from .dispatch import Dispatcher
from .layer_plan import LayerPlan
from .policies.base import NO_FLOATS as _NO_F
from .policies.base import NO_INTS as _NO_I
from .policies.base import CachePolicy, as_numpy
from .stats import CacheStats

_NO_REUSE = (1, _NO_F, _NO_I, _NO_I, _NO_F)  # reuse_inputs where no miss goes to the CPU


def _float64(prio: np.ndarray) -> np.ndarray:
    """A policy's priorities as float64 (exact for the integer clocks and counts policies rank by)."""
    return prio if prio.dtype == np.float64 else prio.astype(np.float64)


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
    """Residency of every MoE layer's experts in one global pool of ``sum(capacities)`` slots.

    State is arrays (per layer and expert: its slot or -1; per layer: a stack of free slots), so
    that one call of ``kernels.plan_access`` plans an access in place.
    """

    def __init__(self, num_layers: int, num_experts: int, capacities: list[int], expert_bytes: int = 0) -> None:
        self.num_layers = int(num_layers)
        self.num_experts = int(num_experts)
        self.capacities = _check_capacities(capacities, self.num_layers, self.num_experts)
        self.total_slots = sum(self.capacities)
        self.expert_bytes = int(expert_bytes)
        self.slot_owner = np.repeat(np.arange(self.num_layers), self.capacities)
        self.slot_expert = np.full(self.total_slots, -1, dtype=np.int64)
        shape = (self.num_layers, self.num_experts)
        self._tables = np.full((2, *shape), -1, dtype=np.int64)  # one array: one argument of the kernel
        self._slot = self._tables[0]  # slot of each resident expert, -1 if not resident
        # free slots per layer: a stack (top = index n-1) popped lowest slot id first
        self._free = self._tables[1]
        self._free_n = np.zeros(self.num_layers, dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(self.capacities)))
        for l in range(self.num_layers):
            self._free[l, : self.capacities[l]] = np.arange(starts[l + 1] - 1, starts[l] - 1, -1)
            self._free_n[l] = self.capacities[l]
        # per layer and expert: [0] resident, [1] copied and not hit since (one array: a copy or an
        # eviction updates both flags in one operation)
        self._flags = np.zeros((self.num_layers, 2, self.num_experts), dtype=bool)
        self._resident, self._unhit = self._flags[:, 0], self._flags[:, 1]
        self.stats = CacheStats(self.num_layers)
        self._out = np.zeros((10, max(self.num_experts, 10)), dtype=np.int64)  # kernels.plan_access's answer
        self._all_admitted = np.ones(self.num_experts, dtype=bool)
        kernels.warm_up()  # compiled (or loaded from numba's cache) now, not in the first forward

    # ------------------------------------------------------------------ queries
    def resident(self, layer: int) -> dict[int, int]:
        """Expert -> slot of the layer's resident experts (a copy, in expert order)."""
        experts = self._resident[layer].nonzero()[0]
        return dict(zip(experts.tolist(), self._slot[layer, experts].tolist()))

    def resident_mask(self, layer: int) -> np.ndarray:
        return self._resident[layer].copy()

    def slots_of_layer(self, layer: int) -> list[int]:
        return np.flatnonzero(self.slot_owner == layer).tolist()

    def holds_all(self, layer: int) -> bool:
        """Whether every expert of the layer is resident: then any access to it is all hits (O(1))."""
        return self.capacities[layer] == self.num_experts and not self._free_n[layer]

    def _pop_free(self, layer: int, n: int) -> list[int]:
        top = int(self._free_n[layer])
        self._free_n[layer] = top - n
        return self._free[layer, top - n: top][::-1].tolist()

    def _push_free(self, layer: int, slot: int) -> None:
        n = int(self._free_n[layer])
        self._free[layer, n] = slot
        self._free_n[layer] = n + 1

    def _release(self, layer: int, experts: list[int]) -> list[int]:
        """The slots of ``experts`` (leaving the layer's slot table)."""
        slots = self._slot[layer, experts].tolist()
        self._slot[layer, experts] = -1
        return slots

    def _drop(self, layer: int, experts: list[int]) -> None:
        """Make ``experts`` non-resident with their slots free, the lowest slot id popped first (as at start)."""
        if not experts:
            return
        for slot in self._release(layer, experts):
            self.slot_expert[slot] = -1
            self._push_free(layer, slot)
        self._resident[layer, experts] = self._unhit[layer, experts] = False
        n = int(self._free_n[layer])
        self._free[layer, :n] = np.sort(self._free[layer, :n])[::-1]

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
        kept for a uniform signature; ``counts`` (tokens per expert, the bincount of ``topk_ids``) may be
        passed if known.
        """
        if policy.capacities is not self.capacities:
            policy.set_capacities(self.capacities)
        ids = as_numpy(topk_ids)
        if counts is None:
            counts = np.bincount(ids.reshape(-1), minlength=self.num_experts)
        total_tokens = ids.size  # = counts.sum(): each route is one token of one expert
        shadow = getattr(policy, "before_plan", None)  # ``adaptive``: its candidates' shadow caches
        if shadow is not None:
            shadow(self, layer, ids, counts, dispatcher)
        prio = _float64(policy.priority_array(layer))
        adm = policy.admission(layer)
        cpu = dispatcher.cpu_enabled
        mode, row, flat, entry_cls, stab = policy.reuse_inputs(layer) if cpu else _NO_REUSE
        out = self._out
        kernels.plan_access(
            layer, counts, self._flags, self._tables, self._free_n, self.slot_expert, prio,
            self._all_admitted if adm is None else adm, adm is not None, mode, row, flat, entry_cls, stab,
            self.capacities[layer], total_tokens, cpu, dispatcher.reuse_copies, dispatcher.reuse_min,
            dispatcher.kernel_costs(), out,
        )
        nh, nm, nc, ncpu, cpu_tokens, nbg, nfree, nbg_free, doa, streamed = out[9, :10].tolist()
        evicted = nc - nfree + nbg - nbg_free
        if evicted:
            self.stats.evictions[layer] += evicted
            self.stats.dead_on_arrival[layer] += doa
        self._count(layer, nh, nm, nc + nbg, ncpu, cpu_tokens, total_tokens)
        plan = LayerPlan.from_arrays(layer, counts, out[:9, : max(nh, nc, ncpu, nbg)].copy(),
                                     [nh, nc, ncpu, nbg, nfree, nbg_free, streamed])
        if shadow is not None:
            policy.after_plan(plan, nm + nc + nbg)  # ``adaptive`` scores the followed candidate on this plan
        return plan

    def _count(self, layer: int, hits: int, misses: int, copies: int, cpu: int, cpu_tokens: int, tokens: int) -> None:
        st = self.stats
        st.accesses[layer] += 1
        st.hits[layer] += hits
        st.misses[layer] += misses
        st.copies[layer] += copies
        st.bytes_copied[layer] += copies * self.expert_bytes
        st.cpu_experts[layer] += cpu
        st.cpu_expert_tokens[layer] += cpu_tokens
        st.gpu_expert_tokens[layer] += tokens - cpu_tokens  # every routed token runs somewhere

    def _copied(self, layer: int, new: list[int], slots: list[int], evicted: list[int]) -> None:
        """Residency and counters after copies outside an access (``kernels.apply_copies``: the same rule)."""
        doa = kernels.apply_copies(self._flags[layer], np.array(new, dtype=np.int64), np.array(evicted, dtype=np.int64),
                                   np.array(slots, dtype=np.int64), self.slot_expert)
        st = self.stats
        st.copies[layer] += len(new)
        st.bytes_copied[layer] += len(new) * self.expert_bytes
        if evicted:
            st.evictions[layer] += len(evicted)
            st.dead_on_arrival[layer] += doa

    def copy_layer_from(self, src: CacheState, layer: int) -> None:
        """Make ``layer`` hold the experts ``src`` holds there (same capacity); the stats are untouched.

        ``adaptive`` re-seeds a candidate's shadow cache from the real one when it stops following it
        (while followed, the real cache is its cache, and its shadow is not planned).
        """
        if src.capacities[layer] != self.capacities[layer]:
            raise ValueError(f"layer {layer} has {self.capacities[layer]} slots here, "
                             f"{src.capacities[layer]} in the source")
        self._drop(layer, self._resident[layer].nonzero()[0].tolist())
        self._flags[layer] = False  # nothing of the old contents survives, flags included
        want = src._resident[layer].nonzero()[0]
        slots = self._pop_free(layer, int(want.size))
        self._slot[layer, want] = slots
        self.slot_expert[slots] = want
        self._resident[layer, want] = True
        self._unhit[layer, want] = src._unhit[layer, want]

    def admit(self, layer: int, experts: Any, policy: CachePolicy) -> list[tuple[int, int, int | None]]:
        """Prefetch: copy ``experts`` (best first) into the layer's slots ahead of its access.

        Already resident experts are skipped (and protected); the rest take free slots, else evict
        the lowest-priority resident expert outside ``experts``; at most the layer's capacity is
        admitted. Counted as copies (bytes, evictions, dead-on-arrival) like demand copies; a
        prefetched expert is "not hit since copied" until its first hit. Returns the copies.
        """
        want = np.asarray(experts, dtype=np.int64).reshape(-1)[: self.capacities[layer]]
        if want.size == 0:
            return []
        resident = self._resident[layer]
        new = want[~resident[want]].tolist()
        if not new:
            return []
        n_free = int(self._free_n[layer])
        need = len(new) - n_free
        victims: list[int] = []
        if need > 0:  # the planner's eviction order, with ``experts`` protected as an access's requests are
            wanted = np.zeros(self.num_experts, dtype=np.int64)
            wanted[want] = 1
            victims = kernels.lowest_idle(resident, wanted, _float64(policy.priority_array(layer)), need).tolist()
            new = new[: n_free + len(victims)]
        nf = min(len(new), n_free)
        evicted = victims[: len(new) - nf]
        slots = self._pop_free(layer, nf) + self._release(layer, evicted)
        self._slot[layer, new] = slots
        self._copied(layer, new, slots, evicted)
        return list(zip(new, slots, [None] * nf + evicted))

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
            n = min(give, int(self._free_n[l])) if give > 0 else 0
            released += [SlotMove(l, slot, -1) for slot in self._pop_free(l, n)]
            give -= n
            if give > 0:
                resident = self._resident[l].nonzero()[0]
                prio = policy.priority_array(l) if policy is not None else np.zeros(self.num_experts)
                for e in resident[np.lexsort((resident, prio[resident]))][:give].tolist():
                    slot = self._release(l, [e])[0]
                    self._evict(l, e)
                    self.stats.rebalance_evictions[l] += 1
                    self.slot_expert[slot] = -1
                    released.append(SlotMove(l, slot, e))
        it = iter(released)
        for l, (old, cap) in enumerate(zip(self.capacities, caps)):
            for _ in range(cap - old):
                slot = next(it).slot
                self.slot_owner[slot] = l
                self._push_free(l, slot)
        self.capacities = caps
        if policy is not None:
            policy.set_capacities(self.capacities)
        return released

    def reconcile(self, slot_tags: np.ndarray) -> list[tuple[int, int]]:
        """Forget residency that the slots' contents do not back; returns the (layer, expert) dropped.

        ``plan`` records its copies before the executor performs them, so a copy (or a CPU expert,
        or anything else) failing mid-access leaves slots recorded with experts they do not hold.
        After such a failure the caller passes the cache's per-slot tags (``ExpertCache.slot_tags``,
        ``[total_slots, 2]`` of (layer, expert), -1 where no complete copy landed); every resident
        expert whose slot's tag disagrees becomes non-resident and its slot free again.
        """
        dropped = []
        for layer in range(self.num_layers):
            stale = [e for e, s in self.resident(layer).items() if tuple(slot_tags[s].tolist()) != (layer, e)]
            self._drop(layer, stale)
            dropped += [(layer, e) for e in stale]
        return dropped

    def check_invariants(self, slot_tags: np.ndarray | None = None) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests).

        With ``slot_tags`` (``ExpertCache.slot_tags``) it also checks that every resident expert's
        slot really holds that expert's weights, not another's or a half-finished copy.
        """
        seen: set[int] = set()
        for l in range(self.num_layers):
            owned = set(np.flatnonzero(self.slot_owner == l).tolist())
            slot_of = {e: s for e, s in enumerate(self._slot[l].tolist()) if s >= 0}
            used = set(slot_of.values())
            free = set(self._free[l, : self._free_n[l]].tolist())
            assert len(slot_of) <= self.capacities[l], f"layer {l} holds more than its capacity"
            assert len(owned) == self.capacities[l], f"layer {l} owns {len(owned)} slots, capacity {self.capacities[l]}"
            assert used | free == owned and not used & free, f"layer {l}: slot lists disagree with ownership"
            assert len(free) == self._free_n[l], f"layer {l}: a slot is free twice"
            assert len(used) == len(slot_of), f"layer {l}: two experts share a slot"
            assert not owned & seen, f"layer {l} shares slots with another layer"
            seen |= owned
            for e, s in slot_of.items():
                assert self.slot_expert[s] == e and self._resident[l, e], f"layer {l}: expert {e} slot mismatch"
                if slot_tags is not None:
                    tag = tuple(slot_tags[s].tolist())
                    held = "no complete expert" if tag[0] < 0 else f"layer {tag[0]} expert {tag[1]}"
                    assert tag == (l, e), f"layer {l}: slot {s} is recorded as expert {e} but holds {held}"
            assert int(self._resident[l].sum()) == len(slot_of), f"layer {l}: residency mask mismatch"
        assert sum(self.capacities) == self.total_slots == len(seen), "slot pool size changed"
