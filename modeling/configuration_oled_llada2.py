"""Configuration of the LLaDA2 MoE diffusion language model (model_type ``oled_llada2``).

Field names and defaults follow the official LLaDA2.0-mini ``config.json`` so that an unmodified
official config loads with every value kept. Validation runs at construction and names the field,
the value and what is allowed, because a wrong routing shape otherwise fails deep inside a forward.
"""

from __future__ import annotations

import math

from transformers import PreTrainedConfig

SCORE_FUNCTIONS = ("sigmoid", "softmax")
HIDDEN_ACTS = ("silu",)  # the MLPs hard-code SwiGLU; another name would be silently ignored

# Field -> what it must be; checked before any arithmetic uses them (a 0 or a string otherwise
# surfaces as a ZeroDivisionError or a reshape error at the first forward).
POSITIVE_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "num_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "n_group", "topk_group")
NON_NEGATIVE_INTS = ("num_shared_experts", "first_k_dense_replace", "max_window_layers")
OPTIONAL_POSITIVE_INTS = ("head_dim", "rotary_dim", "sliding_window")  # None: derived or unused
POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor")
UNIT_FLOATS = ("attention_dropout", "embedding_dropout", "output_dropout")  # in [0, 1]
BOOLS = ("use_qkv_bias", "use_bias", "use_qk_norm", "moe_router_enable_expert_bias", "norm_topk_prob",
         "router_bias_fp32", "output_router_logits", "tie_word_embeddings")
OPTIONAL_TOKEN_IDS = ("pad_token_id", "bos_token_id")

# LLaDA2.0-mini's special ids (see shared/docs/llada2.md §1): EOS doubles as pad.
LLADA2_EOS_TOKEN_ID = 156892
LLADA2_MASK_TOKEN_ID = 156895


