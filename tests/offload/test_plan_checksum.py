"""Golden checksums: the planner hot path may get faster, but never change a decision.

Each case replays a deterministic synthetic trace through a :class:`CacheController` and hashes
every plan (hits, copies with slots and victims, CPU experts, slot map, token counts), every
block-end rebalance (capacities and slot moves) and the final per-layer stats. The reference
digests were computed with the implementation before the hot-path optimisation; a mismatch means
some plan, counter or capacity differs from it.
"""

import hashlib

import numpy as np
import pytest
import torch

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.trace import OP_BLOCK_END, OP_FORWARD
from oled_hf.sim.synthetic import synthetic_trace
from tests.systems import system_for

TRACES = {
    # 64 experts, top-8, 32-token blocks (the ``small`` preset's routing shape), uneven layers
    "e64": dict(num_layers=4, num_experts=64, top_k=8, block_length=32, num_blocks=4, num_sequences=2,
                popularity_scale=[0.5, 1.0, 2.0, 3.0], seed=1),
    # LLaDA2.0-mini's expert count
    "e256": dict(num_layers=3, num_experts=256, top_k=8, block_length=32, num_blocks=3,
                 popularity_scale=[1.0, 2.0, 3.0], seed=2),
    # top-k not a power of two, an expert count not a power of two, batch of 2
    "e48k6": dict(num_layers=3, num_experts=48, top_k=6, block_length=16, num_blocks=3, batch=2,
                  popularity_scale=[0.5, 1.5, 3.0], seed=3),
}
_TRACE_CACHE: dict = {}


def _trace(name):
    if name not in _TRACE_CACHE:
        _TRACE_CACHE[name] = synthetic_trace(hidden_size=512, moe_intermediate_size=128, **TRACES[name])
    return _TRACE_CACHE[name]


def plan_digest(trace, policy, cache_size, cpu_compute, layer_adaptive=True, oled_frequency_weight=0.0,
                oled_background_copies=0, system=None):
    """Replay ``trace``; sha256 over every plan, rebalance and the final stats (first 16 hex digits).

    Even forwards feed torch tensors (what the live executor passes), odd ones NumPy arrays (replay).
    The references were computed before the planner was optimised, with OLED's stability rule
    alone (its slow popularity term came later), hence ``oled_frequency_weight=0`` by default, and
    without OLED's reuse copies (planner rule 4, later too), hence ``oled_background_copies=0``.
    """
    system = system if system is not None else system_for(policy, layer_adaptive)  # composed, or a legacy name's
    config = OffloadConfig(cache_size=cache_size, system=system, cpu_compute=cpu_compute,
                           oled_frequency_weight=oled_frequency_weight,
                           oled_background_copies=oled_background_copies)
    ctrl = CacheController(config, trace.num_layers, trace.num_experts, CostModel.h200_pcie5(512, 128))
    h = hashlib.sha256()
    forwards = 0
    for op, idx in trace.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            ids, weights = trace.routing(idx)
            for layer in range(trace.num_layers):
                i, w = np.ascontiguousarray(ids[layer]), np.ascontiguousarray(weights[layer])
                if forwards % 2 == 0:
                    i, w = torch.from_numpy(i), torch.from_numpy(w)
                p = ctrl.plan(layer, i, w)
                h.update(repr((p.layer, p.hits, p.copies, p.cpu, sorted(p.slot_of.items()),
                               np.asarray(p.counts).tolist())).encode())
            forwards += 1
        else:
            trace.deliver(ctrl, op, idx)
        if op == OP_BLOCK_END:
            h.update(repr((list(ctrl.capacities), [tuple(m) for m in ctrl.last_moves])).encode())
    ctrl.state.check_invariants()
    h.update(repr(ctrl.stats.to_dict(per_layer=True)).encode())
    return h.hexdigest()[:16]


CASES = [
    (t, p, c, cpu, la)
    for t, sizes in (("e64", (26, 6)), ("e256", (100, 40)))
    for p in ("oled", "lru", "lfu", "static", "tide")
    for c in sizes
    for cpu in ("auto", "off")
    for la in (True,)
] + [("e64", p, 26, "auto", False) for p in ("oled", "lru", "tide")] + [
    ("e48k6", p, c, cpu, True) for p in ("oled", "lru", "static") for c in (18, 5) for cpu in ("auto", "off")
]

