"""lm-eval model ``oled_llada2``: LLaDA2 block-diffusion LMs, optionally with offloaded experts.

``HFLM`` subclass (backend ``causal``) so tokenisation, batching, left padding, chat templates and
stop-string post-processing stay lm-eval's own. What a diffusion LM needs differently:

* ``generate_until`` runs through our block-diffusion ``generate`` (``_model_generate``):
  ``max_new_tokens = max_length - context`` (lm-eval's ``max_gen_toks``), the ``until`` strings as
  ``stop_strings`` (decoding stops after the block that contains one; lm-eval then cuts the text
  at it), greedy unless the task asks to sample. Returns the padded prompt + new tokens.
* ``loglikelihood`` is the Monte-Carlo masked-diffusion ELBO of :mod:`.likelihood` (block-causal
  by default, ``mc_attention=full`` for bidirectional); ``loglikelihood_rolling`` sums it over
  lm-eval's disjoint rolling windows.

Model arguments (``--model-args k=v,...``), besides HFLM's (``pretrained``, ``batch_size``,
``max_length``, ``dtype``, ``device``, ...):

* decoding: ``block_length``, ``threshold``, ``steps`` (defaults: the checkpoint's generation config);
* likelihood: ``mc_num`` (samples, default 32), ``mc_seed`` (default 1234), ``mc_attention``
  (``block``/``full``), ``mc_batch_size`` (rows per forward, default ``(mc_num + 1) * batch_size``:
  ``batch_size`` requests of equal shape share one forward; samples are drawn per request, so
  results do not depend on this packing and no divisibility is required);
* offloading: a budget turns it on, spelled as ``oled-moe serve``'s flags: ``cache_size=N``,
  ``cache_ratio=R`` or ``cache_ratio=auto``, ``max_gpu_memory=20GiB``, or ``gpu_memory_utilization=F``
  (vLLM's meaning; implies ``auto``, which reserves KV for ``batch_size`` x ``max_length`` unless
  ``auto_batch_size`` / ``auto_context_length`` are given), read by :func:`resolve_offload`; any
  other ``OffloadConfig`` field (``system``, ``cpu_compute``, ``store``, ``calibrate``,
  ``tide_interval``, ...) may follow. ``offload_stats()`` returns the cache
  statistics; ``oled-moe eval`` prints them and stores them in the results under ``config.offload``.
"""

from __future__ import annotations

import logging
from dataclasses import fields

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..progress import progress
from .likelihood import MCSettings, mc_loglikelihood

logger = logging.getLogger(__name__)

MODEL_NAME = "oled_llada2"
DECODING_ARGS = ("block_length", "threshold", "steps")


def _offload_fields() -> set[str]:
    from ..offload.config import OffloadConfig

    return {f.name for f in fields(OffloadConfig)}


def split_offload_args(kwargs: dict) -> tuple[dict, dict]:
    """(OffloadConfig kwargs, the rest)."""
    known = _offload_fields()
    offload = {k: v for k, v in kwargs.items() if k in known}
    rest = {k: v for k, v in kwargs.items() if k not in known}
    return offload, rest


def resolve_offload(offload: dict, device: str, batch_size: int, max_length: int | None) -> dict:
    """The model_args' ``OffloadConfig`` fields with the budget read as the CLI reads its flags.

    Through ``options.budget.budget_fields`` (the one reader), errors naming the field as typed
    (``cache_ratio=0 is invalid: ...``): ``gpu_memory_utilization=F`` alone means
    ``cache_ratio=auto`` with F (vLLM's meaning) and is refused beside a fixed budget; ``auto``
    reserves KV for ``batch_size`` sequences of ``max_length`` tokens unless ``auto_batch_size`` /
    ``auto_context_length`` say otherwise, and is refused before loading where ``device`` has no
    CUDA. Idempotent; ``{}`` (no offloading) stays ``{}``.
    """
    from ..options.budget import MODEL_ARGS, budget_fields, check_budget_device

    if not offload:
        return {}
    budgets = budget_fields({"auto_batch_size": batch_size, "auto_context_length": max_length, **offload}, MODEL_ARGS)
    if not budgets:
        raise ValueError(
            f"offload options {sorted(offload)} need a budget: add cache_size=N (slots per MoE layer), "
            "cache_ratio=R (fraction of routed-expert bytes; cache_ratio=auto sizes it from free GPU memory), "
            "max_gpu_memory=20GiB or gpu_memory_utilization=F (cache_ratio=auto keeping 1 - F of the GPU free) "
            "to --model-args"
        )
    check_budget_device(budgets, device)
    budget = budgets[0]
    if budget.get("cache_ratio") != "auto":  # the auto_* fields mean nothing to a fixed budget: keep them as given
        budget = {k: v for k, v in budget.items() if not k.startswith("auto_") or k in offload}
    return {**offload, **budget}


