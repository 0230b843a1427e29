"""The shared budget flags (``options/budget.py``) on every command that loads an offloaded model, serve and chat
included: ``--cache-ratio auto``, ``--max-gpu-memory SIZE``, ``--gpu-memory-utilization F`` (issue 37 item 1)."""

from __future__ import annotations

import pytest
import torch

from oled_hf.cli.main import build_parser, main
from oled_hf.options.budget import budget_choices

MIB = 2**20
OFFLOADING = ("serve", "chat", "benchmark", "demo", "eval")
REQUIRED = {"eval": ["--tasks", "toy_addition"]}  # each command's own required flags


def _choices(argv: list[str]) -> list[dict]:
    return budget_choices(build_parser().parse_args([*argv, *REQUIRED.get(argv[0], [])]))


@pytest.mark.parametrize("command", OFFLOADING)
def test_every_offloading_command_takes_the_same_spellings(command):
    """demo and eval took none of these (demo: its own --cache-ratio only; eval: --model-args only)."""
    auto = {"auto_batch_size": 8 if command == "serve" else 1, "auto_context_length": None}
    assert _choices([command, "--cache-ratio", "auto"]) == [{"cache_ratio": "auto", **auto}]
    assert _choices([command, "--cache-ratio", "0.25"]) == [{"cache_ratio": 0.25, **auto}]
    assert _choices([command, "--max-gpu-memory", "20GiB"]) == [{"max_gpu_memory": "20GiB", **auto}]
    assert _choices([command, "--max-gpu-memory", "1048576"]) == [{"max_gpu_memory": 1048576, **auto}]
    utilization = [{"cache_ratio": "auto", "gpu_memory_utilization": 0.5, **auto}]
    assert _choices([command, "--gpu-memory-utilization", "0.5"]) == utilization
    assert _choices([command, "--gpu-memory-utilization", "0.5", "--cache-ratio", "auto"]) == utilization
    assert _choices([command, "--cache-size", "4"])[0]["cache_size"] == 4
    assert _choices([command]) == []


def test_serve_reserves_activations_for_its_own_batch_and_context_limit():
    """Unless --auto-batch-size / --auto-context-length say otherwise, ``auto`` reserves KV for the batches
    and the request length the server will run (--max-batch-size, --max-model-len)."""
    assert _choices(["serve", "--cache-ratio", "auto", "--max-batch-size", "4", "--max-model-len", "512"]) == [
        {"cache_ratio": "auto", "auto_batch_size": 4, "auto_context_length": 512}]
    assert _choices(["serve", "--cache-ratio", "auto", "--max-batch-size", "4", "--auto-batch-size", "2",
                     "--auto-context-length", "100"]) == [
        {"cache_ratio": "auto", "auto_batch_size": 2, "auto_context_length": 100}]
    assert _choices(["chat", "--cache-ratio", "auto", "--max-model-len", "64"])[0]["auto_context_length"] == 64


