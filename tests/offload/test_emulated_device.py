"""The emulated asynchronous device: its copies, events and the synchronisation the slot pool needs.

Each hazard test fails when the synchronisation it names is removed: the emulated copy writes its
bytes only at the end of its transfer time, so a reader that does not wait reads the slot's
previous bytes, and a queued prefetch that is not superseded lands after the demand copy that
replaced it.
"""

import threading
import time

import numpy as np
import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig
from oled_hf.offload.cache import ExpertCache
from oled_hf.offload.device import DEMAND, PREFETCH, EmulatedDevice, default_bandwidth
from oled_hf.offload.store import ExpertStore
from tests.offload.stub_store import StubStore


def _cache(seconds_per_copy=0.02):
    store = StubStore(3)
    device = EmulatedDevice(bandwidth=store.expert_bytes / seconds_per_copy, latency=0.0)
    return ExpertCache(store, 4, torch.device("cpu"), device), device


def _value(cache, slot):
    return float(cache.pool[slot, 0])


def test_a_copy_takes_its_link_time_and_reading_waits_for_it():
    cache, device = _cache(0.03)
    cache.pool.zero_()
    start = time.perf_counter()
    cache.load(0, 0, 2)
    assert time.perf_counter() - start < 0.02  # issued, not waited for
    assert not cache.ready[0].event.query()
    cache.wait_ready([0])  # use before the copy completes: compute must wait for it
    assert time.perf_counter() - start >= 0.029
    assert _value(cache, 0) == 3.0
    device.close()


def test_a_copy_into_a_slot_whose_queued_prefetch_it_replaces_wins():
    cache, device = _cache(0.02)
    cache.pool.zero_()
    cache.load(3, 0, 0)  # keeps the copy worker busy
    cache.load(0, 0, 1, priority=PREFETCH)  # queued behind it, low priority
    cache.load(0, 0, 2, priority=DEMAND)  # the slot is evicted and refilled before the prefetch ran
    device.synchronize()
    time.sleep(0.05)  # a prefetch that was not cancelled would land now, over the newer expert
    assert _value(cache, 0) == 3.0 and device.cancelled == 1
    device.close()


def test_a_copy_into_a_slot_whose_copy_is_in_flight_lands_after_it():
    cache, device = _cache(0.02)
    cache.pool.zero_()
    cache.load(0, 0, 1, priority=PREFETCH)
    time.sleep(0.005)  # the prefetch has started: it cannot be cancelled, the new copy waits for it
    cache.load(0, 0, 2)
    cache.wait_ready([0])
    assert _value(cache, 0) == 3.0 and device.cancelled == 0
    device.close()


def test_demand_copies_overtake_queued_prefetches_and_a_needed_prefetch_is_promoted():
    cache, device = _cache(0.02)
    cache.load(3, 0, 0)  # running
    cache.load(0, 0, 0, priority=PREFETCH)
    cache.load(1, 0, 1, priority=PREFETCH)
    cache.load(2, 0, 2)  # a demand copy issued after both prefetches
    cache.wait_ready([1])  # the demand path needs the second prefetch now: it stops yielding
    assert _value(cache, 1) == 2.0
    waiting = cache.ready[0].event
    assert not waiting.query()
    cache.wait_ready([2])
    assert _value(cache, 2) == 3.0
    assert not waiting.query()  # the demand copy went before the prefetch queued ahead of it
    waiting.synchronize()
    assert _value(cache, 0) == 1.0
    device.close()


