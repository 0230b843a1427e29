"""LLaDA2 MoE masked-diffusion language model, as Transformers custom code.

The math follows ``shared/docs/llada2.md`` §4 in the order it is stated there: pre-norm decoder
layers; fused QKV, per-head QK-norm, partial rotate-half RoPE, GQA, SDPA under a block-causal mask;
an fp32 sigmoid router whose expert bias only selects, group-limited top-k, renormalised and scaled
weights; SwiGLU experts plus an always-on shared expert; dense first layers; an untied head and no
logit shift. Parameter names are the official checkpoint's, so its safetensors load unrenamed.

Deliberate differences from the official forward (the HF remote code), each for a stated reason:

* A padded 2-D ``attention_mask`` (1 = real token) only hides the padded keys: attention stays
  bidirectional (within the block pattern when ``block_length`` is given), where the official
  forward turns any 2-D mask into a *causal* one (``_prepare_4d_causal_attention_mask``), which a
  masked-diffusion model never trains with; every query also sees itself, so a padded row has no
  empty softmax. Pass a 4-D mask to get any other pattern.
* A 4-D ``attention_mask`` is read as the official SDPA path reads it (bool: True = attend;
  float: additive, 0 = attend, -inf = blocked), but a float mask with values above 0 (a 0/1
  keep-mask) is refused instead of being added (``attention_mask.py``).
* ``block_length`` builds the block-causal mask here (absolute blocks, as the official
  ``generate`` builds it) so callers need not; ``cache_start`` and ``past_key_values`` are the
  block-diffusion prefix cache (``cache.py``), not Transformers' ``DynamicCache``.
* ``use_qk_norm`` is honoured as the official code honours it (no QK-norm modules, none applied,
  when false); dInfer's copy applies QK-norm whatever the flag says.

Routed experts are computed through ``experts_executor`` (see ``experts.py``): the model knows
nothing of where expert weights live.

Position i's logits predict token i (masked-diffusion, no shift), so scoring the model as an
autoregressive LM (reading position i-1's logits for token i, e.g. lm-eval's ``--model hf``) gives
wrong numbers silently. ``forward`` warns once per model where that use is certain
(:func:`autoregressive_use`): labels at unmasked positions (causal-LM labels such as
``labels=input_ids``), or a plain ``model(input_ids)`` made from lm-eval's ``HFLM`` log-likelihood
loop. The right lm-eval model for these checkpoints is ``oled_llada2``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput

from .attention_mask import apply_mask, build_attention_mask
from .auto_map import AUTO_MAP, CODE_VERSION, warn_on_code_version, write_model_code
from .cache import BlockKVCache
from .checkpoint_files import (
    EXPERT_KEY,
    check_checkpoint_files,
    check_finite,
    check_loading_info,
    check_local_index,
)
from .configuration_oled_llada2 import OledLLaDA2Config
from .experts import RESIDENT_EXECUTOR, ExpertsExecutor
from .generation_oled_llada2 import DiffusionGenerationMixin
from .placement import check_host_memory, offload_placement, resolve_offload_config


@dataclass
class OledLLaDA2Output(ModelOutput):
    """Logits are unshifted: ``logits[:, i]`` predicts token ``i`` (masked-diffusion convention)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    past_key_values: BlockKVCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    router_logits: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = None
    router_weights: tuple[torch.Tensor, ...] | None = None


class OledLLaDA2RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, cast back, *then* scale: the order bf16 parity depends on.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(dtype)


def rotary_cos_sin(position_ids: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin of shape [B, L, rotary_dim], computed in fp32 from absolute positions, then cast."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=position_ids.device)
                                / rotary_dim))
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dims of each head ([B, heads, L, hd]); pass the rest through."""
    rd = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Reference attention: fp32 softmax over masked scores (bool or additive mask), GQA by repeating K/V heads."""
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = apply_mask(torch.matmul(query, key.transpose(2, 3)).float() * scaling, attention_mask)
    probs = scores.softmax(dim=-1).to(query.dtype)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


