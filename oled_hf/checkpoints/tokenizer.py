"""A small, real byte-level BPE tokenizer with LLaDA2's special-token layout.

Tiny test checkpoints need a tokenizer that behaves like the real one (same special tokens at the
top of the vocab, same chat frame) without downloading anything, so we train one on a corpus the
repo ships. Training is deterministic: the same ``vocab_size`` always yields a byte-identical
``tokenizer.json``. The corpus supports vocab sizes up to roughly 5400.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..fileio import write_folder_atomically

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "corpus.txt"

MASK_TOKEN = "<|mask|>"
ROLE_END_TOKEN = "<|role_end|>"
EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|startoftext|>"
ROLE_OPEN_TOKEN = "<role>"
ROLE_CLOSE_TOKEN = "</role>"

# Appended in this order after the BPE vocab, so they occupy ids V-6 .. V-1.
SPECIAL_TOKENS: tuple[str, ...] = (
    ROLE_CLOSE_TOKEN,
    ROLE_OPEN_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    ROLE_END_TOKEN,
    MASK_TOKEN,
)
BYTE_ALPHABET_SIZE = 256
MIN_MERGES = 64
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS) + MIN_MERGES

# LLaDA2's chat frame; a system turn is always emitted so prompts look like the real model's.
CHAT_TEMPLATE = (
    "{{- '<role>SYSTEM</role>' -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- messages[0]['content'] + '\\n' -}}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{{- 'detailed thinking off<|role_end|>' -}}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '<role>HUMAN</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<role>ASSISTANT</role>' + message['content'] + '<|role_end|>' -}}"
    "{%- else -%}"
    "{{- raise_exception('Unsupported chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<role>ASSISTANT</role>' -}}"
    "{%- endif -%}"
)


def special_token_ids(vocab_size: int) -> dict[str, int]:
    """Ids of the special tokens for a vocab of ``vocab_size``; configs need them before any build."""
    ids = {tok: vocab_size - len(SPECIAL_TOKENS) + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return {
        "mask_token_id": ids[MASK_TOKEN],
        "role_end_token_id": ids[ROLE_END_TOKEN],
        "eos_token_id": ids[EOS_TOKEN],
        "pad_token_id": ids[EOS_TOKEN],
        "bos_token_id": ids[BOS_TOKEN],
        "role_open_token_id": ids[ROLE_OPEN_TOKEN],
        "role_close_token_id": ids[ROLE_CLOSE_TOKEN],
    }


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: need at least {MIN_VOCAB_SIZE} "
            f"({BYTE_ALPHABET_SIZE} bytes + {len(SPECIAL_TOKENS)} special tokens + {MIN_MERGES} merges)"
        )


def train_bpe(vocab_size: int) -> Tokenizer:
    """Train byte-level BPE to exactly ``vocab_size - 6`` entries and append the special tokens."""
    _check_vocab_size(vocab_size)
    bpe_size = vocab_size - len(SPECIAL_TOKENS)
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False so decode(encode(text)) == text with no leading-space artefacts.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([CORPUS_PATH.read_text(encoding="utf-8")], trainer=trainer)
    if tok.get_vocab_size() != bpe_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too large for the shipped corpus: BPE stopped at "
            f"{tok.get_vocab_size()} entries, wanted {bpe_size}"
        )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    _assert_special_layout(tok, vocab_size)
    return tok


# LLaDA2.0-mini's own ids (its config.json and generation defaults: EOS = pad 156892, mask 156895);
# the role and BOS tokens sit just below EOS.
OFFICIAL_SPECIAL_IDS = {ROLE_CLOSE_TOKEN: 156889, ROLE_OPEN_TOKEN: 156890, BOS_TOKEN: 156891, EOS_TOKEN: 156892,
                        ROLE_END_TOKEN: 156893, MASK_TOKEN: 156895}
OFFICIAL_BPE_SIZE = 4090  # what the shipped corpus trains to; every other id below the specials is reserved


def check_official_vocab_size(vocab_size: int) -> None:
    """Refuse a vocabulary without room for LLaDA2's official special ids (mask 156895): the writers call this
    before the first weight is written, not after minutes of them."""
    if vocab_size <= max(OFFICIAL_SPECIAL_IDS.values()):
        raise ValueError(f"vocab_size={vocab_size} is too small for LLaDA2's official special ids "
                         f"(mask {OFFICIAL_SPECIAL_IDS[MASK_TOKEN]}): need at least "
                         f"{max(OFFICIAL_SPECIAL_IDS.values()) + 1}")


def train_bpe_official(vocab_size: int) -> Tokenizer:
    """A tokenizer of exactly ``vocab_size`` ids with the special tokens at LLaDA2's official ids.

    Why: a real-size checkpoint keeps the official ``config.json`` ids (EOS 156892, mask 156895),
    but the shipped corpus trains BPE to ~4k entries. The ids between are reserved tokens
    ``<|reserved_N|>``: below the first special id they are BPE vocabulary entries no merge
    produces (never emitted by encoding, decoded as their text), above it added special tokens,
    as official tokenizers reserve theirs.
    """
    lowest = min(OFFICIAL_SPECIAL_IDS.values())
    check_official_vocab_size(vocab_size)
    bpe = train_bpe(OFFICIAL_BPE_SIZE + len(SPECIAL_TOKENS))
    data = json.loads(bpe.to_str())
    data["added_tokens"] = []
    vocab = data["model"]["vocab"]
    for token in SPECIAL_TOKENS:
        vocab.pop(token, None)
    vocab.update({f"<|reserved_{i}|>": i for i in range(len(vocab), lowest)})
    tok = Tokenizer.from_str(json.dumps(data))
    by_id = {i: t for t, i in OFFICIAL_SPECIAL_IDS.items()}
    tok.add_special_tokens([by_id.get(i, f"<|reserved_{i}|>") for i in range(lowest, vocab_size)])
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    for token, expected in OFFICIAL_SPECIAL_IDS.items():
        assert tok.token_to_id(token) == expected, (token, tok.token_to_id(token), expected)
    return tok


def _assert_special_layout(tok: Tokenizer, vocab_size: int) -> None:
    """The model config hard-codes these ids, so a silent shift would be a nasty bug."""
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    for offset, token in enumerate(SPECIAL_TOKENS):
        expected = vocab_size - len(SPECIAL_TOKENS) + offset
        assert tok.token_to_id(token) == expected, (token, tok.token_to_id(token), expected)


def build_tokenizer(out_dir: str | os.PathLike, vocab_size: int, *, seed: int = 0) -> PreTrainedTokenizerFast:
    """Train, save to ``out_dir`` and reload through ``AutoTokenizer`` (the path users take).

    ``seed`` is accepted for symmetry with the weight builders; BPE training has no randomness,
    so it does not change the result.
    """
    del seed
    return save_llada2_tokenizer(train_bpe(vocab_size), out_dir)


def build_official_tokenizer(out_dir: str | os.PathLike, vocab_size: int) -> PreTrainedTokenizerFast:
    """:func:`build_tokenizer` with the special tokens at LLaDA2's official ids (:func:`train_bpe_official`)."""
    return save_llada2_tokenizer(train_bpe_official(vocab_size), out_dir)