def test_a_started_prefetch_wave_yields_its_unstarted_copies_to_a_demand_copy():
    """The worker takes a wave at a time (one wake-up, every copy landing at the wave's end), but a prefetch
    wave still yields to a demand copy copy by copy, as on a copy engine: the copy on the link finishes, the
    demand copy goes next, the rest of the prefetch wave after it."""
    cache, device = _cache(0.05)
    cache.pool.zero_()
    cache.load_wave([0, 1, 2], 0, [0, 1, 2], priority=PREFETCH)
    time.sleep(0.01)  # the wave's first copy is on the link
    cache.load_wave([3], 0, [2])
    prefetch, demand = cache.ready[0].event, cache.ready[3].event
    demand.synchronize()
    first, second, third = prefetch.jobs
    assert first.lands < demand.jobs[0].lands < second.lands < third.lands
    assert demand.jobs[0].lands - first.lands == pytest.approx(0.05, abs=1e-6)  # next on the link
    assert not prefetch.query() and _value(cache, 3) == 3.0
    cache.wait_ready([0, 1, 2])
    assert [_value(cache, s) for s in range(3)] == [1.0, 2.0, 3.0]
    device.close()


@pytest.mark.parametrize("kw, match", [
    (dict(bandwidth=0), r"bandwidth=0 bytes/s \(0 GB/s\) is invalid"),
    (dict(bandwidth=1e-300 * 1e9), r"bandwidth=1e-291 bytes/s \(1e-300 GB/s\) is invalid: must be a finite number of "
                                   r"bytes/s >= 1000 \(1e-06 GB/s\)"),
    (dict(bandwidth=-1.0), "bandwidth=-1.0 bytes/s .* is invalid"),
    (dict(bandwidth=float("nan")), "bandwidth=nan bytes/s is invalid"),
    (dict(bandwidth=1e9, latency=-1e-6), "latency=-1e-06 is invalid"),
])
def test_a_bad_link_is_one_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        EmulatedDevice(**kw)


def test_the_pool_is_counted_against_the_emulated_memory():
    device = EmulatedDevice(1e9, memory_bytes=1000)
    with pytest.raises(ValueError, match="has 1000 bytes free of 1000; a pool of 20 expert slots needs 1920"):
        device.allocate(20, 24, torch.float32)
    assert device.allocate(10, 24, torch.float32).shape == (10, 24) and device.allocated == 960
    device.close()


def test_the_default_link_copies_an_expert_in_the_time_pcie5_copies_minis():
    assert default_bandwidth(3 * 2048 * 512 * 2) == 50e9
    assert 3 * 128 * 16 * 4 / default_bandwidth(3 * 128 * 16 * 4) == pytest.approx(3 * 2048 * 512 * 2 / 50e9)


# ---- a model on the emulated device --------------------------------------------------------------

SLOW = dict(device="emulated", emulated_bandwidth_gbps=0.1, emulated_latency_us=0.0)  # ~0.25 ms a tiny expert
PROMPTS = ("hello there", "tell me about the sea and the ships")


@pytest.fixture(scope="module")
def prompt_ids(tiny_tokenizer):
    return [tiny_tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)["input_ids"] for t in PROMPTS]


@pytest.fixture(scope="module")
def resident_tokens(tiny_model, prompt_ids):
    return [tiny_model.generate(ids, max_new_tokens=16, block_length=8) for ids in prompt_ids]


def _generate(model, prompt_ids):
    return [model.generate(ids, max_new_tokens=16, block_length=8) for ids in prompt_ids]


@pytest.mark.parametrize("system, cpu", [
    ("oled", "on"), ("oled+previous", "on"), ("lru-full", "on"), ("lru+previous+copy+uniform", "off"),
    ("lru+matrix+copy+uniform", "off"),
])
def test_every_system_gives_the_resident_tokens_on_the_emulated_device(tiny_path, prompt_ids, resident_tokens,
                                                                        system, cpu):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(
        tiny_path, offload_config=OffloadConfig(cache_size=3, system=system, cpu_compute=cpu, **SLOW)).eval()
    got = _generate(model, prompt_ids)
    assert all(torch.equal(a, b) for a, b in zip(got, resident_tokens))
    rt = model._offload_runtime
    assert rt.cache.backend.name == "emulated" and model.offload_stats()["device"] == "emulated"
    rt.controller.state.check_invariants(rt.cache.slot_tags)
    rt.cache.backend.close()