# computed with the implementation before the hot-path optimisation (see module docstring).
# Re-pinned once on purpose (issue 24): the dispatcher charges the CPU overhead once per CPU batch
# (one grouped call per layer access), not per CPU-computed expert. Every CPU-on ("auto") case and
# the four reuse cases changed; every copy-only ("off") case kept its digest; with
# ``cpu_overhead_s = 0`` (where both rules agree) all 59 digests equalled the previous code's.
REFERENCE = {
    'e64-oled-c26-auto': 'e72512e85bcaaee4',
    'e64-oled-c26-off': 'd175ab19956f5821',
    'e64-oled-c6-auto': '05339c9cb6c12788',
    'e64-oled-c6-off': '34d3e130318c41c6',
    'e64-lru-c26-auto': '71f717b92f310335',
    'e64-lru-c26-off': '2d3a70192c15abbe',
    'e64-lru-c6-auto': '3efa314ba2781c5d',
    'e64-lru-c6-off': '24fa3d7d14ab5acc',
    'e64-lfu-c26-auto': 'd4d015e524712d67',
    'e64-lfu-c26-off': '4139ec627a282f20',
    'e64-lfu-c6-auto': '12b2740ce4666707',
    'e64-lfu-c6-off': '4925b87042663611',
    'e64-static-c26-auto': '8d59b3cb5805fc2b',
    'e64-static-c26-off': 'f64fd4937a462cda',
    'e64-static-c6-auto': '04c755ad800415b7',
    'e64-static-c6-off': '0c3390bfe5cb58f5',
    'e64-tide-c26-auto': '930b80ad4930ba0e',
    'e64-tide-c26-off': '0d03ce2748ac0bec',
    'e64-tide-c6-auto': 'a3be0a2a634f1812',
    'e64-tide-c6-off': '8cec84ad7bc966ca',
    'e256-oled-c100-auto': 'fad9593977bbf251',
    'e256-oled-c100-off': '20d983588fea9936',
    'e256-oled-c40-auto': 'c54b19b104251400',
    'e256-oled-c40-off': '2a2327d40da3923d',
    'e256-lru-c100-auto': '1dde52254ddaacd6',
    'e256-lru-c100-off': '3338b3dbcf23d04c',
    'e256-lru-c40-auto': 'f9590e4d3fc1b57a',
    'e256-lru-c40-off': 'fd49426475fb6ccb',
    'e256-lfu-c100-auto': '7dc5a71cd075831b',
    'e256-lfu-c100-off': 'e791e00bb7000d17',
    'e256-lfu-c40-auto': '6aece111611f643a',
    'e256-lfu-c40-off': 'd6713726edd62bc0',
    'e256-static-c100-auto': 'f0a9221b1d62bdcd',
    'e256-static-c100-off': '2f1f45720c5f7336',
    'e256-static-c40-auto': '03d2705db40a782e',
    'e256-static-c40-off': '0d1613e49a9186e3',
    'e256-tide-c100-auto': 'be4fe9547adff3cb',
    'e256-tide-c100-off': 'f12ba5da3eb08c39',
    'e256-tide-c40-auto': '1892484746ce9e56',
    'e256-tide-c40-off': 'b1690f5b460b091c',
    'e64-oled-c26-auto-fixed': 'a5b4299706ef3dfb',
    'e64-lru-c26-auto-fixed': '196b68d979defe9b',
    'e64-tide-c26-auto-fixed': '8048d1a19f0b9788',
    'e48k6-oled-c18-auto': '634135f6dfa6b425',
    'e48k6-oled-c18-off': 'ef470464ba8dc078',
    'e48k6-oled-c5-auto': '9583622414dd0df9',
    'e48k6-oled-c5-off': '8bd22435b854298f',
    'e48k6-lru-c18-auto': 'ff85882a576e45ad',
    'e48k6-lru-c18-off': 'd08b4580aa07c85a',
    'e48k6-lru-c5-auto': 'facb37c235139c38',
    'e48k6-lru-c5-off': '669a90ae01729fcc',
    'e48k6-static-c18-auto': 'dce9216f7d60b4d4',
    'e48k6-static-c18-off': 'de81369334f205ae',
    'e48k6-static-c5-auto': '24f1cf9586a8148b',
    'e48k6-static-c5-off': 'c08ca9c4a5978ddd',
}


def _id(case):
    t, p, c, cpu, la = case
    return f"{t}-{p}-c{c}-{cpu}" + ("" if la else "-fixed")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_plans_match_reference(case):
    t, p, c, cpu, la = case
    assert plan_digest(_trace(t), p, c, cpu, la) == REFERENCE[_id(case)]


# OLED's defaults since reuse copies (planner rule 4): 2 per access, no slow popularity term.
# These pin the new decisions; the references above keep the earlier rule (background copies off).
REUSE_CASES = [("e64", 26, "auto"), ("e64", 6, "auto"), ("e256", 40, "auto"), ("e48k6", 5, "on")]
REUSE_REFERENCE = {
    'e64-c26-auto': 'c20c729b689d3f87',
    'e64-c6-auto': '18a228b12031d874',
    'e256-c40-auto': '80ee90f7a13eb3f8',
    'e48k6-c5-on': '9da13336e708a38e',
}


@pytest.mark.parametrize("case", REUSE_CASES, ids=lambda c: f"{c[0]}-oled-c{c[1]}-{c[2]}-reuse")
def test_oled_reuse_copy_plans_match_reference(case):
    t, c, cpu = case
    got = plan_digest(_trace(t), "oled", c, cpu, oled_background_copies=2)
    assert got == REUSE_REFERENCE[f"{t}-c{c}-{cpu}"]
    assert got != plan_digest(_trace(t), "oled", c, cpu)  # the rule changes decisions on every case


# the learned retention part: its decisions pinned when it was introduced
LEARNED_CASES = [("e64", "learned+cpu+reuse+adaptive", 26, "auto"), ("e64", "learned+copy+uniform", 6, "off"),
                 ("e256", "learned+cpu+reuse+adaptive", 40, "auto"), ("e48k6", "learned+cpu+uniform", 5, "on")]
LEARNED_REFERENCE = {
    'e64-learned+cpu+reuse+adaptive-c26-auto': '07dea5e65c05b406',
    'e64-learned+copy+uniform-c6-off': '291aff9e1d1f99c7',
    'e256-learned+cpu+reuse+adaptive-c40-auto': '16984c3e454d2479',
    'e48k6-learned+cpu+uniform-c5-on': 'cf39c195088c63be',
}


@pytest.mark.parametrize("case", LEARNED_CASES, ids=lambda c: f"{c[0]}-{c[1]}-c{c[2]}-{c[3]}")
def test_learned_plans_match_reference(case):
    t, system, c, cpu = case
    assert plan_digest(_trace(t), "learned", c, cpu, system=system) == LEARNED_REFERENCE[f"{t}-{system}-c{c}-{cpu}"]


if __name__ == "__main__":  # print the reference table (run once, before changing the planner)
    torch.set_num_threads(1)
    for case in CASES:
        t, p, c, cpu, la = case
        print(f"    {_id(case)!r}: {plan_digest(_trace(t), p, c, cpu, la)!r},")
