"""``oled-moe chat``: scripted through a pipe, and its session and model-choice logic in process."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

ARGS = ["--max-tokens", "16", "--block-length", "8"]


def _greedy_reply(model, tok, history):
    inputs = tok.apply_chat_template(history, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=16, block_length=8)
    return tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def test_chat_through_a_pipe(tiny_path, tiny_model, tiny_tokenizer):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "oled_hf.cli.chat", "--model", str(tiny_path), *ARGS],
                          input="hello\n/help\n/stats\n/clear\nbye\n/exit\nnever read\n", capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first = _greedy_reply(tiny_model, tiny_tokenizer, [{"role": "user", "content": "hello"}])
    after_clear = _greedy_reply(tiny_model, tiny_tokenizer, [{"role": "user", "content": "bye"}])
    assert out.startswith(first + "\n")
    assert out.endswith("(conversation cleared)\n" + after_clear + "\n")  # /clear dropped "hello"
    for command in ("/help", "/clear", "/stats", "/exit"):
        assert command in out
    assert "offloading off" in out and "last reply: 16 tokens" in out
    assert ">>>" not in out and ">>>" not in proc.stderr  # no prompt marker when stdin is not a terminal


def test_session_keeps_the_conversation(tiny_model, tiny_tokenizer):
    from oled_hf.cli.chat import ChatSession

    out = io.StringIO()
    session = ChatSession(tiny_model, tiny_tokenizer, max_tokens=16, block_length=8, threshold=None, out=out)
    first = session.reply("hello")
    second = session.reply("and then?")
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "and then?"}]
    assert second == _greedy_reply(tiny_model, tiny_tokenizer, history)
    assert out.getvalue() == first + "\n" + second + "\n"
    assert len(session.history) == 4
    session.clear()
    assert session.history == [] and "offloading off" in session.stats()


def test_default_model(monkeypatch, tiny_path):
    import oled_hf
    from oled_hf.serve import engine

    monkeypatch.setattr(engine, "default_model_path", lambda: None)
    with pytest.raises(ValueError, match="--model is required"):
        engine.resolve_model_path(None)
    monkeypatch.undo()

    fake = type(sys)("oled_hf.toy")
    fake.TOY_CHECKPOINT = tiny_path
    monkeypatch.setitem(sys.modules, "oled_hf.toy", fake)
    monkeypatch.setattr(oled_hf, "toy", fake, raising=False)
    assert engine.resolve_model_path(None) == str(tiny_path)
    fake.TOY_CHECKPOINT = tiny_path.parent / "not-trained-yet"
    with pytest.raises(ValueError, match="does not exist yet"):
        engine.resolve_model_path(None)


def test_chat_rejects_bad_options(capsys, tiny_path):
    from oled_hf.cli import chat

    assert chat.main(["--model", str(tiny_path), "--max-tokens", "0"]) == 2
    assert "--max-tokens 0 is invalid" in capsys.readouterr().err


def test_stats_with_offloading(tiny_path):
    from oled_hf.cli.chat import ChatSession
    from oled_hf.serve.engine import load_model

    model, tokenizer = load_model(str(tiny_path), device="cpu", cache_size=4)
    session = ChatSession(model, tokenizer, max_tokens=8, block_length=8, threshold=None, out=io.StringIO())
    session.reply("hello")
    stats = session.stats()
    assert "offloading on" in stats and "hit_rate:" in stats and "hit rate per MoE layer:" in stats
    assert "last reply: 8 tokens" in stats
