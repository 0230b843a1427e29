"""The toy task: 3-digit addition asked through LLaDA2's chat frame, with fixed train/held-out splits.

A problem is a pair ``(a, b)`` of 3-digit numbers; the question is ``"What is {a}+{b}?"`` and the
answer is the decimal sum (3 or 4 digits). The split is a property of the pair itself: a
symmetric integer hash puts ~1/32 of all pairs (and both orders ``a+b`` / ``b+a`` together) in the
held-out split and the rest in the train split, so the two are disjoint whatever the sizes and no
training seed can leak a held-out problem. Everything here is deterministic.

Encoded for the model, a problem is the chat-template prompt (25 tokens with the toy tokenizer),
then the answer digits, one EOS and EOS padding up to a fixed canvas length, the layout LLaDA2 is
trained on. Prompt ids are built arithmetically from token ids (fast enough to make every
training batch on the fly); ``tests/toy`` checks they equal ``apply_chat_template``.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..fileio import check_new_files, write_folder_atomically

LOW, HIGH = 100, 999  # operands: all 3-digit numbers, inclusive
HELDOUT_MODULUS = 32  # ~1/32 of pairs are held out (about 25k of 810k)
DATA_SEED = 20240  # fixes the held-out order and the multiple-choice distractors, not the split
MAX_ANSWER_DIGITS = 4
N_CHOICES = 4


def question_text(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def answer_text(a: int, b: int) -> str:
    return str(a + b)


def _pair_hash(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A symmetric integer hash (int64 arithmetic, wraps identically everywhere)."""
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    h = (lo * 1000 + hi) * 2654435761 % (1 << 32)
    h = (h ^ (h >> 15)) * 2246822519 % (1 << 32)
    return h ^ (h >> 13)


def is_heldout(a, b) -> torch.Tensor | bool:
    """True where the pair belongs to the held-out split (tensor in, tensor out; ints in, bool out)."""
    if isinstance(a, int) and isinstance(b, int):
        return bool(is_heldout(torch.tensor([a]), torch.tensor([b]))[0])
    return _pair_hash(torch.as_tensor(a), torch.as_tensor(b)) % HELDOUT_MODULUS == 0


@lru_cache(maxsize=1)
def _heldout_pairs() -> tuple[tuple[int, int], ...]:
    values = torch.arange(LOW, HIGH + 1)
    a = values.repeat_interleave(len(values))
    b = values.repeat(len(values))
    keep = is_heldout(a, b)
    pairs = list(zip(a[keep].tolist(), b[keep].tolist()))
    random.Random(DATA_SEED).shuffle(pairs)
    return tuple(pairs)


def heldout_pairs(n: int = 1000) -> list[tuple[int, int]]:
    """The first ``n`` held-out problems in a fixed shuffled order (same list for every caller)."""
    pairs = _heldout_pairs()
    if n > len(pairs):
        raise ValueError(f"n={n} exceeds the {len(pairs)} held-out problems")
    return list(pairs[:n])


