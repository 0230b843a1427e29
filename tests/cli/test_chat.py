"""``oled-moe chat``: scripted through a pipe, and its session and model-choice logic in process."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

ARGS = ["--max-new-tokens", "16", "--block-length", "8"]


def _greedy_reply(model, tok, history, max_new_tokens=16):
    inputs = tok.apply_chat_template(history, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, block_length=8)
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


def test_chat_rejects_bad_options(capsys, tiny_path):
    from oled_hf.cli import chat

    assert chat.main(["--model", str(tiny_path), "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens 0 is invalid" in capsys.readouterr().err


def test_stats_with_offloading(tiny_path):
    from oled_hf.cli.chat import ChatSession
    from oled_hf.serve.engine import load_model

    model, tokenizer = load_model(str(tiny_path), device="cpu", cache_size=4)
    session = ChatSession(model, tokenizer, max_tokens=8, block_length=8, threshold=None, out=io.StringIO())
    session.reply("hello")
    lines = session.stats().splitlines()
    total = model.offload_stats()["total"]
    assert lines[0].startswith("last reply: 8 tokens")
    assert lines[1] == ("expert cache since load: policy learned, 12 slots (4.0 per MoE layer) on cpu; CPU compute off "
                        "(auto: no accelerator, host and device are the same cores; every miss is copied)")
    assert lines[2:] == [f"  hit rate      {total['hit_rate']:.3f}  ({total['hits']} hits, {total['misses']} misses)",
                         f"  bytes copied  {total['bytes_copied'] / 2**20:.2f} MiB  ({total['evictions']} evictions)",
                         "  CPU share     0.000  (0 CPU expert-tokens)", f"  forwards      {total['forwards']}",
                         "  (/stats layers: per MoE layer)"]
    layers = session.stats(per_layer=True).splitlines()[6:]
    assert layers[0] == "  layer  slots  hit rate  MiB copied  CPU expert-tokens   (layer: decoder layer, from 1)"
    # MoE layers are numbered as the model's decoder layers (from 1), past the dense ones, not 0, 1, 2
    first = model.config.first_k_dense_replace + 1
    assert len(layers) == 1 + model.config.num_moe_layers and layers[1].split()[:2] == [str(first), "4"]
    assert [int(row.split()[0]) for row in layers[1:]] == list(range(first, model.config.num_hidden_layers + 1))


def test_chat_with_the_default_toy_answers_every_message():
    """The toy knows single-turn prompts only and says so in its config: chat sends each message on its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oled_hf.cli.common import default_model_path

    toy = default_model_path()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "oled_hf.cli.chat", "--max-new-tokens", "8"], timeout=120, env=env,
                          input="What is 123+456?\nWhat is 200+300?\n", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert ("note: this model was trained on single-turn prompts (oled_single_turn in its config.json): each "
            "message is sent without the earlier turns") in proc.stderr.splitlines()
    model, tok = AutoModelForCausalLM.from_pretrained(toy).eval(), AutoTokenizer.from_pretrained(toy)
    alone = [_greedy_reply(model, tok, [{"role": "user", "content": q}], max_new_tokens=8)
             for q in ("What is 123+456?", "What is 200+300?")]
    assert proc.stdout.splitlines() == alone and all(alone)  # the second reply is not empty
    # (a checkpoint that does not declare it keeps the history: test_session_keeps_the_conversation)


