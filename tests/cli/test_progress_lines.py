"""Issue 67 item 8: long commands say how far they are and how long is left, on stderr, in a log as on a terminal.

``make-tiny --preset mini`` printed nothing for its whole run; ``trace record`` counted whole prompts, so a log
got its first line only after the first prompt's many seconds. Here the progress lines are asked for at every
step (``interval=0``), as a log gets them every 10 s.
"""

from __future__ import annotations

import re
from functools import partial

from oled_hf import progress as progress_module
from oled_hf.cli.main import main

LINE = re.compile(r"^(?P<desc>[^:]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\S+), .* elapsed, .*, about .* left$")


def every_step(monkeypatch, module) -> None:
    monkeypatch.setattr(module, "progress", partial(progress_module.progress, interval=0))


def status_lines(err: str) -> list[re.Match]:
    return [m for m in map(LINE.match, err.splitlines()) if m]


def test_make_tiny_of_a_streamed_preset_shows_megabytes_and_time_left(tmp_path, capsys, monkeypatch):
    from oled_hf.checkpoints import streaming

    every_step(monkeypatch, streaming)
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "mini", "--layers", "2", "--num-experts", "16",
                 "--hidden-size", "256"]) == 0
    err = capsys.readouterr().err
    lines = status_lines(err)
    assert len(lines) >= 2 and {m["unit"] for m in lines} == {"MiB"} and {m["desc"] for m in lines} == {"writing m"}
    total = int(lines[0]["total"])
    assert [int(m["done"]) for m in lines] == sorted(int(m["done"]) for m in lines) and int(lines[-1]["done"]) < total
    assert f"writing m: done, {total}/{total} MiB in " in err


def test_make_tiny_quiet_prints_only_its_result(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "m"), "--preset", "mini", "--layers", "2", "--num-experts", "16",
                 "--hidden-size", "256", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("wrote mini checkpoint")


def test_trace_record_counts_blocks_with_an_estimate(tiny_path, tmp_path, capsys, monkeypatch):
    from oled_hf.cli import trace

    every_step(monkeypatch, trace)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\nthe sea\n")
    assert main(["trace", "record", "--model", str(tiny_path), "--prompts", str(prompts), "--out",
                 str(tmp_path / "t.trace"), "--max-new-tokens", "24", "--block-length", "8", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    lines = status_lines(err)
    assert lines and {m["unit"] for m in lines} == {"block"} and {m["desc"] for m in lines} == {"recording 2 prompts"}
    total = int(lines[0]["total"])
    assert total >= 6  # 3 blocks of new tokens per prompt at least, counted before the first generate
    assert f"recording 2 prompts: done, {total}/{total} block in " in err


def test_blocks_to_decode_counts_the_prompts_partial_block():
    from oled_hf.cli.trace import blocks_to_decode

    assert blocks_to_decode(prompt_length=8, max_new_tokens=24, block_length=8) == 3
    assert blocks_to_decode(prompt_length=5, max_new_tokens=24, block_length=8) == 4  # the prompt's last block too
    assert blocks_to_decode(prompt_length=5, max_new_tokens=3, block_length=8) == 1