def offload_device(device: str | None) -> str:
    """The device the model loads on: ``device``, the CPU for cuda without CUDA (with a warning), else the best."""
    if device and device.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("device=%s requested but CUDA is not available (lm-eval's CLI asks for cuda by default); "
                       "using the CPU", device)
        return "cpu"
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_model(pretrained: str, *, device: str | None = None, dtype="auto", offload: dict | None = None,
               batch_size: int = 1, max_length: int | None = None):
    """Model (``eval()``) and tokenizer; ``offload`` kwargs build an ``OffloadConfig`` when they name a budget
    (read by :func:`resolve_offload`, before anything loads)."""
    from transformers import AutoModelForCausalLM

    import oled_hf

    from ..checkpoints.tokenizer import load_tokenizer

    kwargs: dict = {"dtype": _dtype(dtype)}
    device = offload_device(device)
    offload = resolve_offload(dict(offload or {}), device, batch_size, max_length)
    if offload:
        kwargs["offload_config"] = oled_hf.OffloadConfig(**offload)
    if device != "cpu":
        kwargs["device_map"] = device
    model = AutoModelForCausalLM.from_pretrained(pretrained, **kwargs).eval()
    tokenizer = load_tokenizer(pretrained, model=model)
    return model, tokenizer


def _dtype(dtype):
    if dtype in (None, "auto") or isinstance(dtype, torch.dtype):
        return dtype or "auto"
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype={dtype!r} is unknown; use auto, float32, bfloat16 or float16")
    return value


