"""The shipped BPE tokenizer must match LLaDA2's special-token layout and chat frame, offline."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from oled_hf.checkpoints.tokenizer import (  # noqa: E402
    MIN_VOCAB_SIZE,
    build_tokenizer,
    special_token_ids,
)

V = 512
DEFAULT_SYSTEM = "<role>SYSTEM</role>detailed thinking off<|role_end|>"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(out, V)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return AutoTokenizer.from_pretrained(str(tok_dir))


def test_special_token_ids_layout():
    ids = special_token_ids(V)
    assert ids["mask_token_id"] == 511
    assert ids["role_end_token_id"] == 510
    assert ids["eos_token_id"] == ids["pad_token_id"] == 509
    assert ids["bos_token_id"] == 508
    assert ids["role_open_token_id"] == 507
    assert ids["role_close_token_id"] == 506


def test_saved_files(tok_dir):
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tok_dir / name).is_file(), name


def test_autotokenizer_ids(tok):
    assert len(tok) == V
    assert tok.eos_token_id == 509
    assert tok.pad_token_id == 509
    assert tok.mask_token_id == 511
    assert tok.bos_token_id == 508
    assert tok.convert_tokens_to_ids(["</role>", "<role>", "<|role_end|>"]) == [506, 507, 510]
    assert {506, 507, 508, 509, 510, 511} <= set(tok.all_special_ids)
    # Ordinary text never maps onto the reserved top-of-vocab ids.
    assert max(tok.encode("The quick brown fox jumps over the lazy dog.")) < V - 6


def test_round_trip(tok):
    text = "Hello,  world!\n  12+34=46\tdef f(x): return x ** 2  # done .\n caf\u00e9 \U0001f600"
    ids = tok.encode(text)
    assert ids[0] != tok.bos_token_id  # no BOS is added automatically
    assert tok.decode(ids) == text


def test_skip_special_tokens(tok):
    ids = tok.encode("<role>HUMAN</role>hi<|role_end|><|mask|><|endoftext|>")
    assert ids[0] == 507 and ids[-3:] == [510, 511, 509]
    assert tok.decode(ids, skip_special_tokens=True) == "HUMANhi"


def test_chat_template_default_system(tok):
    out = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert out == DEFAULT_SYSTEM + "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>"


def test_chat_template_with_system_and_history(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
    ]
    out = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out == (
        "<role>SYSTEM</role>Be brief.\ndetailed thinking off<|role_end|>"
        "<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>hello<|role_end|>"
        "<role>HUMAN</role>2+2?<|role_end|><role>ASSISTANT</role>"
    )


def test_chat_template_without_generation_prompt(tok):
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert out == DEFAULT_SYSTEM + "<role>HUMAN</role>hi<|role_end|>"


def test_chat_template_rejects_unknown_role(tok):
    with pytest.raises(Exception, match="tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build_tokenizer(a, V, seed=0)
    build_tokenizer(b, V, seed=1)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


def test_larger_vocab_keeps_layout(tmp_path):
    tok = build_tokenizer(tmp_path, 4096)
    assert len(tok) == 4096
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (4093, 4093, 4095)


def test_too_small_vocab_raises(tmp_path):
    with pytest.raises(ValueError, match="vocab_size") as err:
        build_tokenizer(tmp_path, 300)
    assert str(MIN_VOCAB_SIZE) in str(err.value)


# ---- issue 37.4: padding side and a prompt-free load ---------------------------------------------------------
SHIPPED = ("oled_hf/toy/checkpoint", "oled_hf/toy/long/checkpoint", "oled_hf/toy/deep/checkpoint")
PROMPT_TEXT = "Do you wish to run the custom code"


def test_written_tokenizer_pads_on_the_left(tok_dir, tok):
    import json

    assert json.loads((tok_dir / "tokenizer_config.json").read_text())["padding_side"] == "left"
    batch = tok(["hi", "a longer prompt here"], padding=True)
    assert tok.padding_side == "left" and batch["attention_mask"][0][0] == 0 and batch["attention_mask"][0][-1] == 1


def test_padded_batch_from_the_tokenizer_generates(tiny_model, tiny_tokenizer):
    """tok(batch, padding=True) then generate raised "not left-padded" while the tokenizer padded on the right."""
    batch = tiny_tokenizer(["hi", "a longer prompt here"], padding=True, return_tensors="pt")
    out = tiny_model.generate(**batch, max_new_tokens=8, block_length=8)
    assert out.shape[0] == 2 and out.shape[1] > batch["input_ids"].shape[1]


@pytest.mark.parametrize("folder", SHIPPED)
def test_shipped_toys_pad_on_the_left(folder):
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / folder
    assert json.loads((path / "tokenizer_config.json").read_text())["padding_side"] == "left"
    assert AutoTokenizer.from_pretrained(str(path)).padding_side == "left"


def _load_in_subprocess(code: str, folder: str) -> tuple[str, str]:
    """Run ``code`` in a fresh interpreter with stdin closed: (stdout, stderr)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, folder], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


@pytest.mark.parametrize("code", [
    "import sys, oled_hf; from transformers import AutoTokenizer; print(AutoTokenizer.from_pretrained(sys.argv[1])"
    ".padding_side)",
    "import sys; from transformers import AutoTokenizer; print(AutoTokenizer.from_pretrained(sys.argv[1], "
    "trust_remote_code=False).padding_side)",
], ids=["oled_hf-imported", "plain-transformers"])
def test_autotokenizer_loads_without_a_prompt(tiny_path, code):
    out, err = _load_in_subprocess(code, str(tiny_path))
    assert PROMPT_TEXT not in out + err and out.splitlines()[-1] == "left"


@pytest.mark.parametrize("folder", ["tiny", *SHIPPED])
def test_tokenizer_config_is_spelled_as_transformers_4_reads_it(folder, tiny_path):
    """Issue 67 item 5: Transformers 4.57 refused a make-tiny tokenizer ("Tokenizer class TokenizersBackend does not
    exist"), and reads ``extra_special_tokens`` as a dict of named tokens. The 4.x spelling reads the same in 5.x."""
    import json
    from pathlib import Path

    path = tiny_path if folder == "tiny" else Path(__file__).resolve().parents[2] / folder
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["additional_special_tokens"] == ["</role>", "<role>", "<|role_end|>"]
    assert not isinstance(config.get("extra_special_tokens"), list)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert {"</role>", "<role>", "<|role_end|>", "<|mask|>", "<|endoftext|>"} <= set(tok.all_special_tokens)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)["input_ids"]
    assert tok.decode(ids).endswith("<role>HUMAN</role>hi<|role_end|><role>ASSISTANT</role>")