class OledLLaDA2Attention(nn.Module):
    def __init__(self, config: OledLLaDA2Config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # a None mask must mean bidirectional, never causal
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, qkv_out, bias=config.use_qkv_bias)
        # QK-norm as the official code: modules (and checkpoint tensors) only with use_qk_norm
        self.use_qk_norm = config.use_qk_norm
        if self.use_qk_norm:
            self.query_layernorm = OledLLaDA2RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.key_layernorm = OledLLaDA2RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias)

    def forward(self, hidden_states, cos, sin, attention_mask, past_key_values, cache_start):
        bsz, q_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(bsz, q_len, -1, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        if self.use_qk_norm:  # per-head RMSNorm, before RoPE
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.transpose(1, 2)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.write(self.layer_idx, k, v, cache_start)
        attn_fn = eager_attention_forward
        if self.config._attn_implementation not in (None, "eager"):
            attn_fn = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, _ = attn_fn(self, q, k, v, attention_mask, scaling=self.scaling, dropout=0.0, is_causal=False)
        return self.dense(out.reshape(bsz, q_len, -1))


class OledLLaDA2MLP(nn.Module):
    """SwiGLU feed-forward: the dense layers, each routed expert and the shared expert."""

    def __init__(self, config: OledLLaDA2Config, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route_tokens(
    x: torch.Tensor, weight: torch.Tensor, expert_bias: torch.Tensor | None, config: OledLLaDA2Config
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LLaDA2's group-limited router. Returns (logits [T,E] fp32, topk_ids [T,k], topk_weights [T,k] fp32).

    The expert bias shifts *selection* only; gate weights come from the unbiased scores.
    """
    logits = F.linear(x.float(), weight.float())
    scores = logits.sigmoid() if config.score_function == "sigmoid" else logits.softmax(dim=-1)
    biased = scores + expert_bias.float() if expert_bias is not None else scores
    t = biased.shape[0]
    grouped = biased.view(t, config.n_group, -1)
    group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    keep = group_scores.topk(config.topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
    masked = grouped.masked_fill(~group_mask[..., None], float("-inf")).view(t, -1)
    topk_ids = masked.topk(config.num_experts_per_tok, dim=-1).indices
    topk_weights = scores.gather(1, topk_ids)
    if config.num_experts_per_tok > 1 and config.norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, topk_ids, topk_weights * config.routed_scaling_factor


class OledLLaDA2Gate(nn.Module):
    def __init__(self, config: OledLLaDA2Config):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        # The load dtype by default (the official loader's behaviour); fp32 with config.router_bias_fp32.
        dtype = torch.float32 if config.router_bias_fp32 else None
        self.register_buffer("expert_bias", torch.zeros(config.num_experts, dtype=dtype))

    def forward(self, x: torch.Tensor):
        bias = self.expert_bias if self.config.moe_router_enable_expert_bias else None
        return route_tokens(x, self.weight, bias, self.config)


class OledLLaDA2SparseMoeBlock(nn.Module):
    def __init__(self, config: OledLLaDA2Config, layer_idx: int, routed_experts: bool = True):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.moe_layer_idx = layer_idx - config.first_k_dense_replace
        self.gate = OledLLaDA2Gate(config)
        # Without routed experts (offloaded), their checkpoint tensors are never materialised here.
        num_modules = config.num_experts if routed_experts else 0
        self.experts = nn.ModuleList([OledLLaDA2MLP(config, config.moe_intermediate_size) for _ in range(num_modules)])
        self.shared_experts = None
        if config.num_shared_experts:
            self.shared_experts = OledLLaDA2MLP(config, config.moe_intermediate_size * config.num_shared_experts)
        self.experts_executor: ExpertsExecutor = RESIDENT_EXECUTOR

    def forward(self, hidden_states: torch.Tensor):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        logits, topk_ids, topk_weights = self.gate(x)
        y = self.experts_executor(self, x, topk_ids, topk_weights)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y.view(shape), (logits, topk_ids, topk_weights)


class OledLLaDA2DecoderLayer(nn.Module):
    def __init__(self, config: OledLLaDA2Config, layer_idx: int, routed_experts: bool = True):
        super().__init__()
        self.attention = OledLLaDA2Attention(config, layer_idx)
        if config.is_moe_layer(layer_idx):
            self.mlp = OledLLaDA2SparseMoeBlock(config, layer_idx, routed_experts)
        else:
            self.mlp = OledLLaDA2MLP(config, config.intermediate_size)
        self.input_layernorm = OledLLaDA2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = OledLLaDA2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, cos, sin, attention_mask, past_key_values, cache_start):
        h = hidden_states + self.attention(
            self.input_layernorm(hidden_states), cos, sin, attention_mask, past_key_values, cache_start
        )
        out = self.mlp(self.post_attention_layernorm(h))
        router = None
        if isinstance(out, tuple):
            out, router = out
        return h + out, router


def align_cpu_tensors(module: nn.Module, alignment: int = 64) -> None:
    """Copy CPU weights that are unaligned views of a memory-mapped shard into aligned memory.

    CPU GEMM kernels pick different code paths for unaligned operands, so the same weights loaded
    from two differently laid-out files would otherwise round differently; aligned copies make
    logits depend on the weights alone (save/load round trips are bit-identical).
    """
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.device.type == "cpu" and tensor.data_ptr() % alignment:
                tensor.data = tensor.data.clone()


class OledLLaDA2PreTrainedModel(PreTrainedModel):
    config_class = OledLLaDA2Config
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["OledLLaDA2DecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    # With config.router_bias_fp32, post_init adds r"mlp\.gate\.expert_bias" to the strict fp32 set.
    _keep_in_fp32_modules_strict = None

    def post_init(self):
        super().post_init()
        if getattr(self.config, "router_bias_fp32", False):
            self._keep_in_fp32_modules_strict.add(r"mlp\.gate\.expert_bias")

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        align_cpu_tensors(model)
        return model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save with the model's source files and a full ``auto_map``, whichever way it was loaded.

        A model loaded through ``trust_remote_code`` has ``_auto_class`` set, which would make the
        base class copy only the files it can see and rewrite one ``auto_map`` entry; we copy every
        file of ``CODE_FILES`` ourselves instead.
        """
        extra = self.extra_state_for_save() if hasattr(self, "extra_state_for_save") else {}
        if extra:
            state_dict = dict(kwargs.pop("state_dict", None) or self.state_dict())
            state_dict.update({name: tensor.clone() for name, tensor in extra.items()})
            kwargs["state_dict"] = state_dict
        model_cls, config_cls = type(self), type(self.config)
        saved = model_cls._auto_class, config_cls._auto_class
        model_cls._auto_class = config_cls._auto_class = None
        self.config.auto_map = dict(AUTO_MAP)
        self.config.oled_hf_version = CODE_VERSION
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            model_cls._auto_class, config_cls._auto_class = saved
        if kwargs.get("is_main_process", True):
            write_model_code(save_directory)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, OledLLaDA2Gate):
            from transformers import initialization as init

            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.expert_bias)


class OledLLaDA2Model(OledLLaDA2PreTrainedModel):
    def __init__(self, config: OledLLaDA2Config, routed_experts: bool = True):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [OledLLaDA2DecoderLayer(config, i, routed_experts) for i in range(config.num_hidden_layers)]
        )
        self.norm = OledLLaDA2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: BlockKVCache | None = None,
        cache_start: int | None = None,
        block_length: int | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_router_logits: bool = False,
        **kwargs,
    ) -> OledLLaDA2Output:
        """Forward over canvas columns ``[cache_start, cache_start + L)``.

        ``attention_mask`` is 2-D (batch, keys) padding (1 = real) over every key column the
        queries may see, or a 4-D mask: bool (True = attend) or additive float (0 = attend, -inf =
        blocked; the official ``generate``'s form), see ``attention_mask.py``. ``block_length`` adds
        the block-causal pattern; with neither, attention is fully bidirectional.
        """
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        bsz, q_len, _ = inputs_embeds.shape
        if cache_start is None:
            cache_start = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(cache_start, cache_start + q_len, device=inputs_embeds.device)
            position_ids = position_ids.unsqueeze(0).expand(bsz, -1)
        key_len = cache_start + q_len if past_key_values is not None else q_len
        mask_start = cache_start if past_key_values is not None else 0
        mask = build_attention_mask(
            attention_mask, block_length, bsz, mask_start, q_len, key_len, inputs_embeds.device, inputs_embeds.dtype
        )
        cos, sin = rotary_cos_sin(position_ids, self.config.rotary_dim, self.config.rope_theta, inputs_embeds.dtype)
        h = inputs_embeds
        hidden_states = (h,) if output_hidden_states else None
        router_logits, router_weights = [], []
        for layer in self.layers:
            h, router = layer(h, cos, sin, mask, past_key_values, cache_start)
            if output_hidden_states:
                hidden_states += (h,)
            if router is not None and output_router_logits:
                logits, ids, weights = router
                router_logits.append((logits.view(bsz, q_len, -1), ids.view(bsz, q_len, -1)))
                router_weights.append(weights.view(bsz, q_len, -1))
        h = self.norm(h)
        return OledLLaDA2Output(
            last_hidden_state=h,
            past_key_values=past_key_values,
            hidden_states=hidden_states,
            router_logits=tuple(router_logits) if output_router_logits else None,
            router_weights=tuple(router_weights) if output_router_logits else None,
        )


