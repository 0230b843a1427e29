"""``oled-moe demo``: streams the offloaded answer block by block and matches full residency."""

from oled_hf.cli.demo import BlockPrinter, _check_sum


def test_demo_streams_blocks_and_matches_resident(tiny_path, capsys):
    from oled_hf.cli.main import main

    code = main(["demo", "--model", str(tiny_path), "--prompt", "hello", "--max-new-tokens", "16",
                 "--block-length", "8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "streaming (offloaded, blocks separated by |)" in out
    assert "same tokens as resident: yes" in out and "expert hit rate" in out


def test_block_printer_skips_the_prompt(tiny_tokenizer, capsys):
    import torch

    printer = BlockPrinter(tiny_tokenizer)
    ids = tiny_tokenizer("ab", add_special_tokens=False)["input_ids"]
    printer.put(torch.tensor([[1, 2, 3]]))
    printer.put(torch.tensor(ids))
    printer.put(torch.tensor(ids))
    printer.end()
    assert capsys.readouterr().out == "ab|ab\n"


def test_check_sum_knows_the_long_tasks():
    assert _check_sum("What is 1+2?", "3") == "  (correct)"
    assert _check_sum("Reverse 123", "321") == "  (correct)"
    assert _check_sum("Count 3 terms from 5 by 2", "5,7,8") == "  (wrong)"
    assert _check_sum("Tell me about the sea.", "waves") == ""
