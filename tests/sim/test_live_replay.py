"""A trace recorded from a live offloaded run replays to exactly the counters the run kept."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig
from oled_hf.offload.system import parse_system
from oled_hf.offload.trace import load_trace
from oled_hf.sim import belady_min, replay
from tests.systems import system_for


@pytest.mark.parametrize("policy, cpu", [("oled", "on"), ("lru", "off"), ("tide", "on"), ("static", "off")])
def test_replay_equals_live_counts(tiny_path, tiny_tokenizer, tmp_path, policy, cpu):
    path = tmp_path / f"{policy}.trace"
    config = OffloadConfig(cache_size=6, system=system_for(policy), cpu_compute=cpu, record_trace=str(path))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    for text in ("hello there", "tell me about the sea and the ships"):
        ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)
        model.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9)
    live = model.offload_stats()["total"]
    trace = load_trace(str(path))
    assert trace.num_forwards == live["forwards"]
    result = replay(trace, policy, 6, cpu_compute=cpu, cost_model=model._offload_runtime.cost_model)
    assert (result.hits, result.misses, result.evictions) == (live["hits"], live["misses"], live["evictions"])
    assert result.bytes_copied == live["bytes_copied"] and result.cpu_expert_tokens == live["cpu_expert_tokens"]
    assert result.capacities == model._offload_runtime.controller.capacities


def test_trace_record_and_replay_cli(tiny_path, tmp_path, capsys):
    from oled_hf.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\nwhat is 2+2\n")
    out = tmp_path / "t.trace"
    assert main(["trace", "record", "--model", str(tiny_path), "--prompts", str(prompts), "--out", str(out),
                 "--block-length", "8", "--max-new-tokens", "16"]) == 0
    trace = load_trace(str(out))
    assert trace.header["block_length"] == 8 and trace.num_events > 0
    capsys.readouterr()
    assert main(["trace", "replay", str(out), "--cache-size", "4", "13", "--no-layer-adaptive"]) == 0
    table = capsys.readouterr().out
    for name in ("oled", "lru", "lfu", "static", "tide", "full", "MIN"):
        assert name in table
    # Belady (per-layer MIN with bypass, uniform capacity) is never below any policy on this trace.
    bound = belady_min(trace, 4)
    for policy in ("oled", "lru", "lfu", "static", "tide"):
        assert replay(trace, policy, 4, layer_adaptive=False).hit_rate <= bound.hit_rate + 1e-12
    assert main(["trace", "replay", str(out), "--cache-size", "40"]) == 2


def test_recorder_on_resident_model_does_not_change_tokens(tiny_model, tiny_tokenizer):
    from oled_hf.offload.recorder import TraceRecorder

    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    before = tiny_model.generate(ids, max_new_tokens=16, block_length=8)
    recorder = TraceRecorder(tiny_model)
    try:
        during = tiny_model.generate(ids, max_new_tokens=16, block_length=8)
    finally:
        recorder.detach()
    assert torch.equal(before, during)
    trace = recorder.writer.trace()
    assert [trace.forward(i).kind for i in range(trace.num_forwards)][:2] == ["denoise", "denoise"]


def test_recorder_writes_predicted_next_layer_routes(tiny_model):
    from oled_hf.offload.recorder import TraceRecorder

    recorder = TraceRecorder(tiny_model)
    try:
        tiny_model.generate(torch.tensor([[1, 2, 3, 4, 5, 6]]), max_new_tokens=8, block_length=8)
    finally:
        recorder.detach()
    trace = recorder.writer.trace()
    assert trace.version == 2 and trace.has_predictions
    pred, _ = trace.predicted_routing(1)
    ids, _ = trace.routing(1)
    assert pred.shape == ids.shape and (pred[0] == -1).all()
    assert ((pred[1:] >= 0) & (pred[1:] < trace.num_experts)).all()


def test_replay_cli_times_as_mini(tiny_path, tmp_path, capsys):
    from oled_hf.cli.main import main
    from oled_hf.sim.synthetic import synthetic_trace

    path = tmp_path / "s.trace"
    synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=4, num_blocks=2).save(str(path))
    assert main(["trace", "replay", str(path), "--cache-size", "4", "--as-model", "llada2.0-mini",
                 "--gpu-launch-us", "8", "--planner-us", "20", "--system", "lru", "prefetch"]) == 0
    out = capsys.readouterr().out
    assert "6.00 MiB experts" in out and "grouped GPU kernel" in out and "planner 20 us/access" in out
    assert "prefetch" in out and "full (fused MoE)" in out and "full (per-expert loop)" in out


def test_editing_trace_records_edits_and_replays_to_live_counts(tiny_path, tiny_tokenizer, tmp_path):
    path = tmp_path / "edit.trace"
    config = OffloadConfig(cache_size=6, system="oled", cpu_compute="on", record_trace=str(path))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "tell me about the sea"}],
                                             add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=24, block_length=8, editing_threshold=0.0, max_post_steps=3,
                         return_dict_in_generate=True)
    live = model.offload_stats()["total"]
    trace = load_trace(str(path))
    assert trace.edits() == int(out.edits[0]) > 0
    edited = [trace.event(i).edited for i in range(trace.num_events)]
    assert sum(int(e.sum()) for e in edited) == trace.edits()
    result = replay(trace, "oled", 6, cpu_compute="on", cost_model=model._offload_runtime.cost_model)
    assert (result.hits, result.misses, result.evictions) == (live["hits"], live["misses"], live["evictions"])
    assert result.bytes_copied == live["bytes_copied"] and result.cpu_expert_tokens == live["cpu_expert_tokens"]


@pytest.mark.parametrize("system", ["lru+cpu+reuse+adaptive", "lfu+cpu+uniform", "mixtral-offloading"])
def test_live_system_equals_trace_replay_system(tiny_path, tiny_model, tiny_tokenizer, tmp_path, capsys, system):
    """A live run with ``system=`` counts what ``oled-moe trace replay --system`` counts on its trace,
    and decodes the resident model's tokens."""
    import json

    from oled_hf.cli.main import main

    path = tmp_path / "live.trace"
    config = OffloadConfig(cache_size=6, system=system, cpu_compute="on", record_trace=str(path))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    ctrl = model._offload_runtime.controller
    assert ctrl.system.parts == parse_system(system).parts
    assert (ctrl.allocator is not None) == ctrl.system.layer_adaptive
    for text in ("hello there", "tell me about the sea and the ships"):
        ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9)
        assert torch.equal(out, tiny_model.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9))
    live = model.offload_stats()["total"]
    capsys.readouterr()
    assert main(["trace", "replay", str(path), "--cache-size", "6", "--system", system, "--cost-model", "recorded",
                 "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["system"] == ctrl.system.parts
    assert live["misses"] > 0 and (row["hits"], row["misses"], row["evictions"], row["bytes_copied"]) == (
        live["hits"], live["misses"], live["evictions"], live["bytes_copied"])
    assert row["cpu_expert_tokens"] == live["cpu_expert_tokens"]
    assert row["capacities"] == ctrl.capacities


def test_a_live_system_with_a_gate_prefetcher_is_refused_before_loading(tiny_path):
    with pytest.raises(ValueError, match=r"system='promoe' is invalid for a live run: its prefetch part "
                                         r"'gate-capped' reads the next layer's predicted routes, which only a "
                                         r"recorded trace holds .*; live prefetch parts: previous, matrix"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=6,
                                                                                         system="promoe"))


@pytest.mark.parametrize("system", ["oled+previous", "lru+matrix+copy+uniform"])
def test_live_prefetch_decisions_equal_replay(tiny_path, tiny_tokenizer, tmp_path, system):
    """A live run with a prefetch part replays (budgets as the live run measures them) to its counters."""
    path = tmp_path / "pf.trace"
    config = OffloadConfig(cache_size=4, system=system, cpu_compute="on", record_trace=str(path))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    for text in ("hello there", "tell me about the sea and the ships"):
        ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)
        model.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9)
    stats = model.offload_stats()
    live, rt = stats["total"], model._offload_runtime
    assert stats["prefetches"] > 0
    result = replay(load_trace(str(path)), system, 4, system=rt.controller.system, cost_model=rt.cost_model,
                    prefetch_budget="planned")
    assert result.prefetch_issued == stats["prefetches"]
    assert (result.hits, result.misses, result.evictions) == (live["hits"], live["misses"], live["evictions"])
    assert result.bytes_copied == live["bytes_copied"] and result.cpu_expert_tokens == live["cpu_expert_tokens"]
    assert result.capacities == rt.controller.capacities


