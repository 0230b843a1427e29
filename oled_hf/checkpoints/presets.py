"""Model shapes for checkpoints the project makes (no download is possible here).

``tiny`` is the CPU test config of ``shared/docs/llada2.md`` §7: every structural feature of
LLaDA2.0-mini at toy size. ``small`` keeps mini's proportions (experts 1/4 of hidden, 8 groups of
which 4 are kept, top-8) at 8 layers and 64 experts, for benchmarks where policies must differ.
``mini`` is LLaDA2.0-mini itself (``shared/data/llada2.0-mini/config.json``: 16B parameters, 20
layers, 256 experts of width 512 per MoE layer): written streaming, in bf16, with the official
special ids (``STREAMED``); ``num_hidden_layers`` (``--layers``) cuts its depth and keeps the rest.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, partial_rotary_factor=0.5, rotary_dim=16, rope_theta=600000.0, intermediate_size=256,
        first_k_dense_replace=1, num_experts=32, num_experts_per_tok=4, num_shared_experts=1,
        moe_intermediate_size=64, n_group=4, topk_group=2, routed_scaling_factor=2.5,
        max_position_embeddings=4096,
    ),
    "small": dict(
        vocab_size=4096, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, partial_rotary_factor=0.5, rotary_dim=32, rope_theta=600000.0, intermediate_size=1280,
        first_k_dense_replace=1, num_experts=64, num_experts_per_tok=8, num_shared_experts=1,
        moe_intermediate_size=128, n_group=8, topk_group=4, routed_scaling_factor=2.5,
        max_position_embeddings=8192,
    ),
    # the official config's values (the OledLLaDA2Config defaults are the same, special ids included)
    "mini": dict(
        vocab_size=157184, hidden_size=2048, num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=4,
        head_dim=128, partial_rotary_factor=0.5, rotary_dim=64, rope_theta=600000.0, intermediate_size=5120,
        first_k_dense_replace=1, num_experts=256, num_experts_per_tok=8, num_shared_experts=1,
        moe_intermediate_size=512, n_group=8, topk_group=4, routed_scaling_factor=2.5,
        max_position_embeddings=32768,
    ),
}
# presets too large to build as a module: written tensor by tensor (checkpoints/streaming.py) with the
# official special ids (checkpoints/tokenizer.py: train_bpe_official) and the official dtype
STREAMED = ("mini",)
DEFAULT_DTYPE = {"mini": "bfloat16"}  # others: float32

# Sharding keeps the real layout (several shards plus model.safetensors.index.json) even when tiny.
SHARD_SIZE = {"tiny": "4MB", "small": "100MB", "mini": "5GB"}


def preset_config_kwargs(name: str, **overrides: Any) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; known presets: {', '.join(sorted(PRESETS))}")
    unknown = set(overrides) - set(PRESETS[name])
    if unknown:
        raise ValueError(f"unknown size override(s) {sorted(unknown)}; allowed: {', '.join(sorted(PRESETS[name]))}")
    return {**PRESETS[name], **overrides}
