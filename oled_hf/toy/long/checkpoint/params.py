"""Resolve ``generate`` arguments against the model's ``generation_config`` and validate them.

Callers pass what Transformers callers pass (``max_new_tokens``, ``do_sample``, ``max_length``,
``stop_strings``...) plus the diffusion knobs (``block_length``, ``threshold``, ``steps``,
``editing_threshold``, ``max_post_steps``, ``decoding``); any of them may also live in
``generation_config.json``. Errors name the argument, its value and what is allowed, and are
raised before any forward runs.

Precedence: an explicit ``generate`` argument, then the named ``decoding`` preset (from the
arguments or ``generation_config``), then ``generation_config``, then ``DEFAULTS``. The presets
are LLaDA2.1's recommended modes (shared/docs/llada2.md §5.5: quality = threshold 0.7, edit 0.5,
post 16; speed = threshold 0.5, no editing, post 16). ``editing_threshold`` None disables editing,
the LLaDA2.0 decoder and the default; passing ``editing_threshold=None`` explicitly turns it off
even where the preset or ``generation_config`` enables it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from .commit import COMMIT_RULES

DEFAULTS = dict(block_length=32, threshold=0.95, steps=32, max_new_tokens=128, minimal_topk=1,
                eos_early_stop=False, do_sample=False, temperature=1.0, commit_rule="official",
                editing_threshold=None, max_post_steps=16)

DECODING_PRESETS: dict[str, dict] = {
    "quality": dict(threshold=0.7, editing_threshold=0.5, max_post_steps=16),
    "speed": dict(threshold=0.5, editing_threshold=None, max_post_steps=16),
}


@dataclass
class DiffusionParams:
    max_new_tokens: int
    block_length: int
    threshold: float
    steps: int
    minimal_topk: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    eos_early_stop: bool
    eos_token_ids: list[int]
    pad_token_id: int
    mask_token_id: int
    commit_rule: str
    use_cache: bool
    return_dict_in_generate: bool
    stop_strings: list[str] = field(default_factory=list)
    editing_threshold: float | None = None  # LLaDA2.1 token editing; None = off (LLaDA2.0)
    max_post_steps: int = 16  # iterations after a block has no masks left (editing only)
    decoding: str | None = None  # the preset these values came from, if any


def _get(name, kwargs, gen_config, preset=None):
    if kwargs.get(name) is not None:
        return kwargs.pop(name)
    kwargs.pop(name, None)
    if preset and name in preset:
        return preset[name]
    value = getattr(gen_config, name, None)
    return DEFAULTS.get(name) if value is None else value


def _preset(kwargs: dict, gen_config) -> tuple[str | None, dict]:
    """The named decoding preset (argument first, then generation_config) and its values."""
    name = kwargs.pop("decoding", None)
    if name is None:
        name = getattr(gen_config, "decoding", None)
    if name is None:
        return None, {}
    if name not in DECODING_PRESETS:
        raise ValueError(f"decoding={name!r} is invalid: allowed: {', '.join(DECODING_PRESETS)} (or None)")
    return name, DECODING_PRESETS[name]


def _editing_threshold(kwargs: dict, gen_config, preset: dict) -> float | None:
    """An explicit ``editing_threshold=None`` argument disables editing (unlike other None arguments)."""
    if "editing_threshold" in kwargs:
        return kwargs.pop("editing_threshold")
    if "editing_threshold" in preset:
        return preset["editing_threshold"]
    return getattr(gen_config, "editing_threshold", None)


def resolve_params(
    model_config, generation_config: GenerationConfig | None, prompt_length: int, kwargs: dict
) -> DiffusionParams:
    """Consume the keys this decoder understands from ``kwargs``; leftovers are reported by the caller."""
    gen = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    if "gen_length" in kwargs:  # the official LLaDA2 generate's name
        kwargs.setdefault("max_new_tokens", kwargs.pop("gen_length"))
    max_length = kwargs.pop("max_length", None)
    if kwargs.get("max_new_tokens") is None and max_length is not None:
        kwargs["max_new_tokens"] = max_length - prompt_length
    eos = _get("eos_token_id", kwargs, gen)
    if eos is None:
        eos = model_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    pad = _get("pad_token_id", kwargs, gen)
    pad = model_config.pad_token_id if pad is None else pad
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    mask = _get("mask_token_id", kwargs, gen)
    mask = model_config.mask_token_id if mask is None else mask
    stop = kwargs.pop("stop_strings", None) or getattr(gen, "stop_strings", None) or []
    use_cache = kwargs.pop("use_cache", None)
    decoding, preset = _preset(kwargs, gen)
    params = DiffusionParams(
        max_new_tokens=_get("max_new_tokens", kwargs, gen),
        block_length=_get("block_length", kwargs, gen),
        threshold=_get("threshold", kwargs, gen, preset),
        steps=_get("steps", kwargs, gen),
        minimal_topk=_get("minimal_topk", kwargs, gen),
        do_sample=bool(_get("do_sample", kwargs, gen)),
        temperature=_get("temperature", kwargs, gen),
        top_k=_get("top_k", kwargs, gen),
        top_p=_get("top_p", kwargs, gen),
        eos_early_stop=bool(_get("eos_early_stop", kwargs, gen)),
        eos_token_ids=eos_ids,
        pad_token_id=int(pad),
        mask_token_id=int(mask),
        commit_rule=_get("commit_rule", kwargs, gen),
        use_cache=True if use_cache is None else bool(use_cache),
        return_dict_in_generate=bool(_get("return_dict_in_generate", kwargs, gen)),
        stop_strings=[stop] if isinstance(stop, str) else list(stop),
        editing_threshold=_editing_threshold(kwargs, gen, preset),
        max_post_steps=_get("max_post_steps", kwargs, gen, preset),
        decoding=decoding,
    )
    validate_params(params, model_config, prompt_length)
    return params


def validate_params(p: DiffusionParams, model_config, prompt_length: int) -> None:
    def bad(name, value, allowed):
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")

    if not _is_int(p.block_length) or p.block_length <= 0:
        bad("block_length", p.block_length, "must be a positive integer")
    if not _is_number(p.threshold) or not 0.0 <= p.threshold <= 1.0:
        bad("threshold", p.threshold, "must be between 0 and 1 (inclusive)")
    if not _is_int(p.max_new_tokens) or p.max_new_tokens <= 0:
        bad("max_new_tokens", p.max_new_tokens, "must be a positive integer (number of tokens to generate)")
    if not _is_int(p.steps) or p.steps <= 0:
        bad("steps", p.steps, "must be a positive integer (denoising steps per block)")
    if not _is_int(p.minimal_topk) or p.minimal_topk <= 0:
        bad("minimal_topk", p.minimal_topk, "must be a positive integer")
    if p.do_sample and (p.temperature is None or p.temperature < 0):
        bad("temperature", p.temperature, "must be >= 0")
    if p.top_k is not None and p.top_k < 0:
        bad("top_k", p.top_k, "must be >= 0 (0 disables it)")
    if p.top_p is not None and not 0.0 < p.top_p <= 1.0:
        bad("top_p", p.top_p, "must be in (0, 1]")
    if p.editing_threshold is not None and (
        isinstance(p.editing_threshold, bool) or not isinstance(p.editing_threshold, (int, float))
        or not 0.0 <= p.editing_threshold <= 1.0
    ):
        bad("editing_threshold", p.editing_threshold, "must be None (no editing) or between 0 and 1 (inclusive)")
    if isinstance(p.max_post_steps, bool) or not isinstance(p.max_post_steps, int) or p.max_post_steps < 0:
        bad("max_post_steps", p.max_post_steps, "must be an integer >= 0 (editing iterations after a block's masks)")
    if p.commit_rule not in COMMIT_RULES:
        bad("commit_rule", p.commit_rule, f"allowed: {', '.join(COMMIT_RULES)}")
    vocab = model_config.vocab_size
    if not 0 <= p.mask_token_id < vocab:
        bad("mask_token_id", p.mask_token_id, f"must be a token id below vocab_size={vocab}")
    limit = model_config.max_position_embeddings
    if prompt_length > limit:
        raise ValueError(
            f"prompt has {prompt_length} tokens, longer than max_position_embeddings={limit}; shorten the prompt"
        )
    total = -(-(prompt_length + p.max_new_tokens) // p.block_length) * p.block_length
    if total > limit:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + max_new_tokens={p.max_new_tokens}, rounded up to whole blocks of "
            f"{p.block_length}, needs {total} positions but max_position_embeddings={limit}; "
            f"allowed max_new_tokens here: at most {limit // p.block_length * p.block_length - prompt_length}"
        )


def _is_int(value) -> bool:
    """An integer that is not a bool: ``max_new_tokens=True`` is a caller's mistake, not 1."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_inputs(input_ids, attention_mask) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate ``input_ids`` / ``attention_mask`` before anything runs; returns them as 2-D long tensors.

    Why here: the decoder would otherwise cut prompts with a short or non-0/1 mask, return float
    ids, or fail deep inside with messages that name neither argument.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be a torch.Tensor of token ids; got {type(input_ids).__name__}")
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(f"input_ids must be an integer tensor of token ids (torch.long); got dtype {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 1:
            attention_mask = attention_mask.unsqueeze(0)
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, prompt_length] (or 1-D for one prompt); "
                         f"got shape {list(input_ids.shape)}")
    if input_ids.shape[0] == 0:
        raise ValueError("input_ids has an empty batch (shape [0, ...]): pass at least one prompt")
    if input_ids.shape[1] == 0:
        raise ValueError(f"input_ids has 0 tokens per row (shape {list(input_ids.shape)}): "
                         "block diffusion decodes after a non-empty prompt")
    if attention_mask is None:
        return input_ids.long(), None
    if not isinstance(attention_mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a torch.Tensor like input_ids; got {type(attention_mask).__name__}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {list(attention_mask.shape)} but input_ids has "
                         f"{list(input_ids.shape)}: they must match (one 0/1 entry per prompt token)")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        odd = sorted({float(v) for v in attention_mask.unique().tolist()} - {0.0, 1.0})[:5]
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (prompt token); found {odd}")
    return input_ids.long(), attention_mask.long()


def check_prompt_tokens(prompts: list[torch.Tensor], vocab_size: int, mask_token_id: int) -> None:
    """Every real prompt token must be a vocabulary id and not the mask token.

    A mask token in the prompt would be decoded (overwritten) where it shares a block with the
    generation and fed as-is elsewhere; an id outside the vocabulary fails in the embedding with
    a message that names nothing.
    """
    for i, row in enumerate(prompts):
        outside = (row < 0) | (row >= vocab_size)
        if bool(outside.any()):
            values = sorted(set(row[outside].tolist()))[:5]
            raise ValueError(f"input_ids row {i} holds token id(s) {values} outside the vocabulary "
                             f"(allowed: 0 to {vocab_size - 1}, vocab_size={vocab_size})")
        where = torch.nonzero(row == mask_token_id).flatten().tolist()
        if where:
            raise ValueError(f"input_ids row {i} contains mask_token_id={mask_token_id} at prompt position(s) "
                             f"{where[:5]}: the prompt may not hold the mask token (generate decodes only the "
                             "new tokens; pass a different mask_token_id if this id is a real token)")
