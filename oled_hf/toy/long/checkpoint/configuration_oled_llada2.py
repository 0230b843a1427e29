"""Configuration of the LLaDA2 MoE diffusion language model (model_type ``oled_llada2``).

Field names and defaults follow the official LLaDA2.0-mini ``config.json`` so that an unmodified
official config loads with every value kept. Validation runs at construction and names the field,
the value and what is allowed, because a wrong routing shape otherwise fails deep inside a forward.
"""

from __future__ import annotations

from transformers import PreTrainedConfig

SCORE_FUNCTIONS = ("sigmoid", "softmax")

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
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rotary_dim is None:
            self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        super().__post_init__(**kwargs)
        self.rope_parameters = None  # read back through the base class's `rope_scaling` alias: null
        self.use_cache = kwargs.get("use_cache", self.use_cache)
        self.validate_llada2()

    def validate_llada2(self) -> None:
        """Reject shapes the router or attention cannot run, naming the field at fault."""
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
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}"
            )

    @property
    def num_moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    def is_moe_layer(self, layer_idx: int) -> bool:
        return self.num_experts > 0 and layer_idx >= self.first_k_dense_replace


__all__ = ["OledLLaDA2Config"]
