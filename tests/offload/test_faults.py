"""A copy or a CPU expert that fails mid-forward leaves the cache consistent with its slots' contents.

Every policy, a fault injected at the n-th copy (free slot, eviction, streaming through a slot) or
in the n-th CPU expert: generate raises the fault, ``check_invariants`` (which compares the
bookkeeping with the per-slot tags the copies write) passes, and the next generate gives exactly
the resident model's tokens.
"""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig
from tests.systems import system_for

POLICIES = ["oled", "lru", "lfu", "static", "tide"]
PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8, 77, 120, 33, 6, 401, 19]])
GEN = dict(max_new_tokens=24, block_length=8, threshold=0.9)
# (cache_size, cpu_compute, what fails, at which call): tiny has 32 experts per layer, top-4.
CASES = [(2, "off", "copy", 5), (8, "off", "copy", 40), (8, "on", "cpu", 3)]


class InjectedFault(RuntimeError):
    pass


def _fail_on_call(fn, n):
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise InjectedFault(f"injected failure on call {n}")
        return fn(*args, **kwargs)

    return wrapped


def _counted(fn, calls, n):
    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise InjectedFault(f"injected failure on CPU-expert call {n}")
        return fn(*args, **kwargs)

    return wrapped


@pytest.fixture(scope="module")
def reference(tiny_model):
    return tiny_model.generate(PROMPT, **GEN)


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_copy_or_cpu_expert_keeps_cache_consistent(tiny_path, reference, policy):
    for cache_size, cpu, target, n in CASES:
        model = OledLLaDA2ForDiffusionLM.from_pretrained(
            tiny_path, offload_config=OffloadConfig(cache_size=cache_size, system=system_for(policy), cpu_compute=cpu,
                                                  calibrate=False)).eval()  # timing-free dispatch
        rt = model._offload_runtime
        if target == "copy":
            original = rt.cache._copy
            rt.cache._copy = _fail_on_call(original, n)
        else:  # the n-th layer call computing CPU experts, whichever MoE layer it is
            calls = [0]
            for block in model.moe_blocks():
                block.experts_executor._cpu_experts = _counted(block.experts_executor._cpu_experts, calls, n)
        with pytest.raises(InjectedFault):
            model.generate(PROMPT, **GEN)
        if target == "copy":
            rt.cache._copy = original
        else:
            for block in model.moe_blocks():
                del block.experts_executor._cpu_experts  # back to the class's method
        rt.controller.state.check_invariants(rt.cache.slot_tags)
        assert torch.equal(model.generate(PROMPT, **GEN), reference), (policy, cache_size, cpu, target, n)
        rt.controller.state.check_invariants(rt.cache.slot_tags)


def test_check_invariants_catches_a_slot_holding_another_expert(tiny_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(
        tiny_path, offload_config=OffloadConfig(cache_size=4, cpu_compute="off")).eval()
    rt = model._offload_runtime
    model.generate(PROMPT, **GEN)
    state = rt.controller.state
    state.check_invariants(rt.cache.slot_tags)
    expert, slot = next(iter(state.resident(0).items()))
    other = (expert + 1) % model.config.num_experts
    rt.cache.load(slot, 0, other)  # bytes of another expert land where the bookkeeping says `expert` is
    with pytest.raises(AssertionError, match=f"layer 0: slot {slot} is recorded as expert {expert} but holds "
                                             f"layer 0 expert {other}"):
        state.check_invariants(rt.cache.slot_tags)