def test_prefetches_are_issued_live_and_the_next_layer_waits_for_them(tiny_path, prompt_ids, resident_tokens):
    # a fast link leaves idle copy time, so the capped prefetcher issues copies; each must land before use
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
        cache_size=4, system="lru+previous+copy+uniform", cpu_compute="off", device="emulated",
        emulated_bandwidth_gbps=0.05, emulated_latency_us=0.0)).eval()
    rt = model._offload_runtime
    rt.cost_model.nonexpert_s_per_layer = 1e-3  # believed idle time: room for prefetches in every layer
    got = _generate(model, prompt_ids)
    assert all(torch.equal(a, b) for a, b in zip(got, resident_tokens))
    assert model.offload_stats()["prefetches"] > 0
    rt.cache.backend.close()


def test_a_cpu_computed_miss_racing_its_own_admission(tiny_path, prompt_ids, resident_tokens):
    """cpu+reuse: a miss computed on the CPU (in the worker thread) while its reuse copy is in flight."""
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
        cache_size=3, system="lru+cpu+reuse+uniform", cpu_compute="on", oled_background_copies=4, **SLOW)).eval()
    rt = model._offload_runtime
    rt.overlap_cpu = True  # the CPU path runs beside the device work, as on a GPU
    got = _generate(model, prompt_ids)
    assert all(torch.equal(a, b) for a, b in zip(got, resident_tokens))
    assert model.offload_stats()["total"]["cpu_expert_tokens"] > 0
    rt.cache.backend.close()


def test_three_threads_generating_at_once_on_the_emulated_device(tiny_path, prompt_ids, resident_tokens):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
        cache_size=3, system="oled+previous", cpu_compute="on", **SLOW)).eval()
    results: dict[int, list] = {}

    def work(i):
        results[i] = _generate(model, prompt_ids[i % 2:] + prompt_ids[:i % 2])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for i in range(3):
        want = resident_tokens[i % 2:] + resident_tokens[:i % 2]
        assert all(torch.equal(a, b) for a, b in zip(results[i], want))
    rt = model._offload_runtime
    rt.controller.state.check_invariants(rt.cache.slot_tags)
    rt.cache.backend.close()


@pytest.mark.parametrize("kw, match", [
    (dict(device="tpu"), "device='tpu' is unknown; allowed: auto, emulated"),
    (dict(device="emulated", emulated_bandwidth_gbps=0), "emulated_bandwidth_gbps=0 is invalid"),
    (dict(device="emulated", emulated_bandwidth_gbps=float("nan")), "emulated_bandwidth_gbps=nan is invalid"),
    (dict(device="emulated", emulated_latency_us=-1), "emulated_latency_us=-1 is invalid"),
    (dict(emulated_bandwidth_gbps=1.0), "apply to device='emulated' only"),
])
def test_bad_emulated_fields_are_refused_by_the_config(kw, match):
    with pytest.raises(ValueError, match=match):
        OffloadConfig(cache_size=2, **kw)


def test_an_emulated_memory_below_the_per_layer_minimum_is_refused_before_loading(tiny_path, monkeypatch):
    read = []
    monkeypatch.setattr(ExpertStore, "from_safetensors", lambda *a, **k: read.append(1))
    with pytest.raises(ValueError, match="emulated_memory=100 .* is below the per-layer minimum"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
            cache_size=2, device="emulated", emulated_memory=100))
    assert not read


def test_the_emulated_pool_never_exceeds_its_memory(tiny_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
        cache_size=2, device="emulated", emulated_memory="1MiB")).eval()
    rt = model._offload_runtime
    assert rt.cache.backend.allocated == rt.cache.pool_bytes <= 2**20
    assert np.all(rt.cache.slot_tags[:, 0] >= -1)
    rt.cache.backend.close()



