"""The toy task's tokenizer: byte-level BPE where every digit is its own token.

A real ``tokenizer.json`` (loads with ``AutoTokenizer``) with LLaDA2's six special tokens at the
top of the vocab in the same order as ``oled_hf.checkpoints.tokenizer`` and LLaDA2's chat
template. A ``Digits(individual_digits=True)`` pre-tokenizer runs before ByteLevel, so numbers are
always split into single-digit tokens; BPE is trained on the chat frame and the question words
only, so each frame word ("SYSTEM", " thinking", "What", ...) is one token and the prompt stays
short. Training has no randomness: the same corpus always yields the same file.
"""

from __future__ import annotations

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..checkpoints.tokenizer import SPECIAL_TOKENS

# Every word the chat frame and the questions use; repeated so each merge clears min_frequency.
_WORDS = ("SYSTEM", "HUMAN", "ASSISTANT", "detailed thinking off", "What is 0+0?")
_CORPUS_REPEATS = 4


def _corpus(words: tuple[str, ...]) -> list[str]:
    return [line for _ in range(_CORPUS_REPEATS) for line in words]


def train_toy_bpe(words: tuple[str, ...] = _WORDS) -> Tokenizer:
    """Byte-level BPE with single-digit numbers, then the special tokens at ids V-6 .. V-1.

    ``words`` is the merge corpus: every word in it becomes one token (the long-answer toy passes
    its own questions' words); anything else is spelled in bytes.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,  # never reached: training stops when every corpus word is one token
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(words), trainer=trainer)
    base = tok.get_vocab_size()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    for offset, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == base + offset, (token, tok.token_to_id(token))
    return tok


def build_toy_tokenizer(out_dir: str | os.PathLike, words: tuple[str, ...] = _WORDS):
    """Save the toy tokenizer (tokenizer.json, tokenizer_config.json, chat template) and reload it."""
    from ..checkpoints.tokenizer import save_llada2_tokenizer

    return save_llada2_tokenizer(train_toy_bpe(words), out_dir)