logger = logging.getLogger(__name__)

# lm-eval's autoregressive HF adapter: its log-likelihood loop reads shifted log-probs from model(input_ids).
HFLM_SCORING = (os.path.join("lm_eval", "models", "huggingface.py"), "_loglikelihood_tokens")
AUTOREGRESSIVE_WARNING = (
    "{name} is a masked-diffusion LM: position i's logits predict token i (no shift), so {why} scores it as an "
    "autoregressive LM and the numbers are wrong. Use generate() for text, and for lm-eval the oled_llada2 model "
    "(oled-moe eval, or python -m oled_hf.evaluation --model oled_llada2 ...), not --model hf. Warned once per "
    "model.")


def autoregressive_use(input_ids, labels, mask_token_id: int, plain_call: bool) -> str | None:
    """Why this forward is an autoregressive-scoring use (for the warning), or None.

    Both signals are certain and cheap: masked-diffusion labels sit only at masked inputs (a
    label at a visible token is a copy task, i.e. causal-LM labels the model does not shift); and
    lm-eval's ``HFLM._loglikelihood_tokens`` on the stack of a plain ``model(input_ids)`` (no
    block_length, cache or positions; a few frames looked at, only for such calls). Our own
    callers (generate, the ``oled_llada2`` adapter, training and tests) do neither.
    """
    if labels is not None and input_ids is not None and labels.shape == input_ids.shape:
        if bool(((labels != -100) & (input_ids != mask_token_id)).any()):
            return "forward(labels=...) with labels at unmasked positions (causal-LM labels, e.g. labels=input_ids)"
    if plain_call and _called_from(*HFLM_SCORING):
        return "lm-eval's hf adapter (HFLM._loglikelihood_tokens)"
    return None


