"""The live offload runtime on the tiny checkpoint: lossless tokens, budgets, loading paths, save."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from transformers import AutoModelForCausalLM, pipeline

import oled_hf  # noqa: F401
from oled_hf import OffloadConfig
from tests.systems import system_for

POLICIES = ["oled", "lru", "lfu", "static", "tide"]
# tiny: 32 experts per layer -> 1 slot, ~25%, ~40%, 100%
CACHE_SIZES = [1, 8, 13, 32]


@pytest.fixture(scope="module")
def prompt(tiny_tokenizer):
    return tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hello there, how are you"}],
                                              add_generation_prompt=True, return_tensors="pt", return_dict=True)


@pytest.fixture(scope="module")
def reference(tiny_model, prompt):
    return tiny_model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9)


def _offloaded(path, **kwargs):
    return OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=OffloadConfig(**kwargs)).eval()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_and_cache_size_is_lossless(tiny_path, prompt, reference, policy):
    for cache_size in CACHE_SIZES:
        for cpu in ("on", "off"):
            model = _offloaded(tiny_path, cache_size=cache_size, system=system_for(policy), cpu_compute=cpu)
            out = model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9)
            assert torch.equal(out, reference), (policy, cache_size, cpu)
            total = model.offload_stats()["total"]
            assert total["hits"] + total["misses"] > 0
            if cpu == "off":
                assert total["cpu_expert_tokens"] == 0


def test_logits_bit_identical_to_resident(tiny_path, tiny_model):
    model = _offloaded(tiny_path, cache_size=4, cpu_compute="on")
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids, block_length=8).logits, tiny_model(ids, block_length=8).logits)


def test_budget_and_single_copy(tiny_path):
    model = _offloaded(tiny_path, cache_size=5)
    rt = model._offload_runtime
    cfg = model.config
    expert_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 4
    assert rt.cache.pool.shape[0] == 5 * cfg.num_moe_layers
    assert rt.cache.pool_bytes == 5 * cfg.num_moe_layers * expert_bytes
    assert rt.store.host_bytes() == cfg.num_moe_layers * cfg.num_experts * expert_bytes
    assert all(len(block.experts) == 0 for block in model.moe_blocks())
    assert not any(".experts." in name for name, _ in model.named_parameters())
    model.generate(torch.tensor([[1, 2, 3, 4, 5]]), max_new_tokens=16, block_length=8)
    caps = rt.controller.capacities
    assert sum(caps) == 5 * cfg.num_moe_layers and min(caps) >= 1
    for layer in range(cfg.num_moe_layers):
        assert len(rt.controller.state.resident(layer)) <= caps[layer]
    assert model.num_parameters() == OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).num_parameters()


def test_stats_and_reset(tiny_path):
    model = _offloaded(tiny_path, cache_size=8, system="lru+cpu+adaptive")
    model.generate(torch.tensor([[1, 2, 3, 4, 5]]), max_new_tokens=16, block_length=8)
    stats = model.offload_stats()
    assert len(stats["layers"]) == model.config.num_moe_layers
    for key in ("hits", "misses", "hit_rate", "evictions", "bytes_copied", "cpu_expert_tokens", "copy_seconds",
                "device_seconds", "cpu_seconds", "policy_seconds", "host_syncs"):
        assert key in stats["total"] and key in stats["layers"][0]
    # a CPU run has no GPU: its experts' compute is the device's (the CPU's), never reported as GPU time
    assert "gpu_seconds" not in stats["total"] and "gpu_seconds" not in stats["layers"][0]
    assert stats["total"]["host_syncs_per_access"] == stats["total"]["host_syncs"] / (
        stats["total"]["forwards"] * model.config.num_moe_layers)
    assert stats["policy"] == "lru" and stats["total"]["forwards"] > 0
    model.reset_offload_stats()
    assert model.offload_stats()["total"]["hits"] == 0 and model.offload_stats()["total"]["forwards"] == 0


def test_bad_offload_configs_are_rejected(tiny_path):
    with pytest.raises(ValueError, match="cache_size=0"):
        OffloadConfig(cache_size=0)
    with pytest.raises(ValueError, match="policy='fifo'.*lfu, lru, moe-infinity, oled, prefetch, static, tide"):
        OffloadConfig(cache_size=4, policy="fifo")
    with pytest.raises(ValueError, match="cache_size=33.*32"):
        _offloaded(tiny_path, cache_size=33)
    with pytest.raises(ValueError, match="exactly one"):
        OffloadConfig(cache_size=4, cache_ratio=0.5)
    with pytest.raises(ValueError, match="offload_config must be an oled_hf.OffloadConfig"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=4)


def test_auto_class_and_pipeline_paths(tiny_path, prompt, reference):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_ratio=0.4))
    assert model.is_offloaded and model.offload_stats()["total_slots"] == round(0.4 * 32 * 3)
    pipe = pipeline("text-generation", model=str(tiny_path), trust_remote_code=True,
                    model_kwargs={"offload_config": OffloadConfig(cache_size=6)})
    assert pipe.model.is_offloaded
    out = pipe("Once upon a time", max_new_tokens=8, block_length=8)
    assert out[0]["generated_text"].startswith("Once upon a time")


def test_save_pretrained_of_offloaded_model_is_complete(tiny_path, tiny_model, tmp_path):
    model = _offloaded(tiny_path, cache_size=4)
    model.save_pretrained(tmp_path / "saved")
    again = OledLLaDA2ForDiffusionLM.from_pretrained(tmp_path / "saved").eval()
    assert len(again.moe_blocks()[0].experts) == model.config.num_experts
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, tiny_model(ids).logits)


def test_mmap_store_is_zero_copy_and_lossless_on_tokens(tiny_path, prompt, reference):
    model = _offloaded(tiny_path, cache_size=8, store="mmap", cpu_compute="off")
    assert model.offload_stats()["store"] == "mmap"
    out = model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9)
    assert torch.equal(out, reference)


def test_bf16_offload_matches_bf16_resident(tiny_path):
    ids = torch.randint(0, 500, (1, 30), generator=torch.Generator().manual_seed(2))
    resident = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=torch.bfloat16).eval()
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=torch.bfloat16,
                                                     offload_config=OffloadConfig(cache_size=5)).eval()
    assert model._offload_runtime.store.dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(model(ids).logits, resident(ids).logits)
    assert torch.equal(model.generate(ids, max_new_tokens=16, block_length=8),
                       resident.generate(ids, max_new_tokens=16, block_length=8))


def test_concurrent_cpu_path_is_lossless(tiny_path, prompt, reference):
    """The worker-thread CPU path (used beside a GPU) gathers, computes and scatters rows correctly."""
    model = _offloaded(tiny_path, cache_size=4, cpu_compute="on")
    model._offload_runtime.overlap_cpu = True
    out = model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9)
    assert torch.equal(out, reference)
    assert model.offload_stats()["total"]["cpu_expert_tokens"] > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_editing_is_lossless_for_every_policy(tiny_path, tiny_model, prompt, policy):
    """LLaDA2.1 editing (threshold 0: edits wherever the argmax moves) changes tokens the policies saw
    as settled; offloading must still give the resident tokens."""
    kw = dict(max_new_tokens=24, block_length=8, threshold=0.9, editing_threshold=0.0, max_post_steps=3,
              return_dict_in_generate=True)
    want = tiny_model.generate(**prompt, **kw)
    assert int(want.edits[0]) > 0
    for cache_size in (1, 13):
        model = _offloaded(tiny_path, cache_size=cache_size, system=system_for(policy), cpu_compute="on")
        out = model.generate(**prompt, **kw)
        assert torch.equal(out.sequences, want.sequences), (policy, cache_size)
        assert torch.equal(out.edits_per_block, want.edits_per_block)


def test_cpu_compute_auto_is_off_without_an_accelerator(tiny_path, prompt, reference):
    """On a CPU-only machine host and device are the same cores: a CPU-computed miss only costs hits."""
    # the preset cost model, not a measured one: which misses go to the CPU must not depend on timing noise
    auto = _offloaded(tiny_path, cache_size=8, calibrate=False)
    on = _offloaded(tiny_path, cache_size=8, cpu_compute="on", calibrate=False)
    for model in (auto, on):
        assert torch.equal(model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9), reference)
    a, o = auto.offload_stats(), on.offload_stats()
    assert (a["cpu_compute"], a["cpu_compute_requested"], o["cpu_compute"]) == ("off", "auto", "on")
    assert a["total"]["cpu_expert_tokens"] == 0 and o["total"]["cpu_expert_tokens"] > 0
    assert a["total"]["hit_rate"] > o["total"]["hit_rate"]


# ---- OffloadConfig(record_trace=...): checked at load, never creates folders or replaces files --------


def _generate_twice(model):
    for ids in ([[1, 2, 3, 4, 5]], [[7, 8, 9]]):
        model.generate(torch.tensor(ids), max_new_tokens=16, block_length=8)


def test_record_trace_refuses_a_missing_folder_before_loading_experts(tiny_path, tmp_path):
    target = tmp_path / "no" / "such" / "t.trace"
    with pytest.raises(ValueError) as err:
        _offloaded(tiny_path, cache_size=4, record_trace=str(target))
    assert str(err.value) == (f"record_trace={str(target)!r}: its folder {str(target.parent)!r} does not exist; "
                              "create it first (no folders are created)")
    assert not (tmp_path / "no").exists()


def test_record_trace_refuses_a_folder_at_load_not_after_generating(tiny_path, tmp_path):
    with pytest.raises(ValueError, match=r"record_trace='.*' is a folder; give the path of a trace file to write"):
        _offloaded(tiny_path, cache_size=4, record_trace=str(tmp_path))


def test_record_trace_keeps_an_existing_file_unless_told(tiny_path, tmp_path):
    from oled_hf.offload.trace import load_trace

    target = tmp_path / "mine.trace"
    target.write_text("the user's file")
    with pytest.raises(ValueError, match=r"mine.trace' already exists; pass record_trace_overwrite=True"):
        _offloaded(tiny_path, cache_size=4, record_trace=str(target))
    assert target.read_text() == "the user's file"
    model = _offloaded(tiny_path, cache_size=4, record_trace=str(target), record_trace_overwrite=True)
    _generate_twice(model)
    assert load_trace(str(target)).num_forwards == model.offload_stats()["total"]["forwards"]
    with pytest.raises(ValueError, match="record_trace_overwrite='yes' is invalid: must be True or False"):
        OffloadConfig(cache_size=4, record_trace=str(target), record_trace_overwrite="yes")


def test_record_trace_is_one_trace_per_load_with_every_generate(tiny_path, tmp_path):
    from oled_hf.offload.trace import load_trace

    target = tmp_path / "t.trace"
    config = OffloadConfig(cache_size=4, record_trace=str(target))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config).eval()
    assert not target.exists()  # written when a generate ends, not before
    _generate_twice(model)  # the second generate rewrites the model's own trace: not refused
    trace = load_trace(str(target))
    assert trace.num_forwards == model.offload_stats()["total"]["forwards"]
    assert sorted(set(trace.arrays["fwd_seq"].tolist())) == [0, 1]  # one sequence per generate
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.trace"]  # no temporary file left behind
    with pytest.raises(ValueError, match="already exists"):  # a second load would replace the first's trace
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=config)