@pytest.mark.parametrize("retention, cpu", [("adaptive", "on"), ("adaptive", "off"), ("learned", "on"),
                                             ("learned", "off")])
def test_adaptive_and_learned_retention_replay_to_the_live_counts_and_keep_tokens(tiny_path, tiny_tokenizer,
                                                                                  tmp_path, retention, cpu):
    """``adaptive``: its shadow caches run off the critical path but always before the next plan or
    event, so replay takes the live run's decisions; ``learned``: its predictor learns from what the
    run has observed only, the same in both. Both only rank, so the tokens are the resident model's.
    With CPU compute off, replay resolves the system's dispatch to ``copy`` as the live runtime does."""
    system = f"{retention}+cpu+reuse+adaptive"
    path = tmp_path / f"{retention}.trace"
    config = OffloadConfig(cache_size=6, system=system, cpu_compute=cpu, record_trace=str(path))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    resident = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()
    for text in ("hello there", "tell me about the sea and the ships"):
        ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9)
        assert torch.equal(out, resident.generate(**ids, max_new_tokens=24, block_length=8, threshold=0.9))
    live = model.offload_stats()["total"]
    trace = load_trace(str(path))
    result = replay(trace, retention, 6, cpu_compute=cpu, cost_model=model._offload_runtime.cost_model,
                    system=system)
    assert (result.hits, result.misses, result.evictions) == (live["hits"], live["misses"], live["evictions"])
    assert result.bytes_copied == live["bytes_copied"] and result.cpu_expert_tokens == live["cpu_expert_tokens"]
    if retention == "adaptive":
        assert model._offload_runtime.timing["shadow"].sum() > 0  # the executor ran the shadows itself