def _called_from(file_suffix: str, function: str, depth: int = 16) -> bool:
    """Whether ``function`` of a file ending in ``file_suffix`` is among the innermost ``depth`` callers."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == function and frame.f_code.co_filename.endswith(file_suffix):
            return True
        frame = frame.f_back
    return False


class OledLLaDA2ForDiffusionLM(OledLLaDA2PreTrainedModel, DiffusionGenerationMixin):
    """LLaDA2 with its untied LM head and block-diffusion ``generate``.

    ``from_pretrained(path, offload_config=oled_hf.OffloadConfig(...))`` (or a dict of its fields)
    builds the model without routed-expert modules and lets the offload config attach its runtime
    after loading; the model itself only calls ``offload_config.attach(...)`` and never imports the
    runtime. ``device_map`` / ``max_memory`` / ``offload_folder``: accelerate's conventions without
    it; with it one device, and ``max_memory`` as the device's budget and the host's cap (``placement.py``).
    """

    def __init__(self, config: OledLLaDA2Config, offload_config=None, strict: bool = True, **kwargs):
        super().__init__(config)
        offload_config = resolve_offload_config(offload_config)
        if not isinstance(strict, bool):
            raise ValueError(f"strict={strict!r} is invalid: pass True (refuse missing/unexpected weights) or False")
        # from_pretrained(..., strict=False) reaches here like offload_config (unused config kwargs):
        # it allows missing (randomly initialised) and unexpected (dropped) checkpoint tensors.
        self._strict_load = strict
        self._pending_offload = offload_config
        self._offload_runtime = None
        self.model = OledLLaDA2Model(config, routed_experts=offload_config is None)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("offload_config") is not None:  # a dict becomes an OffloadConfig; placement checked
            kwargs["offload_config"] = resolve_offload_config(kwargs["offload_config"], kwargs.pop("max_memory", None))
            offload_placement(kwargs)
        if args and isinstance(args[0], (str, os.PathLike)):  # local folder: its index, before Transformers
            check_local_index(os.path.join(args[0], kwargs.get("subfolder") or ""))
        model = super().from_pretrained(*args, **kwargs)
        warn_on_code_version(model.config)
        offload = model.__dict__.pop("_pending_offload", None)
        if offload is not None:
            files = model.__dict__.pop("_checkpoint_files", None)
            if not files:
                raise ValueError("offloading needs a safetensors checkpoint; no weight files were found")
            model._offload_runtime = offload.attach(model, files, model.__dict__.pop("_load_dtype", None))
        return model

    @staticmethod
    def _load_pretrained_model(model, state_dict, checkpoint_files, load_config, expected_keys=None):
        # Remember where the weights are: an offload runtime reads the routed experts from them.
        model._checkpoint_files = list(checkpoint_files or [])
        model._load_dtype = getattr(load_config, "dtype", None)
        safetensors = [str(f) for f in model._checkpoint_files if str(f).endswith(".safetensors")]
        model._tensor_files = {}
        tensors = model.state_dict()
        if not getattr(load_config, "disk_offload_folder", None):  # before any weight is read: a load larger
            check_host_memory(tensors, getattr(load_config, "device_map", None))  # than RAM is refused, not OOM-killed
        if safetensors:  # damaged headers, a tensor in two shards, int tensors into float weights, wrong shapes
            floating = {name: t.is_floating_point() for name, t in tensors.items()}
            # ignore_mismatched_sizes=True is the caller's explicit opt-out: Transformers re-initialises them
            shapes = None if getattr(load_config, "ignore_mismatched_sizes", False) else {
                name: tuple(t.shape) for name, t in tensors.items()}
            model._tensor_files = check_checkpoint_files(safetensors, floating, shapes)
        return PreTrainedModel._load_pretrained_model(model, state_dict, checkpoint_files, load_config, expected_keys)

    @staticmethod
    def _finalize_model_loading(model, load_config, loading_info):
        loading_info = PreTrainedModel._finalize_model_loading(model, load_config, loading_info)
        source = getattr(load_config, "pretrained_model_name_or_path", None)
        if getattr(model, "_strict_load", True):
            check_loading_info(type(model).__name__, source, loading_info.missing_keys, loading_info.unexpected_keys)
        # Every loaded float weight, once (routed experts of an offloaded model: in the ExpertStore)
        check_finite(model.state_dict().items(), model.__dict__.pop("_tensor_files", None) or {}, source)
        return loading_info

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """Routed-expert tensors are unexpected only when no ExpertStore will take them.

        Offloaded, the model has no expert modules and the store reads the experts of its MoE
        layers itself; any other expert tensor (a layer or expert id the config does not have)
        stays unexpected, as it is for a resident model.
        """
        super()._adjust_missing_and_unexpected_keys(loading_info)
        if self.__dict__.get("_pending_offload") is None:
            return
        moe_layers, experts = {b.layer_idx for b in self.moe_blocks()}, self.config.num_experts
        loading_info.unexpected_keys = {
            k for k in loading_info.unexpected_keys
            if not ((m := EXPERT_KEY.match(k)) and int(m.group(1)) in moe_layers and int(m.group(2)) < experts)
        }

    @property
    def is_offloaded(self) -> bool:
        return getattr(self, "_offload_runtime", None) is not None

    def offload_stats(self) -> dict | None:
        """Per-layer and total cache statistics; None when the model is fully resident."""
        return self._offload_runtime.stats() if self.is_offloaded else None

    def reset_offload_stats(self) -> None:
        if self.is_offloaded:
            self._offload_runtime.reset_stats()

    def extra_state_for_save(self) -> dict[str, torch.Tensor]:
        """Routed experts that live outside the modules (offloaded), under their official names."""
        return self._offload_runtime.store.state_dict() if self.is_offloaded else {}

    def num_parameters(self, *args, **kwargs) -> int:
        extra = 0
        if self.is_offloaded:
            store = self._offload_runtime.store
            extra = len(store.layer_ids) * store.num_experts * store.numel
        return super().num_parameters(*args, **kwargs) + extra

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def moe_blocks(self) -> list[OledLLaDA2SparseMoeBlock]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, OledLLaDA2SparseMoeBlock)]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: BlockKVCache | None = None,
        cache_start: int | None = None,
        block_length: int | None = None,
        labels: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_router_logits: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> OledLLaDA2Output:
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        if not self.__dict__.get("_warned_autoregressive"):
            plain = block_length is None and past_key_values is None and position_ids is None and not logits_to_keep
            why = autoregressive_use(input_ids, labels, self.config.mask_token_id, plain)
            if why is not None:
                self.__dict__["_warned_autoregressive"] = True
                logger.warning(AUTOREGRESSIVE_WARNING.format(name=type(self).__name__, why=why))
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            cache_start=cache_start,
            block_length=block_length,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            output_router_logits=output_router_logits,
        )
        h = out.last_hidden_state if not logits_to_keep else out.last_hidden_state[:, -logits_to_keep:]
        logits = self.lm_head(h).float()
        loss = None
        if labels is not None:  # no shift: position i predicts token i
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        out.logits, out.loss = logits, loss
        return out


__all__ = ["OledLLaDA2ForDiffusionLM", "OledLLaDA2Model", "OledLLaDA2PreTrainedModel"]