@pytest.mark.parametrize("argv, message", [
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5 is invalid: must be more than 0 and at most 1 "
                                          "(the fraction of the GPU's memory this process may use)"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization 0 is invalid"),
    (["--gpu-memory-utilization", "0.5", "--max-gpu-memory", "1GiB"],
     "--gpu-memory-utilization 0.5 sizes the expert cache from the device (as --cache-ratio auto does), so it cannot "
     "be combined with --max-gpu-memory: give one of them"),
    (["--gpu-memory-utilization", "0.5", "--cache-size", "4"], "cannot be combined with --cache-size"),
    (["--cache-ratio", "0"], "--cache-ratio 0 is invalid: must be more than 0 and at most 1, or auto"),
    (["--cache-size", "0"], "--cache-size 0 is invalid: must be at least 1 expert slot per MoE layer"),
    (["--cache-ratio", "auto", "--auto-batch-size", "0"], "--auto-batch-size 0 is invalid: must be at least 1"),
    (["--cache-ratio", "0.5", "--max-gpu-memory", "1GiB"],
     "give one of --cache-size, --cache-ratio or --max-gpu-memory, not --cache-ratio and --max-gpu-memory"),
])
@pytest.mark.parametrize("command", OFFLOADING)
def test_bad_budgets_are_one_line_naming_the_flag(command, argv, message, tiny_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    assert main([command, "--model", str(tiny_path), *REQUIRED.get(command, []), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oled-moe {command}: error: ") and message in err and err.count("\n") == 1, err


def test_serve_and_chat_refused_these_flags_before():
    """The README's spellings parse on serve and chat (they said 'unrecognized arguments' / 'invalid float')."""
    for command in ("serve", "chat"):
        args = build_parser().parse_args([command, "--max-gpu-memory", "20GiB"])
        assert args.max_gpu_memory == "20GiB"
        assert build_parser().parse_args([command, "--cache-ratio", "auto"]).cache_ratio == "auto"
        assert build_parser().parse_args([command, "--gpu-memory-utilization", "0.7"]).gpu_memory_utilization == 0.7


@pytest.fixture
def fake_cuda(monkeypatch):
    """One CUDA device with 20 MiB free of 100 MiB, nothing cached by PyTorch (as tests/offload/test_budget.py)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * MIB, 100 * MIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_serve_and_chat_size_the_cache_from_the_mocked_device(command, tiny_path, fake_cuda, monkeypatch, capsys):
    """The flags reach ``from_pretrained`` as one OffloadConfig, which sizes the pool from the (mocked) device:
    with 20 MiB free of 100, --gpu-memory-utilization 0.85 keeps 15 MiB free instead of 10, so fewer experts fit."""
    from transformers import AutoModelForCausalLM

    from tests.offload.test_budget import ONE, TINY

    seen = []

    def from_pretrained(path, **kwargs):
        seen.append(kwargs)
        raise ValueError("loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    for argv in (["--cache-ratio", "auto"], ["--gpu-memory-utilization", "0.85"], ["--max-gpu-memory", "1MiB"]):
        assert main([command, "--model", str(tiny_path), "--device", "cuda", "--max-model-len", "100", *argv]) == 2
        assert capsys.readouterr().err == f"oled-moe {command}: error: loaded\n"
    auto, utilization, memory = (kwargs["offload_config"] for kwargs in seen)
    assert all(kwargs["device_map"] == "cuda" for kwargs in seen)
    assert (auto.cache_ratio, auto.gpu_memory_utilization) == ("auto", 0.9)
    assert (utilization.cache_ratio, utilization.gpu_memory_utilization) == ("auto", 0.85)
    assert memory.max_gpu_memory == "1MiB" and memory.cache_ratio is None
    batch = 8 if command == "serve" else 1  # serve reserves KV for --max-batch-size sequences of --max-model-len
    assert auto.auto_batch_size == utilization.auto_batch_size == batch
    assert auto.auto_context_length == utilization.auto_context_length == 100
    activations = batch * (204_800 + 908_800 + 131_072)  # tests/offload/test_budget.py: 100 tokens, float32
    assert auto.resolve_device_slots(TINY, 4, "cuda") == (20 * MIB - 10 * MIB - activations) // ONE
    if command == "chat":
        assert auto.resolve_device_slots(TINY, 4, "cuda") == 94
        assert utilization.resolve_device_slots(TINY, 4, "cuda") == (20 * MIB - 15 * MIB - activations) // ONE == 40
    else:  # 8 sequences of KV and 15 MiB kept free leave no room for 3 experts: refused, with the sizes
        assert auto.resolve_device_slots(TINY, 4, "cuda") == 5
        with pytest.raises(ValueError, match=r"headroom \(15% of the device, 15.0 MiB\)"):
            utilization.resolve_device_slots(TINY, 4, "cuda")
    assert memory.resolve_device_slots(TINY, 4, "cuda") == MIB // ONE == 10


def test_auto_without_cuda_is_one_line_before_loading(tiny_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    for command in ("serve", "chat", "demo", "eval"):
        for argv in (["--cache-ratio", "auto"], ["--gpu-memory-utilization", "0.5"]):
            assert main([command, "--model", str(tiny_path), *REQUIRED.get(command, []), "--device", "cpu", *argv]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"oled-moe {command}: error: cache_ratio='auto' needs a CUDA device") and \
                err.count("\n") == 1, err


def _capture_offloaded_loads(monkeypatch) -> list[dict]:
    """``from_pretrained`` that records each offloaded load's kwargs and stops there ("loaded", exit 2);
    a resident load (the demo's reference) still loads, on the CPU."""
    from transformers import AutoModelForCausalLM

    load, seen = AutoModelForCausalLM.from_pretrained, []

    def from_pretrained(path, **kwargs):
        if kwargs.get("offload_config") is None:
            return load(path, **{**kwargs, "device_map": "cpu"})
        seen.append(kwargs)
        raise ValueError("loaded")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return seen


def test_demo_sizes_the_cache_from_the_mocked_device(tiny_path, fake_cuda, monkeypatch, capsys):
    """demo's budget is the shared flags (it had only --cache-ratio R|auto); without one it keeps 0.4."""
    from tests.offload.test_budget import ONE, TINY

    seen = _capture_offloaded_loads(monkeypatch)
    base = ["demo", "--model", str(tiny_path), "--device", "cuda", "--prompt", "hi", "--auto-context-length", "100"]
    for argv in ([], ["--cache-ratio", "auto"], ["--gpu-memory-utilization", "0.85"], ["--max-gpu-memory", "1MiB"],
                 ["--cache-size", "3"]):
        assert main([*base, *argv]) == 2
        assert capsys.readouterr().err == "oled-moe demo: error: loaded\n"
    default, auto, utilization, memory, size = (kwargs["offload_config"] for kwargs in seen)
    assert default.cache_ratio == 0.4 and default.max_gpu_memory is None and default.system == "oled"
    assert (auto.cache_ratio, auto.gpu_memory_utilization, auto.auto_context_length) == ("auto", 0.9, 100)
    assert (utilization.cache_ratio, utilization.gpu_memory_utilization) == ("auto", 0.85)
    assert auto.resolve_device_slots(TINY, 4, "cuda") == 94  # as chat's: one sequence of 100 tokens
    assert utilization.resolve_device_slots(TINY, 4, "cuda") == 40
    assert memory.resolve_device_slots(TINY, 4, "cuda") == MIB // ONE == 10
    assert size.cache_size == 3


def test_eval_sizes_the_cache_from_the_mocked_device(tiny_path, fake_cuda, monkeypatch, capsys):
    """eval's flags reach the adapter's OffloadConfig; ``auto`` reserves KV for --batch-size sequences of the
    model's max_length (lm-eval's), as serve reserves for --max-batch-size."""
    from tests.offload.test_budget import ONE, TINY

    seen = _capture_offloaded_loads(monkeypatch)
    base = ["eval", "--model", str(tiny_path), "--tasks", "toy_addition", "--device", "cuda",
            "--model-args", "max_length=100"]
    for argv in (["--cache-ratio", "auto"], ["--gpu-memory-utilization", "0.85"], ["--max-gpu-memory", "1MiB"],
                 ["--cache-ratio", "auto", "--batch-size", "2"], ["--cache-ratio", "auto", "--auto-batch-size", "2"]):
        assert main([*base, *argv]) == 2
        assert capsys.readouterr().err == "oled-moe eval: error: loaded\n"
    auto, utilization, memory, batch, flag = (kwargs["offload_config"] for kwargs in seen)
    assert all(kwargs["device_map"] == "cuda" for kwargs in seen)
    assert (auto.cache_ratio, auto.gpu_memory_utilization, auto.auto_context_length) == ("auto", 0.9, 100)
    assert auto.resolve_device_slots(TINY, 4, "cuda") == 94
    assert (utilization.cache_ratio, utilization.gpu_memory_utilization) == ("auto", 0.85)
    assert utilization.resolve_device_slots(TINY, 4, "cuda") == 40
    assert memory.max_gpu_memory == "1MiB" and memory.resolve_device_slots(TINY, 4, "cuda") == MIB // ONE
    assert batch.auto_batch_size == flag.auto_batch_size == 2
    assert batch.resolve_device_slots(TINY, 4, "cuda") == (10 * MIB - 2 * (204_800 + 908_800 + 131_072)) // ONE == 81


def test_eval_takes_the_budget_once(tiny_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    argv = ["eval", "--model", str(tiny_path), "--tasks", "toy_addition", "--cache-size", "2"]
    assert main([*argv, "--model-args", "cache_ratio=0.5"]) == 2
    assert capsys.readouterr().err == ("oled-moe eval: error: the budget is given twice, as --cache-size and as "
                                       "--model-args cache_ratio=0.5: give it once\n")


def test_budget_name_says_what_was_asked():
    from oled_hf.options.budget import budget_name

    assert budget_name({"cache_ratio": 0.4, "auto_batch_size": 1}) == "cache ratio 0.4"
    assert budget_name({"cache_size": 3}) == "cache size 3"
    assert budget_name({"max_gpu_memory": "20GiB"}) == "max gpu memory 20GiB"
    assert budget_name({"cache_ratio": "auto", "gpu_memory_utilization": 0.85}) == \
        "cache ratio auto (gpu memory utilization 0.85)"


@pytest.mark.parametrize("size", ["infGiB", "1e400GiB", "nanGiB", "1e30GiB"])
@pytest.mark.parametrize("command", OFFLOADING)
def test_an_infinite_max_gpu_memory_is_one_line_exit_2(command, size, tiny_path, capsys):
    """Issue 67 item 13: ``--max-gpu-memory infGiB`` was a raw OverflowError traceback."""
    with pytest.raises(SystemExit) as info:
        main([command, "--model", str(tiny_path), *REQUIRED.get(command, []), "--max-gpu-memory", size])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"oled-moe {command}: error: argument --max-gpu-memory: --max-gpu-memory='{size}' is "
                          "invalid: ") and err.endswith(f"(see oled-moe {command} --help)\n")


def test_benchmark_refuses_emulated_flags_without_the_emulated_device(tiny_path, capsys):
    """Issue 67 item 14, through the command: --emulated-latency-us was ignored without --device emulated."""
    assert main(["benchmark", "--model", str(tiny_path), "--cache-size", "4", "--emulated-latency-us", "50"]) == 2
    assert capsys.readouterr().err == ("oled-moe benchmark: error: --emulated-latency-us needs --device emulated\n")