def test_invalid_utf8_on_stdin_skips_that_line(tiny_path, tiny_model, tiny_tokenizer):
    """Issue 23 item 10: one stray byte used to end a piped session with a UnicodeDecodeError traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-m", "oled_hf.cli.chat", "--model", str(tiny_path), *ARGS],
                          input=b"/clear\nca\xffb\n/clear\nbye\n", capture_output=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    after = _greedy_reply(tiny_model, tiny_tokenizer, [{"role": "user", "content": "bye"}])
    assert proc.stdout.decode() == "(conversation cleared)\n(conversation cleared)\n" + after + "\n"
    assert ("error: input line 2: not valid utf-8 text (byte 0xff at position 2); the line was skipped"
            in proc.stderr.decode())
    assert "Traceback" not in proc.stderr.decode()


def test_piped_lines_decode_each_line_on_its_own():
    from oled_hf.cli.chat import piped_lines

    stdin = io.TextIOWrapper(io.BytesIO("héllo\n".encode() + b"\xff\xfe\nok\n"), encoding="utf-8")
    err = io.StringIO()
    assert list(piped_lines(stdin, err)) == ["héllo\n", "ok\n"]
    assert err.getvalue() == ("error: input line 2: not valid utf-8 text (byte 0xff at position 0); the line was "
                              "skipped\n")
    assert list(piped_lines(io.StringIO("a\nb"), err)) == ["a\n", "b"]  # already text: passed through


def test_system_names_a_whole_system(tiny_path, capsys):
    """``--system`` loads the system it names; a prefetch part or a missing budget is exit 2 naming the fault, before
    anything is loaded; the old spellings ``--offload-system``/``--policy`` say once what to write instead."""
    from oled_hf.cli import chat
    from oled_hf.serve.engine import load_model

    model, _ = load_model(str(tiny_path), device="cpu", cache_size=4, system="lru-full")
    stats = model.offload_stats()  # lru-full is lru+cpu+reuse+adaptive; with no accelerator every miss is copied
    assert stats["policy"] == "lru" and stats["system"] == "lru+copy+adaptive"
    capsys.readouterr()
    for argv, message in ((["--system", "lru+gate"], "its prefetch part 'gate' reads the next layer's "
                                                      "predicted routes"),
                          (["--system", "lru+nope"], "unknown part 'nope'"),
                          (["--system", "lru"], "--system needs a budget, --cache-size, --cache-ratio"),
                          (["--offload-system", "lru"], "oled-moe chat: warning: --offload-system is deprecated and "
                                                        "will be removed; use --system\n"),
                          (["--policy", "lru"], "oled-moe chat: warning: --policy is deprecated and will be removed; "
                                                "use --system lru+cpu+adaptive (the system --policy lru runs)\n"
                                                "oled-moe chat: error: --system needs a budget")):
        try:
            code = chat.main(["--model", str(tiny_path), *argv])
        except SystemExit as e:  # argparse's own type errors
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Loading weights" not in err, (argv, err)


def test_old_spellings_still_parse_with_one_warning_line(capsys):
    """Issue 67 item 3: one name per concept; the old names are deprecated aliases."""
    from oled_hf.cli.main import build_parser

    def parse(*argv):
        args = build_parser(list(argv)).parse_args(list(argv))
        return args, capsys.readouterr().err

    args, err = parse("chat", "--max-tokens", "7")
    assert args.max_new_tokens == 7
    assert err == ("oled-moe chat: warning: --max-tokens is deprecated and will be removed; use --max-new-tokens\n")
    args, err = parse("chat", "--system", "You are terse.")
    assert (args.system, args.system_prompt) == (None, "You are terse.")
    assert err == ("oled-moe chat: warning: --system TEXT for the system prompt is deprecated and will be removed; "
                   "use --system-prompt TEXT\n")
    args, err = parse("chat", "--system", "lru+cpu", "--system-prompt", "Be brief.")
    assert (args.system, args.system_prompt, err) == ("lru+cpu", "Be brief.", "")
    args, err = parse("serve", "--policy", "tide", "--max-num-seqs", "3")
    assert (args.system, args.max_batch_size) == ("tide+cpu+adaptive", 3)
    assert err == ("oled-moe serve: warning: --policy is deprecated and will be removed; use --system "
                   "tide+cpu+adaptive (the system --policy tide runs)\n")
    args, err = parse("serve", "--offload-system", "lru-full")
    assert args.system == "lru-full" and err.count("\n") == 1 and "use --system" in err
    args, err = parse("benchmark", "--gen-length", "9")
    assert args.max_new_tokens == 9 and err == ("oled-moe benchmark: warning: --gen-length is deprecated and will be "
                                                "removed; use --max-new-tokens\n")
    args, err = parse("trace", "replay", "t.trace", "--cache-size", "4", "--policy", "lru")
    assert args.policy == ["lru"] and err == ("oled-moe trace replay: warning: --policy is deprecated and will be "
                                              "removed; use --system lru+cpu+adaptive (the systems it replays)\n")
    for argv in (["chat", "--system", "nope"], ["serve", "--policy", "prefetch"]):
        with pytest.raises(SystemExit):
            parse(*argv)
        assert capsys.readouterr().err.count("error:") == 1


@pytest.mark.parametrize("command", ["demo", "chat", "benchmark", "trace record"])
def test_every_command_names_the_answer_length_max_new_tokens(command):
    from oled_hf.cli.main import build_parser

    argv = command.split()
    parser = build_parser(argv)
    for word in argv:
        parser = next(a for a in parser._actions if a.dest in ("command", "trace_command")).choices[word]
    assert any("--max-new-tokens" in a.option_strings for a in parser._actions)

