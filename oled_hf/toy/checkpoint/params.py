"""Resolve ``generate`` arguments against the model's ``generation_config`` and validate them.

Callers pass what Transformers callers pass (``max_new_tokens``, ``do_sample``, ``max_length``,
``stop_strings``...) plus the diffusion knobs (``block_length``, ``threshold``, ``steps``,
``editing_threshold``, ``max_post_steps``, ``decoding``); any of them may also live in
``generation_config.json``. Errors name the argument, its value and what is allowed, and are
raised before any forward runs.

Precedence: an explicit ``generate`` argument, then the named ``decoding`` preset (from the
arguments or ``generation_config``), then ``generation_config``, then ``DEFAULTS``. The presets
are LLaDA2.1's recommended modes (the LLaDA2.1 model card, shared/docs/llada2.md §5.5: quality =
threshold 0.7, edit 0.5, post 16; speed = threshold 0.5, edit 0.0, post 16: speed mode lowers the
mask-to-token threshold and relies on token-to-token editing to repair drafts).
``editing_threshold`` None disables editing, the LLaDA2.0 decoder and the default; passing
``editing_threshold=None`` explicitly turns it off even where the preset or ``generation_config``
enables it.

Every value is checked wherever it comes from; one that came from ``generation_config`` says so
(``block_length=0 (from generation_config) is invalid``), and :func:`check_generation_config`
runs the same checks when a checkpoint's ``generation_config.json`` is loaded.

Transformers' own controls, as block diffusion reads them (the decoder applies them, see
``generation_oled_llada2``): ``repetition_penalty``, ``min_new_tokens`` / ``min_length``,
``logits_processor`` and ``stopping_criteria`` are implemented; ``renormalize_logits`` and
``bos_token_id`` are accepted because they change nothing here (confidences are softmax
probabilities of the processed logits already; a prompt is always given). Every other Transformers
generation option (``output_scores``, ``no_repeat_ngram_size``, ``length_penalty``...) is accepted
only at its neutral value (None, or Transformers' default such as ``output_scores=False``) and
raises otherwise (:func:`pop_generation_options`); any other leftover argument raises Transformers'
own "not used by the model" error (:func:`check_unused_kwargs`), so a typo such as
``max_new_token=`` fails as it does in Transformers.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from .commit import COMMIT_RULES

DEFAULTS = dict(block_length=32, threshold=0.95, steps=32, max_new_tokens=128, minimal_topk=1,
                eos_early_stop=False, do_sample=False, temperature=1.0, commit_rule="official",
                editing_threshold=None, max_post_steps=16, num_to_transfer=1, repetition_penalty=1.0,
                min_new_tokens=0)

DECODING_PRESETS: dict[str, dict] = {
    "quality": dict(threshold=0.7, editing_threshold=0.5, max_post_steps=16),
    "speed": dict(threshold=0.5, editing_threshold=0.0, max_post_steps=16),
}

# The most post steps (editing-only iterations after a block's last mask) a block may take: 16 times
# the LLaDA2.1 model card's default of 16. Each post step is one full forward of the block, and an
# iteration that edits nothing ends the block, so a block still editing after 16 post steps is
# oscillating; 256 leaves room to study that while keeping a block's worst case bounded
# (block_length + 256 forwards) instead of letting ``max_post_steps=10**9`` run for ever.
MAX_POST_STEPS = 256
# Below this, logits / temperature overflows float32 (1e-300 gives inf, then NaN probabilities):
# the same floor as the server's (oled_hf.serve.protocol.MIN_TEMPERATURE). 0 means greedy.
MIN_TEMPERATURE = 1e-2
# repetition_penalty divides positive logits, and logits are fp32 whatever the model's dtype: a penalty
# whose reciprocal overflows fp32 would turn every one into +inf. Accepted penalties are also clamped
# into fp32's finite range where they are applied (generation_oled_llada2.repetition_penalty).
MIN_REPETITION_PENALTY = 1.0 / float(torch.finfo(torch.float32).max)
GENERATION_CONFIG = "generation_config"


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
    num_to_transfer: int = 1  # editing mode: fewest masks committed per iteration (LLaDA2.1's rule)
    decoding: str | None = None  # the preset these values came from, if any
    repetition_penalty: float = 1.0  # Transformers' semantics over prompt + committed tokens; 1.0 = off
    min_new_tokens: int = 0  # EOS is banned at new-token indices below this (min_length folded in)
    logits_processor: list[Callable] = field(default_factory=list)  # (input_ids, scores) -> scores
    stopping_criteria: list[Callable] = field(default_factory=list)  # (input_ids, scores) -> bool [rows]
    # where each value came from when that was generation_config (error messages say so)
    from_config: set[str] = field(default_factory=set)


def _get(name, kwargs, gen_config, preset=None, from_config: set | None = None):
    """Argument, else preset, else ``generation_config``, else ``DEFAULTS``; records in
    ``from_config`` the names whose value came from ``generation_config``."""
    if kwargs.get(name) is not None:
        return kwargs.pop(name)
    kwargs.pop(name, None)
    if preset and name in preset:
        return preset[name]
    value = getattr(gen_config, name, None)
    if value is None:
        return DEFAULTS.get(name)
    if from_config is not None:
        from_config.add(name)
    return value


def _preset(kwargs: dict, gen_config) -> tuple[str | None, dict]:
    """The named decoding preset (argument first, then generation_config) and its values."""
    name, origin = kwargs.pop("decoding", None), ""
    if name is None:
        name, origin = getattr(gen_config, "decoding", None), f" (from {GENERATION_CONFIG})"
    if name is None:
        return None, {}
    if not isinstance(name, str) or name not in DECODING_PRESETS:
        raise ValueError(f"decoding={name!r}{origin} is invalid: allowed: {', '.join(DECODING_PRESETS)} (or None)")
    return name, DECODING_PRESETS[name]


def _editing_threshold(kwargs: dict, gen_config, preset: dict, from_config: set) -> float | None:
    """An explicit ``editing_threshold=None`` argument disables editing (unlike other None arguments)."""
    if "editing_threshold" in kwargs:
        return kwargs.pop("editing_threshold")
    if "editing_threshold" in preset:
        return preset["editing_threshold"]
    value = getattr(gen_config, "editing_threshold", None)
    if value is not None:
        from_config.add("editing_threshold")
    return value


def resolve_params(
    model_config, generation_config: GenerationConfig | None, prompt_length: int | None, kwargs: dict
) -> DiffusionParams:
    """Consume the keys this decoder understands from ``kwargs``; leftovers are reported by the caller.

    ``prompt_length`` None skips the checks that need a prompt (whether it fits the context).
    """
    check_config_options(generation_config)
    gen = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    seen: set[str] = set()
    explicit_transfer = kwargs.get("num_to_transfer") is not None
    if "gen_length" in kwargs:  # the official LLaDA2 generate's name
        kwargs.setdefault("max_new_tokens", kwargs.pop("gen_length"))
    max_length = kwargs.pop("max_length", None)
    if kwargs.get("max_new_tokens") is None and max_length is not None and prompt_length is not None:
        kwargs["max_new_tokens"] = max_length - prompt_length
    eos = _get("eos_token_id", kwargs, gen, from_config=seen)
    if eos is None:
        eos = model_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    pad = _get("pad_token_id", kwargs, gen, from_config=seen)
    pad = model_config.pad_token_id if pad is None else pad
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    mask = _get("mask_token_id", kwargs, gen, from_config=seen)
    mask = model_config.mask_token_id if mask is None else mask
    stop = kwargs.pop("stop_strings", None) or getattr(gen, "stop_strings", None) or []
    use_cache = kwargs.pop("use_cache", None)
    decoding, preset = _preset(kwargs, gen)

    def get(name, use_preset=False):
        return _get(name, kwargs, gen, preset if use_preset else None, seen)

    min_new = _min_new_tokens(kwargs, gen, prompt_length, seen)

    params = DiffusionParams(
        max_new_tokens=get("max_new_tokens"),
        block_length=get("block_length"),
        threshold=get("threshold", True),
        steps=get("steps"),
        minimal_topk=get("minimal_topk"),
        do_sample=bool(get("do_sample")),
        temperature=get("temperature"),
        top_k=get("top_k"),
        top_p=get("top_p"),
        eos_early_stop=bool(get("eos_early_stop")),
        eos_token_ids=eos_ids,
        pad_token_id=pad,
        mask_token_id=mask,
        commit_rule=get("commit_rule"),
        use_cache=True if use_cache is None else bool(use_cache),
        return_dict_in_generate=bool(get("return_dict_in_generate")),
        stop_strings=[stop] if isinstance(stop, str) else list(stop),
        editing_threshold=_editing_threshold(kwargs, gen, preset, seen),
        max_post_steps=get("max_post_steps", True),
        num_to_transfer=get("num_to_transfer"),
        decoding=decoding,
        repetition_penalty=get("repetition_penalty"),
        min_new_tokens=min_new,
        logits_processor=check_callables(kwargs.pop("logits_processor", None), "logits_processor",
                                         "(input_ids, scores) -> scores", LogitsProcessorList),
        stopping_criteria=check_callables(kwargs.pop("stopping_criteria", None), "stopping_criteria",
                                          "(input_ids, scores) -> bool per row", StoppingCriteriaList),
        from_config=seen,
    )
    if explicit_transfer and params.editing_threshold is None:
        raise ValueError(f"num_to_transfer={params.num_to_transfer!r} applies only with token editing "
                         "(editing_threshold set, or decoding='quality'/'speed'); without editing the steps "
                         "schedule decides how many tokens each iteration commits")
    validate_params(params, model_config, prompt_length)
    return params


def _min_new_tokens(kwargs: dict, gen_config, prompt_length: int | None, seen: set) -> int:
    """``min_new_tokens``, raised to what ``min_length`` asks for (Transformers counts the prompt in
    ``min_length``: its padded width, here the batch's longest prompt). Only valid values are
    combined; a bad ``min_new_tokens`` is left for :func:`validate_params` to name."""
    min_new = _get("min_new_tokens", kwargs, gen_config, from_config=seen)
    min_length = kwargs.pop("min_length", None)
    origin = ""
    if min_length is None:
        min_length, origin = getattr(gen_config, "min_length", None), f" (from {GENERATION_CONFIG})"
    if min_length is None:
        return min_new
    if not _is_int(min_length) or min_length < 0:
        raise ValueError(f"min_length={min_length!r}{origin} is invalid: must be an integer >= 0 (prompt plus new "
                         "tokens before EOS may be chosen)")
    if prompt_length is None or not _is_int(min_new):
        return min_new
    return max(min_new, min_length - prompt_length)


def check_callables(value, name: str, signature: str, list_type: type) -> list[Callable]:
    """``logits_processor`` / ``stopping_criteria``: None, a Transformers list, or a list/tuple of callables.

    Checked before any forward so that a single processor passed bare, or a list holding a
    non-callable, fails naming the argument instead of deep inside the denoising loop.
    """
    if value is None:
        return []
    if callable(value) and not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a {list_type.__name__} or a list of callables {signature}; got a single "
                         f"{type(value).__name__}: wrap it, {name}={list_type.__name__}([...])")
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a {list_type.__name__} or a list of callables {signature}; "
                         f"got {type(value).__name__}")
    for i, item in enumerate(value):
        if not callable(item):
            raise ValueError(f"{name}[{i}] is a {type(item).__name__}, not a callable {signature}")
    return list(value)


# Transformers generate options block diffusion cannot honour, and why (any not listed: the generic reason).
UNSUPPORTED_REASONS = {
    "output_scores": "a block's tokens are committed over several denoising iterations, so there is no one score "
                     "per new token; pass observers=[...] to see each iteration's confidences (IterationEvent)",
    "output_logits": "a block's tokens are committed over several denoising iterations, so there are no per-token "
                     "logits; pass observers=[...] to see each iteration's confidences (IterationEvent)",
    "output_attentions": "generate keeps no per-step attentions; call the model's forward with the canvas instead",
    "output_hidden_states": "generate keeps no per-step hidden states; call the model's forward with "
                            "output_hidden_states=True instead",
    "synced_gpus": "generate runs on one process (no DeepSpeed ZeRO-3 / FSDP lockstep)",
    "prefix_allowed_tokens_fn": "pass a logits_processor instead (it sees each block position's prefix)",
    "num_logits_to_keep": "generate chooses which logits the forward keeps",
    "cache_implementation": "generate uses its own block KV cache (switch it with use_cache)",
}
# Transformers options accepted at any value because they change nothing in block diffusion (module docstring).
NO_OP_OPTIONS = ("renormalize_logits", "bos_token_id", "transformers_version", "_from_model_config")
# Transformers generate() arguments that are not GenerationConfig fields (None = not used).
GENERATE_ARGUMENTS = ("synced_gpus", "prefix_allowed_tokens_fn", "assistant_model", "negative_prompt_ids",
                      "negative_prompt_attention_mask", "custom_generate", "use_model_defaults",
                      "assistant_tokenizer", "num_logits_to_keep")


def neutral_generation_values() -> dict:
    """Each Transformers generate option's value that leaves generation unchanged (besides None).

    Transformers' own defaults (``GenerationConfig._get_default_generation_params``, where this
    version has it) plus the boolean flags whose off value is False; greedy-only defaults such as
    ``top_k=50`` do not matter here since the decoder consumes ``top_k`` itself.
    """
    defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
    return {**defaults, "output_scores": False, "output_logits": False, "output_attentions": False,
            "output_hidden_states": False, "synced_gpus": False, "low_memory": False, "token_healing": False}


def pop_generation_options(kwargs: dict) -> None:
    """Remove Transformers generate options left in ``kwargs`` that change nothing; raise for the others.

    Called after :func:`resolve_params` consumed what this decoder implements, so what is left and
    named by Transformers (a GenerationConfig field or a generate() argument) is unsupported: its
    neutral value is accepted (callers that forward a full config keep working), any other value
    raises naming it, instead of being silently dropped.
    """
    names = set(GenerationConfig().to_dict()) | set(GENERATE_ARGUMENTS)
    neutral = neutral_generation_values()
    for name in sorted(k for k in kwargs if k in names):
        _refuse_option(name, kwargs.pop(name), neutral, "")


def check_config_options(generation_config) -> None:
    """The same rule for a ``generation_config`` (passed, or the checkpoint's ``generation_config.json``):
    a Transformers option this decoder does not implement, set to a non-neutral value, raises
    (``num_beams 4 (from generation_config)``) instead of being silently dropped."""
    if generation_config is None:
        return
    neutral = neutral_generation_values()
    for name in sorted(set(GenerationConfig().to_dict()) - HANDLED_OPTIONS):
        _refuse_option(name, getattr(generation_config, name, None), neutral, f" (from {GENERATION_CONFIG})")


# GenerationConfig fields resolve_params reads (validated there, never refused as unsupported).
HANDLED_OPTIONS = {"max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
                   "pad_token_id", "use_cache", "return_dict_in_generate", "stop_strings", "repetition_penalty",
                   "min_new_tokens", "min_length"}


def _refuse_option(name: str, value, neutral: dict, origin: str) -> None:
    if value is None or name in NO_OP_OPTIONS or (name in neutral and _same(value, neutral[name])):
        return
    reason = UNSUPPORTED_REASONS.get(name, "generate does not implement this Transformers option; leave it unset")
    allowed = f" (only None or {neutral[name]!r})" if neutral.get(name) is not None else " (only None)"
    raise ValueError(f"{name}={value!r}{origin} is not supported by block diffusion: {reason}{allowed}")


def check_unused_kwargs(kwargs: dict) -> None:
    """Leftover arguments fail as in Transformers' ``_validate_model_kwargs``: a typo such as
    ``max_new_token=`` raises with Transformers' own message (None values are skipped, as there)."""
    unused = [key for key, value in kwargs.items() if value is not None]
    if unused:
        raise ValueError(f"The following `model_kwargs` are not used by the model: {unused} (note: typos in the "
                         "generate arguments will also show up in this list)")


def _same(value, neutral) -> bool:
    """``value == neutral`` without tensor or odd-type surprises (a non-comparable value is not neutral)."""
    try:
        return type(value) in (bool, int, float, str) and bool(value == neutral) and (
            isinstance(value, bool) == isinstance(neutral, bool))
    except Exception:
        return False


def check_generation_config(generation_config: GenerationConfig, model_config, where: str) -> None:
    """Refuse, when a checkpoint is loaded, a ``generation_config.json`` that every ``generate`` would
    refuse (``block_length 0``, ``threshold 5``, ``max_post_steps 10**9``...): the error names the file
    (``where``), the field, its value and what is allowed, instead of failing each later call."""
    try:
        resolve_params(model_config, generation_config, None, {})
    except ValueError as error:
        raise ValueError(f"{where}: {error}; fix or remove that field") from None


def validate_params(p: DiffusionParams, model_config, prompt_length: int | None) -> None:
    """Every value's type and range; then, given a prompt length, whether prompt + generation fit."""

    def bad(name, value, allowed):
        origin = f" (from {GENERATION_CONFIG})" if name in p.from_config else ""
        raise ValueError(f"{name}={value!r}{origin} is invalid: {allowed}")

    vocab = model_config.vocab_size
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
    # NaN or a non-number is always a mistake; the floor matters only where temperature is used (sampling),
    # so a greedy checkpoint's generation_config with temperature 0.001 still loads.
    if not _is_number(p.temperature) or not math.isfinite(p.temperature) or p.temperature < 0 or (
            p.do_sample and 0 < p.temperature < MIN_TEMPERATURE):
        bad("temperature", p.temperature, f"must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g} "
            "(smaller values overflow logits / temperature)")
    if p.top_k is not None and (not _is_int(p.top_k) or p.top_k < 0):
        bad("top_k", p.top_k, "must be None or an integer >= 0 (0 disables it)")
    if p.top_p is not None and (not _is_number(p.top_p) or not 0.0 < p.top_p <= 1.0):
        bad("top_p", p.top_p, "must be None or in (0, 1]")
    if p.editing_threshold is not None and (not _is_number(p.editing_threshold)
                                            or not 0.0 <= p.editing_threshold <= 1.0):
        bad("editing_threshold", p.editing_threshold, "must be None (no editing) or between 0 and 1 (inclusive)")
    if not _is_int(p.max_post_steps) or not 0 <= p.max_post_steps <= MAX_POST_STEPS:
        bad("max_post_steps", p.max_post_steps, f"must be an integer from 0 to {MAX_POST_STEPS} (editing "
            "iterations after a block's last mask; the LLaDA2.1 default is 16)")
    if not _is_int(p.num_to_transfer) or not 1 <= p.num_to_transfer <= p.block_length:
        bad("num_to_transfer", p.num_to_transfer, f"must be an integer from 1 to block_length={p.block_length} "
            "(masks committed per editing iteration when too few are above threshold)")
    if (not _is_number(p.repetition_penalty) or not math.isfinite(p.repetition_penalty)
            or not MIN_REPETITION_PENALTY <= p.repetition_penalty <= 1.0 / MIN_REPETITION_PENALTY):
        bad("repetition_penalty", p.repetition_penalty, f"must be a finite number from {MIN_REPETITION_PENALTY:.4g} to "
            f"{1.0 / MIN_REPETITION_PENALTY:.4g} (its reciprocal must be finite in the fp32 logits; 1.0 = off; > 1 "
            "discourages tokens already in the prompt or committed)")
    if not _is_int(p.min_new_tokens) or p.min_new_tokens < 0:
        bad("min_new_tokens", p.min_new_tokens, "must be an integer >= 0 (new tokens before EOS may be chosen)")
    if p.commit_rule not in COMMIT_RULES:
        bad("commit_rule", p.commit_rule, f"allowed: {', '.join(COMMIT_RULES)}")
    for name, value in (("mask_token_id", p.mask_token_id), ("pad_token_id", p.pad_token_id)):
        if not _is_int(value) or not 0 <= value < vocab:
            bad(name, value, f"must be a token id from 0 to {vocab - 1} (vocab_size={vocab})")
    for value in p.eos_token_ids:
        if not _is_int(value):
            bad("eos_token_id", value, "must be a token id (an integer) or a list of them")
    if prompt_length is not None:
        check_context(prompt_length, p.max_new_tokens, p.block_length, model_config.max_position_embeddings)


def check_context(prompt_length: int, max_new_tokens: int, block_length: int, limit: int) -> None:
    """The canvas (prompt + max_new_tokens rounded up to whole blocks) must fit max_position_embeddings.

    Says which part does not fit: the prompt, one block after it, or the requested tokens (then with
    the largest max_new_tokens that fits), never a negative "allowed" count.
    """
    if prompt_length > limit:
        raise ValueError(
            f"prompt has {prompt_length} tokens, longer than max_position_embeddings={limit}; shorten the prompt"
        )
    if block_length > limit:
        raise ValueError(f"block_length={block_length} does not fit the context: it is longer than "
                         f"max_position_embeddings={limit}; use a block_length of at most {limit}")
    total = -(-(prompt_length + max_new_tokens) // block_length) * block_length
    if total <= limit:
        return
    room = limit // block_length * block_length - prompt_length
    if room <= 0:
        first = -(-(prompt_length + 1) // block_length) * block_length
        raise ValueError(
            f"the prompt ({prompt_length} tokens) does not leave room for a block: the prompt plus one generated "
            f"token, rounded up to whole blocks of block_length={block_length}, needs {first} positions but "
            f"max_position_embeddings={limit}; shorten the prompt or use a smaller block_length")
    raise ValueError(
        f"prompt ({prompt_length} tokens) + max_new_tokens={max_new_tokens}, rounded up to whole blocks of "
        f"{block_length}, needs {total} positions but max_position_embeddings={limit}; "
        f"allowed max_new_tokens here: at most {room}"
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