def test_back_to_back_copies_keep_the_links_pace():
    """A copy starts on the link's schedule, not when the worker woke up: sleeps overshoot by tens of us
    each, and charged to the next copy they slowed 30 back-to-back copies to about half the bandwidth."""
    device = EmulatedDevice(bandwidth=1e6 / 0.5e-3, latency=0.0)  # 1 MB in 0.5 ms
    elapsed = []  # the fastest of three rounds: a busy host (CI runs tests two at a time) delays a round, a
    for _ in range(3):  # worker that charges its oversleep to the next copy delays every one
        landed, busy = [], device.busy_s
        start = time.perf_counter()
        events = [device.copy([0], [lambda _, landed=landed: landed.append(1)], 1_000_000) for _ in range(30)]
        events[-1].synchronize()
        elapsed.append(time.perf_counter() - start)
        assert len(landed) == 30 and device.busy_s - busy == pytest.approx(30 * 0.5e-3)
        assert 30 * 0.5e-3 <= elapsed[-1]
        assert device.blocking_waits == 1 and device.wake_s >= 0
        assert device.link.landed_waves == 30 and 0 <= device.land_lag_s < 0.5e-3 * 30  # one wave a copy here
        device.reset_counters()
        assert device.link.landed_waves == 0 and device.land_lag_s == 0 and device.blocking_waits == 0
    assert min(elapsed) < 30 * 0.5e-3 * 1.15 + 2e-3, elapsed
    device.close()


# ---- a link that cannot work, a worker that dies, a copy that fails, a model that is dropped --------------