def save_llada2_tokenizer(tokenizer_object: Tokenizer, out_dir: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Wrap a trained ``tokenizers`` object with LLaDA2's special tokens and chat template, save, reload."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        # Registered so ``all_special_ids`` knows them; they are already special in tokenizer.json.
        extra_special_tokens=[ROLE_CLOSE_TOKEN, ROLE_OPEN_TOKEN, ROLE_END_TOKEN],
        # Cleanup would rewrite " ." to "." and break exact round trips.
        clean_up_tokenization_spaces=False,
        add_bos_token=False,
        add_eos_token=False,
        # generate() takes left-padded batches (as Transformers' text-generation pipeline pads), so
        # tok(batch, padding=True) must pad on the left without the caller asking.
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE

    def save(folder: Path) -> None:
        wrapped.save_pretrained(str(folder))
        portable_tokenizer_config(folder / "tokenizer_config.json")

    # Built in a temporary sibling folder, then moved in (the files replace theirs by name, a link
    # there is replaced, never written through): a failure leaves ``out_dir`` as it was.
    out = write_folder_atomically(save, out_dir)
    return AutoTokenizer.from_pretrained(str(out))


def portable_tokenizer_config(path: Path) -> None:
    """Rewrite Transformers 5's ``tokenizer_config.json`` in the spelling 4.x reads too (official checkpoints' own).

    5.x writes ``"tokenizer_class": "TokenizersBackend"`` (a class 4.x lacks: "Tokenizer class
    TokenizersBackend does not exist") and ``extra_special_tokens`` as a list (4.x reads that key
    as a dict of named tokens). ``PreTrainedTokenizerFast`` and ``additional_special_tokens`` are
    read by both, to the same ids and special tokens (checked with 4.57 and 5.23).
    """
    data = json.loads(path.read_text())
    if data.get("tokenizer_class") == "TokenizersBackend":
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = data.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        data["additional_special_tokens"] = extra
    elif extra is not None:
        data["extra_special_tokens"] = extra
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(path: str | os.PathLike, *, model=None, **kwargs):
    """``AutoTokenizer.from_pretrained`` whose errors on a damaged local folder name the file.

    The tokenizers library reports a corrupt ``tokenizer.json`` as a bare JSON error; checking the
    folder's JSON files first (and labelling any other failure with the folder) tells the user
    which file to fix. With ``model``, the tokenizer is also checked against the model's
    vocabulary and special ids (``check_tokenizer_matches``), so a mismatched pair fails at load
    instead of on every request.
    """
    tokenizer = _load_tokenizer(path, **kwargs)
    if model is not None:
        check_tokenizer_matches(tokenizer, model.config, getattr(model, "generation_config", None), path)
    return tokenizer


def _load_tokenizer(path: str | os.PathLike, **kwargs):
    from transformers import AutoTokenizer

    from ..modeling.checkpoint_files import CheckpointError, check_json_file

    folder = Path(path)
    if not folder.is_dir():
        return AutoTokenizer.from_pretrained(str(path), **kwargs)
    for name, what in (("tokenizer.json", "tokenizer file"), ("tokenizer_config.json", "tokenizer config"),
                       ("special_tokens_map.json", "special-tokens map")):
        check_json_file(folder / name, what)
    try:
        return AutoTokenizer.from_pretrained(str(path), **kwargs)
    except OSError:
        raise
    except Exception as error:  # tokenizers raises plain Exception for a malformed tokenizer.json
        raise CheckpointError(f"{folder}: the tokenizer (tokenizer.json, tokenizer_config.json) could not be "
                              f"loaded: {error}") from error


def check_tokenizer_matches(tokenizer, config, generation_config=None, source: str | os.PathLike = "") -> None:
    """Refuse a tokenizer that cannot be the model's own, naming the ids and sizes that disagree.

    Why: a tokenizer larger than ``vocab_size`` (or whose special ids lie beyond it) makes every
    prompt that uses those ids fail as if the client had sent bad input; one that lacks the
    model's own special ids (EOS, mask, pad) is a different vocabulary, so the model's ids decode
    to empty text and generation never stops. A tokenizer *smaller* than ``vocab_size`` is normal
    and allowed: official checkpoints pad the embedding above the tokenizer's length.
    """
    where = f"{source}: " if str(source) else ""
    vocab = config.vocab_size
    size = len(tokenizer)
    if size > vocab:
        raise ValueError(f"{where}the tokenizer has {size} tokens but the model's vocab_size is {vocab} (config.json): "
                         f"ids {vocab} to {size - 1} have no embedding. Use the tokenizer the checkpoint was trained "
                         "with (allowed: at most vocab_size tokens)")
    for name in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not 0 <= value < vocab:
            raise ValueError(f"{where}the tokenizer's {name}={value} is outside the model's vocabulary "
                             f"(allowed: 0 to {vocab - 1}, vocab_size={vocab} in config.json)")
    for origin, holder in (("config.json", config), ("generation_config.json", generation_config)):
        for name in ("mask_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(holder, name, None) if holder is not None else None
            ids = value if isinstance(value, (list, tuple)) else [value]
            for token_id in ids:
                if isinstance(token_id, int) and not isinstance(token_id, bool) and not 0 <= token_id < size:
                    raise ValueError(
                        f"{where}the model's {name}={token_id} ({origin}) is not a token of its tokenizer, which has "
                        f"{size} tokens: the tokenizer belongs to a different vocabulary (its ids would decode "
                        f"wrongly). Use the checkpoint's own tokenizer (allowed: ids 0 to {size - 1})")