def sample_train_pairs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` uniform train-split pairs (rejection of held-out pairs), reproducible from ``generator``."""
    a = torch.randint(LOW, HIGH + 1, (n,), generator=generator)
    b = torch.randint(LOW, HIGH + 1, (n,), generator=generator)
    bad = is_heldout(a, b)
    while bool(bad.any()):
        k = int(bad.sum())
        a[bad] = torch.randint(LOW, HIGH + 1, (k,), generator=generator)
        b[bad] = torch.randint(LOW, HIGH + 1, (k,), generator=generator)
        bad = is_heldout(a, b)
    return a, b


def train_pairs(n: int, seed: int = DATA_SEED) -> list[tuple[int, int]]:
    a, b = sample_train_pairs(n, torch.Generator().manual_seed(seed))
    return list(zip(a.tolist(), b.tolist()))


def choices_for(a: int, b: int) -> tuple[list[str], int]:
    """Four answer strings (the sum and three near misses of the same kind) and the correct index."""
    rng = random.Random(DATA_SEED * 1_000_003 + a * 1000 + b)
    s = a + b
    offsets = [-100, -10, -1, 1, 10, 100, 9, -9, 11, -11]
    wrong: list[int] = []
    for off in rng.sample(offsets, len(offsets)):
        if len(wrong) == N_CHOICES - 1:
            break
        if s + off > 0 and s + off not in wrong:
            wrong.append(s + off)
    label = rng.randrange(N_CHOICES)
    options = [str(v) for v in wrong]
    options.insert(label, str(s))
    return options, label


def record(a: int, b: int) -> dict:
    choices, label = choices_for(a, b)
    return {"question": question_text(a, b), "answer": answer_text(a, b), "choices": choices, "label": label}


def write_jsonl(out_dir: str | os.PathLike, n_train: int = 1000, n_heldout: int = 1000, *,
                overwrite: bool = False) -> dict[str, Path]:
    """``train.jsonl`` (few-shot pool) and ``test.jsonl`` (held-out) for lm-eval; returns the paths.

    ``out_dir`` may be missing (then its parent must exist); files already there are refused unless
    ``overwrite``. Both files are built in a temporary sibling folder and moved in together
    (:func:`~oled_hf.fileio.write_folder_atomically`), so a failure leaves the folder as it was.
    """
    names = {"train": "train.jsonl", "test": "test.jsonl"}
    out = check_new_files(out_dir, names.values(), overwrite=overwrite, field="out",
                          flag="overwrite=True (--overwrite)", create=True)
    splits = {"train": train_pairs(n_train), "test": heldout_pairs(n_heldout)}

    def build(folder: Path) -> None:
        for split, pairs in splits.items():
            (folder / names[split]).write_text("".join(json.dumps(record(a, b)) + "\n" for a, b in pairs))

    write_folder_atomically(build, out)
    return {split: out / name for split, name in names.items()}


@dataclass(frozen=True)
class ToyEncoding:
    """Token ids needed to lay problems out on the canvas without calling the tokenizer."""

    prefix: tuple[int, ...]  # chat frame up to the question text
    suffix: tuple[int, ...]  # after the question: role end, assistant header
    digits: tuple[int, ...]  # token id of "0" .. "9"
    plus: int
    question_mark: int
    what_is: tuple[int, ...]  # "What", " is", " "
    eos: int
    mask: int

    @property
    def prompt_length(self) -> int:
        return len(self.prefix) + len(self.what_is) + 3 + 1 + 3 + 1 + len(self.suffix)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ToyEncoding:
        marker = "What is 0+0?"
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": marker}], add_generation_prompt=True, tokenize=False
        )
        head, tail = text.split(marker)
        enc = lambda s: tuple(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
        digits = tuple(tokenizer.convert_tokens_to_ids(str(d)) for d in range(10))
        what_is = enc("What is ")
        return cls(
            prefix=enc(head), suffix=enc(tail), digits=digits, plus=tokenizer.convert_tokens_to_ids("+"),
            question_mark=tokenizer.convert_tokens_to_ids("?"), what_is=what_is,
            eos=tokenizer.eos_token_id, mask=tokenizer.mask_token_id,
        )

    def _digit_ids(self, n: torch.Tensor, width: int) -> torch.Tensor:
        """[N, width] token ids of the ``width`` decimal digits of ``n``, most significant first."""
        powers = 10 ** torch.arange(width - 1, -1, -1)
        return torch.tensor(self.digits)[(n[:, None] // powers) % 10]

    def prompts(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """[N, P] chat-template prompt ids for 3-digit ``a`` and ``b``."""
        n = a.shape[0]
        const = lambda ids: torch.tensor(ids, dtype=torch.long).expand(n, len(ids))  # noqa: E731
        return torch.cat(
            [const(self.prefix + self.what_is), self._digit_ids(a, 3), const((self.plus,)), self._digit_ids(b, 3),
             const((self.question_mark,) + self.suffix)], dim=1,
        )

    def answers(self, a: torch.Tensor, b: torch.Tensor, length: int) -> torch.Tensor:
        """[N, length] answer ids: the sum's digits, EOS, then EOS padding."""
        s = a + b
        if length < MAX_ANSWER_DIGITS + 1:
            raise ValueError(f"answer length {length} cannot hold {MAX_ANSWER_DIGITS} digits and an EOS")
        out = torch.full((a.shape[0], length), self.eos, dtype=torch.long)
        four = s >= 1000
        out[~four, :3] = self._digit_ids(s[~four], 3)
        out[four, :4] = self._digit_ids(s[four], 4)
        return out

    def canvases(self, a: torch.Tensor, b: torch.Tensor, canvas_length: int) -> tuple[torch.Tensor, int]:
        """[N, canvas_length] prompt + answer + EOS padding, and the prompt length."""
        prompt = self.prompts(a, b)
        return torch.cat([prompt, self.answers(a, b, canvas_length - prompt.shape[1])], dim=1), prompt.shape[1]


def main(argv: list[str] | None = None) -> None:
    """``python -m oled_hf.toy.data OUT [--n-train N] [--n-heldout N]``: write the lm-eval JSONL files."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out")
    parser.add_argument("--n-train", type=int, default=1000)
    parser.add_argument("--n-heldout", type=int, default=1000)
    parser.add_argument("--overwrite", action="store_true", help="replace train.jsonl / test.jsonl in OUT")
    args = parser.parse_args(argv)
    try:
        paths = write_jsonl(args.out, args.n_train, args.n_heldout, overwrite=args.overwrite)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