def _within(seconds, fn):
    """``fn()``'s result, or a test failure if it has not returned after ``seconds`` (instead of a hung suite)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (hung)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.parametrize("gbps, match", [
    ("1e-300", r"emulated bandwidth=1e-291 bytes/s \(1e-300 GB/s\) is invalid: must be a finite number of bytes/s "
               r">= 1000"),
    ("1e-9", r"emulated bandwidth=1.0 bytes/s \(1e-09 GB/s\) is invalid"),
    ("1e-5", r"the emulated link would take 9.83 s to copy one expert of 98304 bytes at 1e-05 GB/s; allowed: at "
             r"most 1 s per copy"),
])
def test_an_absurd_emulated_bandwidth_is_one_line_and_exit_2(tiny_path, capsys, gbps, match):
    """A copy thread that died on OverflowError (1e-300) or copies of hours (1e-9) hung the command."""
    import re

    from oled_hf.cli.main import main

    code = _within(60, lambda: main(["benchmark", "--model", str(tiny_path), "--device", "emulated",
                                     "--emulated-bandwidth-gbps", gbps, "--cache-size", "4", "--system", "lru",
                                     "--max-new-tokens", "8", "--runs", "1", "--warmup-runs", "0", "--quiet"]))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("oled-moe benchmark: error:")]
    assert code == 2 and len(lines) == 1 and re.search(match, lines[0]), err


def test_a_dead_copy_worker_fails_the_waiting_call_and_every_later_copy(monkeypatch):
    from oled_hf.offload import emulated

    device = EmulatedDevice(bandwidth=1e9, latency=0.0)

    def overflow(self, nbytes):  # as a link of 1e-300 GB/s did, in the worker's time arithmetic
        raise OverflowError("timestamp too large to convert to C _PyTime_t")

    monkeypatch.setattr(emulated.CopyLink, "copy_seconds", overflow)
    event = device.copy([0], [lambda _: None], 10**9)  # the worker schedules it, and dies
    with pytest.raises(emulated.CopyFailed, match=r"slot 0 failed: the copy worker died \(OverflowError"):
        _within(10, event.synchronize)
    with pytest.raises(emulated.CopyFailed, match="the emulated copy worker died"):
        device.copy([1], [lambda _: None], 8)
    device.close()


def test_a_failed_emulated_copy_fails_the_generate_and_the_next_gives_the_resident_tokens(tiny_path, prompt_ids,
                                                                                          resident_tokens):
    """The copy worker's exception used to be kept in ``failures`` only: compute went on with the slot's old bytes."""
    from oled_hf.offload.emulated import CopyFailed

    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
        cache_size=3, system="lru", cpu_compute="off", **SLOW)).eval()
    rt = model._offload_runtime
    copy, calls = rt.cache._copy, [0]

    def failing(dst, layer, expert, non_blocking):
        calls[0] += 1
        if calls[0] == 7:
            raise RuntimeError("injected: the link dropped this copy")
        copy(dst, layer, expert, non_blocking)

    rt.cache._copy = failing
    with pytest.raises(CopyFailed, match="injected: the link dropped this copy"):
        _generate(model, prompt_ids)
    rt.controller.state.check_invariants(rt.cache.slot_tags)
    assert all(torch.equal(a, b) for a, b in zip(_generate(model, prompt_ids), resident_tokens))
    rt.controller.state.check_invariants(rt.cache.slot_tags)
    rt.cache.backend.close()


def test_dropped_emulated_models_leave_no_copy_thread(tiny_path, prompt_ids):
    import gc

    def copy_threads():
        return sum(t.name == "oled-emulated-copy" and t.is_alive() for t in threading.enumerate())

    gc.collect()
    before = copy_threads()
    for _ in range(4):
        model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(
            cache_size=3, system="lru", cpu_compute="off", **SLOW)).eval()
        model.generate(prompt_ids[0], max_new_tokens=8, block_length=8)
        del model
    gc.collect()
    deadline = time.perf_counter() + 5
    while copy_threads() > before and time.perf_counter() < deadline:
        time.sleep(0.02)
    assert copy_threads() == before


def test_the_emulated_device_refuses_an_order_cuda_would_race_on():
    """A read before the wait for its copy, a copy over a slot a kernel read without waiting for it: each raises."""
    from oled_hf.offload.ordering import OrderViolation

    cache, device = _cache(0.001)
    cache.load(0, 0, 1)
    with pytest.raises(OrderViolation, match="reads slot 0 before the copy into it"):
        device.compute_event([0])  # a kernel marked as reading slot 0, nobody waited for its copy
    cache, device = _cache(0.001)
    cache.load(1, 0, 1)
    cache.wait_ready([1])
    cache.mark_used_many([1])
    cache.last.clear()  # forget the kernel: the next copy into slot 1 would not wait for it
    with pytest.raises(OrderViolation, match="copy into slot 1 on the demand stream may overwrite it while a kernel"):
        cache.load(1, 0, 2)
    device.close()


def test_the_copy_worker_lands_a_copy_while_the_host_runs_python():
    """At the interpreter's default 5 ms switch interval the worker waited for the GIL as long as the host ran
    Python (its planning), and copies landed late by that much: live copy waits no replay predicts."""
    device = EmulatedDevice(bandwidth=1e6 / 2e-4, latency=0.0)  # 1 MB in 0.2 ms
    landed = 0
    for _ in range(20):
        event = device.copy([0], [lambda _: None], 1_000_000)
        start, x = time.perf_counter(), 0
        while time.perf_counter() - start < 0.004:  # 4 ms of pure Python: the GIL is never released
            x += 1
        landed += event.query()
        event.synchronize()
    device.close()
    assert landed >= 10, landed  # at 5 ms none landed


def test_the_switch_interval_is_restored_once_the_last_emulated_device_closes():
    import sys

    from oled_hf.offload.emulated import SWITCH, SWITCH_INTERVAL_S

    open_before, interval_before = SWITCH.open, sys.getswitchinterval()
    a, b = EmulatedDevice(1e9), EmulatedDevice(1e9)
    assert sys.getswitchinterval() == pytest.approx(min(interval_before, SWITCH_INTERVAL_S))
    a.close()
    a.close()  # twice: counted once
    assert SWITCH.open == open_before + 1
    b.close()
    assert SWITCH.open == open_before
    if open_before == 0:
        assert sys.getswitchinterval() == pytest.approx(interval_before)
