"""Host synchronisations per MoE layer per forward, counted by a shim on the CUDA backend's CPU fake.

Budget (issue 66): 0 when the layer holds every expert; at most 1 (its routing) when it is planned and
computes nothing on the CPU; at most 2 with CPU misses (the routing, then the CPU experts' inputs, read
by the CPU worker while the device computes). The copy waves of a layer are issued before any host-side
wait after its routing, and ``offload_stats()`` reports the same count as the shim.
"""

import pytest
import torch

from tests.offload.cuda_fake import SyncShim, fake_cuda_model

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8, 77, 120, 33, 6]])
GEN = dict(max_new_tokens=16, block_length=8, threshold=0.9)


def fill_every_layer(model) -> None:
    """One access per MoE layer requesting every expert: every layer then holds all of them (stats reset)."""
    rt, cfg = model._offload_runtime, model.config
    ids = torch.arange(cfg.num_experts).reshape(-1, cfg.num_experts_per_tok)
    x = torch.zeros(ids.shape[0], cfg.hidden_size, dtype=model.dtype)
    weights = torch.full(ids.shape, 1.0 / ids.shape[1])
    with torch.no_grad():
        for block, executor in zip(model.moe_blocks(), rt.executors):
            executor(block, x, ids, weights)
    rt.reset_stats()


def _counted_generate(model, cuda, monkeypatch):
    shim = SyncShim(cuda)
    shim.watch_layers(monkeypatch)
    calls: dict[int, int] = {}
    call = type(model._offload_runtime.executors[0]).__call__

    def counting(self_, *args, **kwargs):
        calls[self_.moe_index] = calls.get(self_.moe_index, 0) + 1
        return call(self_, *args, **kwargs)

    monkeypatch.setattr(type(model._offload_runtime.executors[0]), "__call__", counting)
    with shim:
        out = model.generate(PROMPT, **GEN)
    shim.collect()
    return out, shim, calls


@pytest.mark.parametrize("case, cache_size, cpu, budget", [
    ("all cached", 32, "off", 0),
    ("planned, no CPU misses", 4, "off", 1),
    ("planned, CPU misses", 4, "on", 2),
])
def test_host_syncs_per_layer_stay_within_budget(tiny_path, tiny_model, monkeypatch, case, cache_size, cpu, budget):
    model, cuda = fake_cuda_model(tiny_path, monkeypatch, cache_size=cache_size, system="oled", cpu_compute=cpu)
    if case == "all cached":
        fill_every_layer(model)
    reference = tiny_model.generate(PROMPT, **GEN)
    cuda.log.clear()
    out, shim, calls = _counted_generate(model, cuda, monkeypatch)
    assert torch.equal(out, reference)
    layers = model.config.num_moe_layers
    assert sorted(calls) == list(range(layers))
    for layer in range(layers):
        assert shim.counts[layer] <= budget * calls[layer], (case, layer, shim.what)
    # between the layers only the retention policy reads the decoder's iteration event (once a forward, after the
    # decoder itself synchronised): the deferred routing of the all-hits layers is read without a wait
    assert all(what.split(" at ")[1].startswith("policies/") for layer, what in shim.what if layer == -1), shim.what
    stats = model.offload_stats()
    assert [row["host_syncs"] for row in stats["layers"]] == [shim.counts[layer] for layer in range(layers)]
    assert stats["total"]["host_syncs"] == sum(shim.counts[layer] for layer in range(layers))
    if case == "planned, CPU misses":
        assert stats["total"]["cpu_expert_tokens"] > 0 and max(shim.counts.values()) > sum(calls.values()) / layers
    if case == "all cached":
        assert stats["total"]["misses"] == 0 and stats["total"]["host_syncs"] == 0
    else:
        assert stats["total"]["host_syncs"] >= sum(calls.values())  # every planned access reads its routing


def test_copies_go_before_the_layers_waits_and_results_come_back_pinned(tiny_path, monkeypatch):
    """After the routing read, a layer issues its first copy wave before anything else waits on the host; the
    CPU experts' inputs and outputs move through pinned buffers (non_blocking, an event each), never blocking."""
    model, cuda = fake_cuda_model(tiny_path, monkeypatch, cache_size=4, system="oled", cpu_compute="on")
    shim = SyncShim(cuda)
    shim.watch_layers(monkeypatch)
    marks = []
    call = type(model._offload_runtime.executors[0]).__call__

    def marked(self_, *args, **kwargs):
        marks.append(len(cuda.log))
        return call(self_, *args, **kwargs)

    monkeypatch.setattr(type(model._offload_runtime.executors[0]), "__call__", marked)
    with shim:
        model.generate(PROMPT, **GEN)
    shim.collect()
    checked = 0
    for a, b in zip(marks, marks[1:] + [len(cuda.log)]):
        ops = cuda.log[a:b]
        main_waits = [i for i, op in enumerate(ops) if op[0] == "host_wait" and op[2]]
        worker_waits = [i for i, op in enumerate(ops) if op[0] == "host_wait" and not op[2]]
        assert len(main_waits) == 1 and len(worker_waits) <= 1  # the routing; the CPU inputs, in the worker
        copies = [i for i, op in enumerate(ops) if op[0] == "copy"]
        if copies and worker_waits:
            checked += 1
    assert checked > 0
    assert all(what.startswith("event ") for layer, what in shim.what if layer >= 0), shim.what  # no blocking copy
    assert model._offload_runtime.cache.backend.uploads.waits == 0  # the upload ring never made the host wait
