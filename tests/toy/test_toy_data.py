import json

import torch
from transformers import AutoTokenizer

from oled_hf.checkpoints.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS
from oled_hf.toy import data
from oled_hf.toy.tokenizer import build_toy_tokenizer


def test_heldout_split_is_fixed_and_disjoint_from_train():
    first = data.heldout_pairs(300)
    assert first == data.heldout_pairs(300)
    assert first[:3] == [(351, 976), (890, 271), (222, 210)]  # pinned: evaluations stay comparable
    assert len(set(first)) == 300
    a = torch.tensor([x for x, _ in first])
    b = torch.tensor([y for _, y in first])
    assert bool(data.is_heldout(a, b).all()) and bool(data.is_heldout(b, a).all())  # both orders held out
    ta, tb = data.sample_train_pairs(20000, torch.Generator().manual_seed(3))
    assert not bool(data.is_heldout(ta, tb).any())
    assert set(zip(ta.tolist(), tb.tolist())).isdisjoint(data.heldout_pairs(len(data._heldout_pairs())))
    assert int(ta.min()) >= 100 and int(tb.max()) <= 999


def test_train_sampling_is_deterministic_per_seed():
    x = data.sample_train_pairs(64, torch.Generator().manual_seed(7))
    y = data.sample_train_pairs(64, torch.Generator().manual_seed(7))
    z = data.sample_train_pairs(64, torch.Generator().manual_seed(8))
    assert all(torch.equal(u, v) for u, v in zip(x, y))
    assert not torch.equal(x[0], z[0])
    assert data.train_pairs(10) == data.train_pairs(10)


def test_records_and_jsonl(tmp_path):
    rec = data.record(351, 976)
    assert rec["question"] == "What is 351+976?" and rec["answer"] == "1327"
    assert len(rec["choices"]) == 4 and len(set(rec["choices"])) == 4
    assert rec["choices"][rec["label"]] == "1327"
    assert data.record(351, 976) == rec
    paths = data.write_jsonl(tmp_path, n_train=20, n_heldout=30)
    rows = [json.loads(line) for line in paths["test"].read_text().splitlines()]
    assert len(rows) == 30 and rows[0] == rec
    train_rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    assert {r["question"] for r in train_rows}.isdisjoint({r["question"] for r in rows})
    assert paths["test"].read_text() == data.write_jsonl(tmp_path / "again", 20, 30)["test"].read_text()


def test_toy_tokenizer(tmp_path):
    tok = build_toy_tokenizer(tmp_path / "a")
    build_toy_tokenizer(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    v = len(tok)
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(v - 6, v))
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.mask_token == "<|mask|>"
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.convert_ids_to_tokens(tok("1327")["input_ids"]) == ["1", "3", "2", "7"]
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 351+976?"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert len(ids) == 25
    assert tok.decode(ids) == (
        "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>What is 351+976?<|role_end|>"
        "<role>ASSISTANT</role>"
    )


def test_encoding_matches_chat_template(tmp_path):
    tok = build_toy_tokenizer(tmp_path)
    enc = data.ToyEncoding.from_tokenizer(tok)
    a, b = data.sample_train_pairs(6, torch.Generator().manual_seed(0))
    a[0], b[0] = 999, 999
    canvases, p = enc.canvases(a, b, 32)
    assert p == enc.prompt_length == 25 and canvases.shape == (6, 32)
    for i in range(6):
        q = data.question_text(int(a[i]), int(b[i]))
        ref = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        ref = ref["input_ids"] if hasattr(ref, "keys") else ref
        assert canvases[i, :p].tolist() == list(ref)
        answer = canvases[i, p:].tolist()
        digits = tok(data.answer_text(int(a[i]), int(b[i])))["input_ids"]
        assert answer == digits + [tok.eos_token_id] * (7 - len(digits))


def test_shipped_jsonl_is_current(tmp_path):
    from oled_hf.toy import TOY_DATA_DIR

    fresh = data.write_jsonl(tmp_path)
    for name, path in fresh.items():
        assert (TOY_DATA_DIR / f"{name}.jsonl").read_text() == path.read_text()