@register_model(MODEL_NAME)
class OledLLaDA2LM(HFLM):
    """See the module docstring. ``pretrained`` is a checkpoint folder or an already loaded model."""

    def __init__(
        self,
        pretrained,
        tokenizer=None,
        device: str | None = None,
        dtype="auto",
        batch_size: int | str = 1,
        max_length: int | None = None,
        block_length: int | None = None,
        threshold: float | None = None,
        steps: int | None = None,
        decoding: str | None = None,
        editing_threshold: float | None = None,
        max_post_steps: int | None = None,
        mc_num: int = 32,
        mc_seed: int = 1234,
        mc_attention: str = "block",
        mc_batch_size: int | None = None,
        **kwargs,
    ) -> None:
        offload, rest = split_offload_args(kwargs)
        for name in ("trust_remote_code", "backend", "max_batch_size"):  # HFLM options with no meaning here
            rest.pop(name, None)
        if rest:
            raise ValueError(
                f"unknown model argument(s) for {MODEL_NAME}: {', '.join(sorted(rest))}; known: pretrained, tokenizer, "
                "device, dtype, batch_size, max_length, block_length, threshold, steps, decoding, editing_threshold, "
                "max_post_steps, mc_num, mc_seed, "
                "mc_attention, mc_batch_size and the OffloadConfig fields (cache_size, cache_ratio, system, ...)"
            )
        if isinstance(batch_size, str) and not batch_size.isdigit():
            raise ValueError(f"batch_size={batch_size!r} is not supported by {MODEL_NAME}: give an integer")
        MCSettings(mask_token_id=0, mc_num=mc_num, seed=mc_seed, attention=mc_attention,  # fail before loading
                   block_length=block_length or 32, max_rows=mc_batch_size or 1)
        if isinstance(pretrained, str):
            device = offload_device(device)
            offload = resolve_offload(offload, device, int(batch_size), max_length)  # for get_model_info too
            model, loaded_tok = load_model(pretrained, device=device, dtype=dtype, offload=offload)
            tokenizer = tokenizer or loaded_tok
        else:
            if offload:
                raise ValueError("offload options need a checkpoint path as `pretrained`, not a loaded model")
            model = pretrained
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
        self.pretrained_path = str(pretrained) if isinstance(pretrained, str) else model.name_or_path
        self.offload_args = offload
        hf_logger = logging.getLogger("lm_eval.models.huggingface")
        level = hf_logger.level
        hf_logger.setLevel(logging.ERROR)  # HFLM warns that a loaded model makes its loading options moot: intended
        try:
            super().__init__(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=int(batch_size),
                             max_length=max_length)
        finally:
            hf_logger.setLevel(level)
        self.pretrained = self.pretrained_path
        gen = getattr(model, "generation_config", None)
        self.decoding = {k: v for k, v in dict(block_length=block_length, threshold=threshold, steps=steps,
                                                decoding=decoding, editing_threshold=editing_threshold,
                                                max_post_steps=max_post_steps).items() if v is not None}
        mc_block = block_length or getattr(gen, "block_length", None) or 32
        self.mc = MCSettings(
            mask_token_id=int(model.config.mask_token_id),
            mc_num=mc_num,
            seed=mc_seed,
            attention=mc_attention,
            block_length=mc_block,
            max_rows=mc_batch_size or (mc_num + 1) * max(1, self.batch_size),
        )

    # ---- bookkeeping -----------------------------------------------------------------------
    def offload_stats(self) -> dict | None:
        fn = getattr(self.model, "offload_stats", None)
        return fn() if fn is not None else None

    def reset_offload_stats(self) -> None:
        fn = getattr(self.model, "reset_offload_stats", None)
        if fn is not None:
            fn()

    def get_model_info(self) -> dict:
        """No hub lookups (HFLM asks the hub for a commit sha); the offload and MC settings instead."""
        return {
            "model_num_parameters": int(self.model.num_parameters()),
            "model_dtype": str(self.model.dtype),
            "model_path": self.pretrained_path,
            "offload_config": dict(self.offload_args) or None,
            "decoding": dict(self.decoding),
            "mc": {"mc_num": self.mc.mc_num, "mc_seed": self.mc.seed, "mc_attention": self.mc.attention,
                   "block_length": self.mc.block_length},
        }

    # ---- generate_until ----------------------------------------------------------------------
    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs) -> torch.Tensor:
        attention_mask = generation_kwargs.pop("attention_mask", None)
        do_sample = bool(generation_kwargs.pop("do_sample", False))
        temperature = generation_kwargs.pop("temperature", None)
        generation_kwargs.pop("max_new_tokens", None)
        if do_sample and temperature:
            generation_kwargs["temperature"] = float(temperature)
        for key, value in self.decoding.items():
            generation_kwargs.setdefault(key, value)
        eos_text = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        stop_strings = [s for s in (stop or []) if s and s != eos_text]  # EOS itself ends a row natively
        max_new_tokens = int(max_length) - int(context.shape[1])
        if max_new_tokens < 1:
            raise ValueError(f"max_gen_toks leaves no room to generate (max_length={max_length}, "
                             f"context={context.shape[1]} tokens)")
        return self.model.generate(
            input_ids=context,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            stop_strings=stop_strings or None,
            tokenizer=self.tokenizer if stop_strings else None,
            **generation_kwargs,
        )

    # ---- loglikelihood -----------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        limit = self.max_length
        prepared = []
        for _, context, cont in requests:
            context, cont = list(context), list(cont)
            if len(cont) > limit:
                raise ValueError(f"a continuation of {len(cont)} tokens exceeds max_length={limit}")
            if len(context) + len(cont) > limit:
                context = context[len(context) + len(cont) - limit :]
            prepared.append((context, cont))
        bar = progress(total=len(requests), quiet=disable_tqdm or self.rank != 0, unit="request",
                       desc="Running loglikelihood requests (masked-diffusion MC)")  # lines in a pipe
        results = mc_loglikelihood(self.model, prepared, self.mc, progress=bar.update)
        bar.close()
        for (key, _, _), result in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Sum of the MC estimate over lm-eval's disjoint rolling windows (each window given one token)."""
        windows, owners = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 1, context_len=1)):
                windows.append((None, ctx, cont))
                owners.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for owner, (ll, _) in zip(owners, scores):
            totals[owner] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals


__all__ = ["MODEL_NAME", "OledLLaDA2LM", "load_model", "resolve_offload", "split_offload_args"]