class OledLLaDA2Config(PreTrainedConfig):
    """LLaDA2 MoE config; accepts both ``oled_llada2`` and official ``llada2_moe`` config files."""

    model_type = "oled_llada2"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    tie_word_embeddings: bool = False
    rope_theta: float = 600000.0
    partial_rotary_factor: float = 0.5
    rotary_dim: int | None = None
    use_qkv_bias: bool = False
    use_bias: bool = False
    use_qk_norm: bool = True
    use_rmsnorm: bool = True
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    output_dropout: float = 0.0
    first_k_dense_replace: int = 1
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    moe_intermediate_size: int = 512
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    norm_topk_prob: bool = True
    norm_softmax: bool = False
    norm_head: bool = False
    router_dtype: str = "fp32"
    # False (default): ``expert_bias`` takes the load dtype like every other tensor, as the official
    # Transformers loader does (bf16 under ``dtype=bfloat16``; the router still adds it in fp32).
    # True: keep it fp32 whatever the load dtype (dInfer's loaders cast it back to fp32). The two
    # route differently in bf16 because selection margins are smaller than bf16's step.
    router_bias_fp32: bool = False
    output_router_logits: bool = False
    max_window_layers: int = 28
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    using_split_qkv_in_self_attention: bool = False
    pad_token_id: int | None = LLADA2_EOS_TOKEN_ID
    eos_token_id: int | None = LLADA2_EOS_TOKEN_ID
    bos_token_id: int | None = None
    mask_token_id: int = LLADA2_MASK_TOKEN_ID

    def __post_init__(self, **kwargs):
        # An official `llada2_moe` config carries its own model_type; ours is the class attribute.
        kwargs.pop("model_type", None)
        # `rope_scaling` is a deprecated alias in transformers 5; LLaDA2 only ever ships `null`.
        rope_scaling = kwargs.pop("rope_scaling", None)
        if rope_scaling not in (None, {}):
            raise ValueError(f"rope_scaling={rope_scaling!r} is not supported: LLaDA2 uses plain RoPE (null)")
        self.check_field_types()
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rotary_dim is None:
            self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        super().__post_init__(**kwargs)
        self.rope_parameters = None  # read back through the base class's `rope_scaling` alias: null
        self.use_cache = kwargs.get("use_cache", self.use_cache)
        self.validate_llada2()

    def check_field_types(self) -> None:
        """Every numeric field has a usable type and range, named with its value and what is allowed.

        Runs before the derived fields (``head_dim``, ``rotary_dim``) are computed from them.
        """
        for name in POSITIVE_INTS:
            _require(name, getattr(self, name), _is_int(getattr(self, name)) and getattr(self, name) > 0,
                     "must be a positive integer")
        for name in NON_NEGATIVE_INTS:
            _require(name, getattr(self, name), _is_int(getattr(self, name)) and getattr(self, name) >= 0,
                     "must be an integer >= 0")
        for name in OPTIONAL_POSITIVE_INTS:
            value = getattr(self, name)
            _require(name, value, value is None or (_is_int(value) and value > 0), "must be a positive integer or null")
        for name in POSITIVE_FLOATS:
            value = getattr(self, name)
            _require(name, value, _is_finite_number(value) and value > 0, "must be a finite number > 0")
        for name in UNIT_FLOATS:
            value = getattr(self, name)
            _require(name, value, _is_finite_number(value) and 0 <= value <= 1, "must be a number between 0 and 1")
        value = self.partial_rotary_factor
        _require("partial_rotary_factor", value, _is_finite_number(value) and 0 < value <= 1,
                 "must be a number in (0, 1] (the share of each head's dims that RoPE rotates)")
        value = self.initializer_range
        _require("initializer_range", value, _is_finite_number(value) and value >= 0, "must be a finite number >= 0")
        for name in BOOLS:
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool), "must be true or false")
        _require("hidden_act", self.hidden_act, self.hidden_act in HIDDEN_ACTS,
                 f"allowed: {', '.join(HIDDEN_ACTS)} (the experts are SwiGLU)")
        _require("mask_token_id", self.mask_token_id, _is_int(self.mask_token_id) and self.mask_token_id >= 0,
                 "must be a token id (an integer >= 0)")
        for name in OPTIONAL_TOKEN_IDS:
            value = getattr(self, name)
            _require(name, value, value is None or (_is_int(value) and value >= 0),
                     "must be a token id (an integer >= 0) or null")
        eos = self.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        _require("eos_token_id", eos, eos is None or all(_is_int(i) and i >= 0 for i in ids),
                 "must be a token id (an integer >= 0), a list of them, or null")

    def validate_llada2(self) -> None:
        """Reject shapes the router or attention cannot run, naming the field at fault."""
        for name in ("head_dim", "rotary_dim"):
            _require(name, getattr(self, name), _is_int(getattr(self, name)) and getattr(self, name) > 0,
                     "must be a positive integer")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}: a token "
                "cannot be routed to more experts than exist"
            )
        if self.num_experts % self.n_group != 0:
            raise ValueError(
                f"n_group={self.n_group} must divide num_experts={self.num_experts} (experts are split into "
                "equal groups for group-limited routing)"
            )
        per_group = self.num_experts // self.n_group
        if per_group < 2:
            raise ValueError(
                f"num_experts={self.num_experts} over n_group={self.n_group} gives {per_group} expert per group; "
                "at least 2 are required because a group's score is the sum of its top-2 experts"
            )
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be between 1 and n_group={self.n_group}")
        if self.topk_group * per_group < self.num_experts_per_tok:
            raise ValueError(
                f"topk_group={self.topk_group} x experts_per_group={per_group} = {self.topk_group * per_group} "
                f"is smaller than num_experts_per_tok={self.num_experts_per_tok}: the kept groups cannot supply "
                "enough experts"
            )
        if self.rotary_dim % 2 != 0 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be an even number between 2 and head_dim={self.head_dim}"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)"
            )
        if not 0 <= self.first_k_dense_replace <= self.num_hidden_layers:
            raise ValueError(
                f"first_k_dense_replace={self.first_k_dense_replace} must be between 0 and "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        if self.score_function not in SCORE_FUNCTIONS:
            raise ValueError(
                f"score_function={self.score_function!r} is unknown; allowed: {', '.join(SCORE_FUNCTIONS)}"
            )

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.num_experts > 0 and layer_idx >= self.first_k_dense_replace


def _require(name: str, value, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def _is_int(value) -> bool:
    """An integer that is not a bool (``num_experts: true`` in a config is a mistake, not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


__all__ = ["OledLLaDA2Config"]
