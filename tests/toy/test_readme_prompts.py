"""Issue 67 item 6: the README's own examples asked the long-answer toy what it never learned (``Spell A4B0``:
two digits, trained on 5-7), so the server example streamed garbage. Every long-task prompt in the README and
the pages is answered right by the shipped toy, and the README says which lengths it was trained on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oled_hf.toy.long import LONG_CHECKPOINT
from oled_hf.toy.long.tasks import check_answer

ROOT = Path(__file__).resolve().parents[2]
PROMPT = re.compile(r"\b((?:Reverse|Spell) (?:[A-Z]\d)+)\b")
TEXTS = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "server.md", ROOT / "docs" / "cli.md"]


def prompts() -> list[str]:
    return sorted({p for path in TEXTS if path.is_file() for p in PROMPT.findall(path.read_text())})


@pytest.fixture(scope="module")
def long_toy():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    model = AutoModelForCausalLM.from_pretrained(LONG_CHECKPOINT).eval()
    return model, AutoTokenizer.from_pretrained(LONG_CHECKPOINT)


def test_the_readme_has_long_task_prompts_and_says_what_the_toy_was_trained_on():
    assert len(prompts()) >= 3
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "`Reverse` with 12-16 labelled digits" in text and "`Spell` with 5-7" in text


@pytest.mark.parametrize("prompt", prompts())
def test_every_documented_prompt_is_answered_right(prompt, long_toy):
    model, tok = long_toy
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    answer = tok.decode(model.generate(ids, max_new_tokens=48)[0, ids.shape[1]:], skip_special_tokens=True)
    assert check_answer(prompt, answer) is True, (prompt, answer)
