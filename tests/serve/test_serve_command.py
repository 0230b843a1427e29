"""The ``serve`` command: it refuses unsafe or bad options before loading, and serves when asked."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def test_serve_refuses_public_host_without_key(capsys, tiny_path):
    from oled_hf.cli import serve

    for host in ("0.0.0.0", "192.168.1.20", "example.com"):
        assert serve.main(["--model", str(tiny_path), "--host", host]) == 2
        err = capsys.readouterr().err
        assert f"refusing to listen on {host} without --api-key" in err and "--insecure" in err
    assert serve.main(["--model", str(tiny_path), "--max-queue", "0"]) == 2
    from oled_hf.serve.guard import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")


def test_serve_reports_missing_model(capsys, tmp_path):
    from oled_hf.cli import serve

    assert serve.main(["--model", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_serve_refuses_bad_loading_and_batching_options_before_loading(capsys, tiny_path):
    """Issue 27 item 5: one line on stderr, exit 2, naming the flag, before any weight is read."""
    from oled_hf.cli import chat, serve

    cases = [
        (["--policy", "prefetch", "--cache-size", "4"], "argument --policy: 'prefetch' names the system "
                                                        "'lru+gate+cpu+adaptive': system='lru+gate+cpu+adaptive' is "
                                                        "invalid for a live run: its prefetch part 'gate' reads"),
        (["--system", "hybrimoe", "--cache-ratio", "0.5"], "argument --system: system='hybrimoe' is invalid for a live "
                                                           "run: its prefetch part 'gate-capped'"),
        (["--cache-size", "4", "--cache-ratio", "0.5"],
         "give one of --cache-size, --cache-ratio or --max-gpu-memory, not --cache-size and --cache-ratio"),
        (["--cache-ratio", "1.5"], "--cache-ratio 1.5 is invalid: must be more than 0 and at most 1"),
        (["--cache-size", "0"], "--cache-size 0 is invalid: must be at least 1 expert slot per MoE layer"),
        (["--policy", "lru"], "--system needs a budget, --cache-size, --cache-ratio, --max-gpu-memory or "
                              "--gpu-memory-utilization"),
        (["--max-gpu-memory", "20GiB", "--cache-size", "4"], "not --cache-size and --max-gpu-memory"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5 is invalid: must be more than 0 and "
                                              "at most 1"),
        (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization 0 is invalid"),
        (["--gpu-memory-utilization", "0.8", "--cache-ratio", "0.5"],
         "--gpu-memory-utilization 0.8 sizes the expert cache from the device (as --cache-ratio auto does), so it "
         "cannot be combined with --cache-ratio"),
        (["--max-gpu-memory", "lots"], "argument --max-gpu-memory: --max-gpu-memory='lots' is invalid"),
        (["--max-model-len", "5000"], "--max-model-len 5000 is more than the model's max_position_embeddings of 4096"),
        (["--max-model-len", "0"], "--max-model-len 0 is invalid"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--model", "elsewhere"], f"the model is given twice: MODEL {tiny_path} and --model elsewhere"),
    ]
    for command in (serve, chat):
        for extra, message in cases:
            try:
                code = command.main([str(tiny_path), *extra])
            except SystemExit as exit_:  # argparse's own errors
                code = exit_.code
            err = capsys.readouterr().err
            assert code == 2 and message in err, (command.__name__, extra, err)
            assert "Loading weights" not in err
    for extra, message in [(["--max-batch-size", "0"], "--max-batch-size 0 is invalid"),
                           (["--batch-wait-ms", "-1"], "--batch-wait-ms -1 is invalid")]:
        assert serve.main([str(tiny_path), *extra]) == 2
        assert message in capsys.readouterr().err


def test_live_commands_name_the_system_with_system(capsys):
    """Issue 67 item 3: --system names the system in serve and chat too; --policy, --offload-system deprecated."""
    from oled_hf.cli import chat, serve

    for command in (serve, chat):
        try:
            command.main(["--help"])
        except SystemExit:
            pass
        text = " ".join(capsys.readouterr().out.split())
        assert "--system SYSTEM" in text and "--offload-system SYSTEM deprecated: use --system" in text
        assert "--policy POLICY deprecated: an old retention policy name" in text
        assert "--cache-ratio RATIO" in text and "--dtype {auto,float32,bfloat16,float16}" in text
        assert "--max-model-len TOKENS" in text and "[MODEL]" in text


def test_serve_command_starts_and_stops(tiny_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # the model as vllm takes it (positional), offloaded by ratio, in an explicit dtype, with a length limit
    proc = subprocess.Popen([sys.executable, "-m", "oled_hf.cli.serve", str(tiny_path), "--port",
                             str(port), "--block-length", "8", "--default-max-tokens", "8", "--log-level", "warning",
                             "--served-model-name", "tiny-cli", "--cache-ratio", "0.5", "--dtype", "float32",
                             "--max-model-len", "64", "--max-num-seqs", "4", "--system", "lru"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.1)
        body = {"model": "tiny-cli", "prompt": "hello"}
        r = httpx.post(f"{url}/v1/completions", json=body, trust_env=False, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        too_long = httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 64}, trust_env=False, timeout=60)
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        assert "the context is 64 tokens" in too_long.json()["error"]["message"]
        stats = httpx.get(f"{url}/metrics", trust_env=False).text
        assert "oled_offload_enabled 1" in stats
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"OpenAI API at http://127.0.0.1:{port}/v1" in err
    assert "offloading on; batches of up to 4, 64 tokens per request" in err


def test_policy_loads_its_system_without_a_deprecation_warning(tiny_path):
    """serve/chat --policy is the CLI's own spelling: the user's stderr gets no FutureWarning for it."""
    import warnings

    from oled_hf.serve.engine import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        model, _ = load_model(str(tiny_path), device="cpu", cache_size=4, policy="lru")
    assert model.offload_stats()["system"].startswith("lru+")
