"""Issue 37.3: accelerate's conventions (device_map, max_memory, offload_folder) with and without offload_config."""

import importlib

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.placement import input_device, offload_placement, resolve_offload_config
from transformers import AutoModelForCausalLM

import oled_hf

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])
GEN = dict(max_new_tokens=16, block_length=8)


@pytest.fixture(scope="module")
def resident_tokens(tiny_model):
    return tiny_model.generate(PROMPT, **GEN)


@pytest.mark.parametrize("max_memory, devices", [({"cpu": "200KB"}, {"disk"}), ({"cpu": "10MB"}, {"cpu", "disk"})])
def test_accelerate_disk_offload_generates_the_resident_tokens(tiny_path, tmp_path, resident_tokens, max_memory,
                                                               devices):
    """device_map="auto" + max_memory + offload_folder: accelerate's own disk offload (all of the model, or
    the later layers). It crashed in accelerate's pre_forward with "Cannot copy out of meta tensor"."""
    model = AutoModelForCausalLM.from_pretrained(tiny_path, device_map="auto", max_memory=max_memory,
                                                 offload_folder=str(tmp_path / "offload")).eval()
    assert set(model.hf_device_map.values()) == devices  # the whole model on disk, or the later layers
    assert input_device(model) == torch.device("cpu")  # model.device is meta for disk-offloaded weights
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)


def test_accelerate_disk_offload_logits_match_resident(tiny_path, tmp_path, tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, device_map="auto", max_memory={"cpu": "200KB"},
                                                 offload_folder=str(tmp_path / "offload")).eval()
    with torch.no_grad():
        diff = (model(PROMPT, block_length=8).logits - tiny_model(PROMPT, block_length=8).logits).abs().max()
    assert diff.item() <= 1e-4  # per-expert modules vs the grouped kernel: rounding only


def test_offload_config_as_a_dict(tiny_path, resident_tokens):
    fields = {"cache_size": 4, "system": "lru+cpu+adaptive"}
    model = AutoModelForCausalLM.from_pretrained(tiny_path, offload_config=fields)
    assert model.is_offloaded and model._offload_runtime.config == oled_hf.OffloadConfig(**fields)
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)


def test_offload_config_dict_errors_name_the_field():
    with pytest.raises(ValueError, match="unknown OffloadConfig field"):
        resolve_offload_config({"cache_sise": 4})
    with pytest.raises(ValueError, match="offload_config must be an oled_hf.OffloadConfig or a dict of its fields, "
                                         "got int"):
        resolve_offload_config(4)


def test_offload_config_dict_without_oled_hf(monkeypatch):
    real = importlib.import_module

    def missing(name, *args):
        if name.startswith("oled_hf"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ImportError, match="needs the oled-hf package installed"):
        resolve_offload_config({"cache_size": 4})


@pytest.mark.parametrize("device_map", ["auto", "balanced", "sequential", "cpu", {"": "cpu"}])
def test_offload_config_with_a_one_device_map_loads(tiny_path, resident_tokens, device_map):
    model = AutoModelForCausalLM.from_pretrained(tiny_path, device_map=device_map,
                                                 offload_config=oled_hf.OffloadConfig(cache_size=4))
    assert model.is_offloaded and {p.device.type for p in model.parameters()} == {"cpu"}
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_memory={"disk": "1GB"}), r"^max_memory key 'disk' is invalid \(with offload_config the experts stay in "
                                       r"the checkpoint's files: store='mmap'\); keys: a CUDA device"),
    (dict(device_map="cuda:0", max_memory={0: "20GiB", 1: "20GiB"}), r"names 2 devices \(cuda:0, cuda:1\)"),
    (dict(max_memory={"cpu": "infGiB"}), r"^max_memory\['cpu'\]='infGiB' is invalid"),
    (dict(offload_folder="/tmp/x"), r"offload_folder='/tmp/x' cannot be combined with offload_config"),
    (dict(device_map="disk"), r"device_map='disk' cannot be combined with offload_config: an offloaded model runs "
                              r"on one device .*OffloadConfig"),
    (dict(device_map={"model": "cpu", "lm_head": "disk"}), r"\(here: cpu, disk\)"),
    (dict(device_map={"model": 0, "lm_head": "cpu"}), r"\(here: cpu, cuda:0\)"),
])
def test_offload_config_refuses_accelerate_placement_before_loading(tiny_path, monkeypatch, kwargs, message):
    def no_load(*args, **kw):  # refused before Transformers reads anything
        raise AssertionError("from_pretrained went on to load")

    monkeypatch.setattr("transformers.PreTrainedModel.from_pretrained", no_load)
    with pytest.raises(ValueError, match=message) as err:
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=oled_hf.OffloadConfig(cache_size=4),
                                                 **kwargs)
    assert "\n" not in str(err.value)


def test_strategy_means_the_first_accelerator_else_cpu(monkeypatch):
    kwargs = dict(device_map="auto")
    offload_placement(kwargs)
    assert kwargs["device_map"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kwargs = dict(device_map="balanced_low_0")
    offload_placement(kwargs)
    assert kwargs["device_map"] == "cuda:0"


def test_a_small_model_loads_resident_on_a_busy_host(tiny_path, resident_tokens, monkeypatch):
    """Issue 67 item 19: a 10 MB model was refused with 1.4 GiB available because 10% of a 24 GiB host (2.4 GiB)
    was to stay free; a load keeps free as much as it reads, at most that 10%."""
    from oled_hf.modeling import placement

    gib = 1 << 30
    monkeypatch.setattr(placement, "host_memory", lambda: (int(1.4 * gib), 24 * gib))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path)
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)
    assert placement.load_headroom(10 << 20, 24 * gib) == 10 << 20
    assert placement.load_headroom(20 * gib, 24 * gib) == int(2.4 * gib)  # a large load keeps the whole headroom
