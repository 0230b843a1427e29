"""``DiffusionGenerationMixin``: block-diffusion ``generate`` for Transformers callers.

Semantics follow the official LLaDA2 ``generate`` (shared/docs/llada2.md §5.1) with dInfer's
prefix KV cache (§5.2): prefill once over the prompt's complete blocks; each iteration forwards
only the current block against the cached prefix; after a block is final, one refresh forward
writes its clean KV (skipped when the last iteration changed nothing, dInfer's rule).

Where each behaviour comes from: the commit rule, its per-step schedule (sized by
``block_length``) and the EOS cut are the official LLaDA2.0 ``generate`` (§5.1); the cache and the
``dinfer`` commit rule are dInfer's (§5.2); LLaDA2.1 token editing (``editing_threshold``,
``max_post_steps``, ``num_to_transfer``, the ``quality``/``speed`` presets) is the public 2.1
``generate`` (dllm ``pipelines/llada21``, which mirrors the official remote code; SGLang's
``JointThreshold`` and diffusers' ``BlockRefinementScheduler`` implement the same rule, §5.5): in
editing mode each iteration commits every masked position above ``threshold``, else the
``num_to_transfer`` most confident, and ``steps`` sizes no schedule. Deliberate differences from
the official decoders: the mask token is never chosen (the official 2.1 decoder can edit a token
back into the mask and never finish), the top-n fallback never commits over an unmasked position,
``max_post_steps`` is bounded (``params.MAX_POST_STEPS``), rows of a batch decode (and edit)
independently on a shared block grid, and the output is cut after the first EOS after the prompt
and is never longer than ``max_new_tokens``.

Transformers' controls, as block diffusion applies them (the same math resident and offloaded; each is
skipped entirely when absent, so results without it are unchanged):

* ``logits_processor`` (a ``LogitsProcessorList`` or list of ``(input_ids, scores) -> scores``) runs on
  every denoising iteration's logits of the current block, before confidence and token choice, one
  call per processor per iteration: ``scores`` is [rows * block_length, vocab] (row-major), and
  ``input_ids`` row ``r * block_length + j`` is batch row ``r``'s canvas before block position ``j``
  (prompt, earlier blocks, the block's earlier positions with still-masked ones as
  ``mask_token_id``), left-padded with ``pad_token_id``, so its last column is the token just before
  ``j`` as in an autoregressive step (``_apply_processors``).
* ``repetition_penalty``: Transformers' ``RepetitionPenaltyLogitsProcessor`` rule over the tokens
  already in the row's sequence, i.e. the prompt plus every committed token (earlier blocks and the
  block's decoded positions; masks and padding excluded), at every position of the block alike; in
  editing mode a decoded position's own token counts too. Prefer it to passing Transformers'
  ``RepetitionPenaltyLogitsProcessor`` as a ``logits_processor``: that one would also penalise the
  mask and pad ids it finds in ``input_ids``, and the mask token's logit is part of every confidence.
* ``min_new_tokens`` (and ``min_length``, which counts the longest prompt): EOS logits are -inf at
  positions whose new-token index is below it, so EOS is neither committed nor edited in there.
* ``stopping_criteria``: called once per completed block (tokens inside a block are not final
  before) with every row's prompt + new tokens so far, left-padded, and ``scores=None``; a row it
  stops ends like an EOS stop: cut at that block's end and padded. A criterion that inspects only
  the newest token (``EosTokenCriteria``) sees a block's last token; ``stop_strings`` is checked at
  every token.
* Applied in Transformers' order: repetition penalty, the EOS ban, then the caller's processors.
  ``output_scores`` / ``output_logits`` / ``output_attentions`` / ``output_hidden_states`` and the
  other Transformers options raise unless neutral (``params.pop_generation_options``); an unknown
  argument raises Transformers' "not used by the model" error.

The mixin's name contains "GenerationMixin" on purpose: Transformers then
treats the model as able to generate (``can_generate``) and does not graft its own mixin on.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.utils import ModelOutput

from .canvas import build_canvas, prompt_rows
from .commit import choose_tokens, commit_dinfer, commit_official, edit_positions, transfer_schedule
from .events import IterationEvent, IterationObserver
from .params import (
    DiffusionParams,
    check_generation_config,
    check_inputs,
    check_prompt_tokens,
    check_unused_kwargs,
    pop_generation_options,
    resolve_params,
)
from .placement import input_device

logger = logging.getLogger(__name__)

# Arguments Transformers callers may pass that this decoder cannot honour when non-default (every other
# Transformers option left over is checked by params.pop_generation_options, anything else raises).
UNSUPPORTED = {"num_beams": 1, "num_return_sequences": 1, "num_beam_groups": 1, "assistant_model": None}


@dataclass
class DiffusionGenerateOutput(ModelOutput):
    """``sequences`` is prompt + new tokens; per-row decoding statistics come alongside."""

    sequences: torch.LongTensor | None = None
    iterations: torch.LongTensor | None = None  # denoising iterations each row took part in
    tokens_per_forward: torch.FloatTensor | None = None  # generated tokens / iterations, per row
    blocks: torch.LongTensor | None = None  # blocks each row decoded
    forwards: int | None = None  # model forwards of the call, prefill and KV refreshes included
    edits: torch.LongTensor | None = None  # decoded tokens replaced by LLaDA2.1 editing, per row
    edits_per_block: torch.LongTensor | None = None  # [rows, blocks decoded]: edits in each block, in order


class DiffusionGenerationMixin:
    """Adds ``generate`` and iteration observers to a model whose forward takes a ``BlockKVCache``."""

    output_modalities = ("text",)

    # ---- observers -------------------------------------------------------------------------
    @property
    def iteration_observers(self) -> list[IterationObserver]:
        if "_iteration_observers" not in self.__dict__:
            self.__dict__["_iteration_observers"] = []
        return self.__dict__["_iteration_observers"]

    def add_iteration_observer(self, observer: IterationObserver) -> None:
        if observer not in self.iteration_observers:
            self.iteration_observers.append(observer)

    def remove_iteration_observer(self, observer: IterationObserver) -> None:
        if observer in self.iteration_observers:
            self.iteration_observers.remove(observer)

    # ---- generation config loading (Transformers calls this from from_pretrained) ---------
    def adjust_generation_fn(self, generation_config, from_auto_class, from_pipeline, pretrained_model_name_or_path,
                             cache_dir=None, force_download=False, proxies=None, local_files_only=False,
                             token=None, revision=None, subfolder="", trust_remote_code=None, **kwargs):
        """Load the checkpoint's generation config and refuse one that every ``generate`` would refuse.

        Checked here, at load, so that a ``generation_config.json`` with ``block_length 0`` or
        ``max_post_steps 10**9`` fails once, naming the file and the field, instead of failing (or
        never ending) every later call.
        """
        if generation_config is not None:
            loaded = GenerationConfig.from_dict(generation_config.to_dict())
            check_generation_config(loaded, self.config, "the generation_config passed to from_pretrained")
            self.generation_config = loaded
            return
        if pretrained_model_name_or_path is None:
            return
        local = os.path.join(str(pretrained_model_name_or_path), subfolder or "", "generation_config.json")
        try:
            loaded = GenerationConfig.from_pretrained(
                pretrained_model_name_or_path, cache_dir=cache_dir, force_download=force_download, proxies=proxies,
                local_files_only=local_files_only, token=token, revision=revision, subfolder=subfolder,
                _from_auto=from_auto_class, _from_pipeline=from_pipeline,
            )
            check_generation_config(loaded, self.config, local if os.path.isfile(local) else
                                    f"generation_config.json of {pretrained_model_name_or_path}")
            self.generation_config = loaded
        except OSError as error:
            if os.path.isfile(local):  # there but unreadable: say so instead of silently using defaults
                logger.warning("%s could not be read (%s); generate uses block-diffusion defaults instead",
                               local, error)
            else:
                logger.info("no generation_config.json at %s; using block-diffusion defaults",
                            pretrained_model_name_or_path)

    # ---- generate ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        inputs: torch.LongTensor | None = None,
        generation_config: GenerationConfig | None = None,
        streamer=None,
        observers: list[IterationObserver] | None = None,
        generator: torch.Generator | None = None,
        tokenizer=None,
        **kwargs,
    ) -> torch.LongTensor | DiffusionGenerateOutput:
        """Block-diffusion decoding of left-padded prompts; returns prompt + new tokens (EOS-cut, padded).

        ``kwargs``: Transformers' generate arguments (``max_new_tokens``, ``do_sample``, ``stop_strings``,
        ``logits_processor``, ``stopping_criteria``, ``repetition_penalty``, ``min_new_tokens``... with
        the block-diffusion meaning of the module docstring) and the diffusion knobs of
        ``params.resolve_params``. Everything is checked before the first forward; an argument nothing
        here reads raises, as in Transformers.
        """
        if kwargs.get("input_ids") is not None and inputs is not None:
            raise TypeError("generate() got multiple values for argument 'input_ids': passed positionally "
                            "(inputs) and as input_ids=; pass it once")
        if kwargs.pop("inputs_embeds", None) is not None:
            raise ValueError("inputs_embeds is not supported by block-diffusion generate: the decoder writes mask "
                             "tokens into the sequence and reads token ids back; pass input_ids")
        input_ids = kwargs.pop("input_ids", None)
        input_ids = inputs if input_ids is None else input_ids
        if input_ids is None:
            raise ValueError("input_ids is required: block diffusion decodes after a non-empty prompt")
        check_streamer(streamer)
        input_ids, attention_mask = check_inputs(input_ids, kwargs.pop("attention_mask", None))
        for alias, name in (("eos_id", "eos_token_id"), ("mask_id", "mask_token_id")):
            if alias in kwargs:
                kwargs.setdefault(name, kwargs.pop(alias))
        prompts = prompt_rows(input_ids, attention_mask)
        longest = max(int(p.shape[0]) for p in prompts)
        params = resolve_params(self.config, generation_config or getattr(self, "generation_config", None),
                                longest, kwargs)
        check_prompt_tokens(prompts, self.config.vocab_size, params.mask_token_id)
        self._check_leftover_kwargs(kwargs)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(f"a streamer needs batch size 1; got {input_ids.shape[0]} prompts")
        if params.stop_strings and tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass generate(..., tokenizer=tok)")
        listeners = list(self.iteration_observers) + list(observers or [])
        decoder = _BlockDecoder(self, params, listeners, generator, tokenizer)
        if streamer is not None:
            streamer.put(input_ids.cpu())
        result = decoder.run(prompts, input_ids, streamer)
        decoder._notify("on_generate_end")
        if streamer is not None:
            streamer.end()
        return result if params.return_dict_in_generate else result.sequences

    @staticmethod
    def _check_leftover_kwargs(kwargs: dict) -> None:
        """After ``resolve_params``: beam search and friends raise, other Transformers options raise unless
        neutral, and anything else raises Transformers' own "not used by the model" error (typos)."""
        for name, default in UNSUPPORTED.items():
            value = kwargs.pop(name, default)
            if value is not None and value != default:
                raise ValueError(f"{name}={value!r} is not supported by block-diffusion generate (only {default!r})")
        pop_generation_options(kwargs)
        check_unused_kwargs(kwargs)


class _BlockDecoder:
    """One ``generate`` call's state: the canvas, the KV cache, per-row progress."""

    def __init__(self, model, params: DiffusionParams, observers, generator, tokenizer):
        self.model, self.p, self.observers = model, params, observers
        self.generator, self.tokenizer = generator, tokenizer
        self.forwards = 0

    def _notify(self, hook: str, *args) -> None:
        for observer in self.observers:
            fn = getattr(observer, hook, None)
            if fn is not None:
                fn(*args)

    def _forward(self, kind: str, block: int, iteration: int, cols: slice, keep: int | None):
        c, device = self.canvas, input_device(self.model)
        self._notify("on_forward", kind, block, iteration)
        self.forwards += 1
        if self.cache is None:  # recompute the whole prefix under the block-causal mask
            out = self.model(c.tokens[:, : cols.stop].to(device), attention_mask=c.valid[:, : cols.stop].to(device),
                             position_ids=c.position_ids[:, : cols.stop].to(device), block_length=c.block_length,
                             logits_to_keep=keep or 1)
        else:
            out = self.model(c.tokens[:, cols].to(device), attention_mask=c.valid[:, : cols.stop].to(device),
                             position_ids=c.position_ids[:, cols].to(device), past_key_values=self.cache,
                             cache_start=cols.start, block_length=c.block_length if cols.start == 0 else None,
                             logits_to_keep=keep or 1)
        return out.logits.to("cpu")

    def run(self, prompts, input_ids, streamer) -> DiffusionGenerateOutput:
        from .cache import BlockKVCache

        p = self.p
        self.canvas = c = build_canvas([q.cpu() for q in prompts], p.max_new_tokens, p.block_length,
                                       p.mask_token_id, p.pad_token_id)
        rows, b_len = c.tokens.shape[0], c.block_length
        self.cache = BlockKVCache(self.model.config.num_hidden_layers, c.tokens.shape[1]) if p.use_cache else None
        self.cut = torch.tensor([g + p.max_new_tokens for g in c.gen_start])
        self.done = torch.zeros(rows, dtype=torch.bool)
        iterations = torch.zeros(rows, dtype=torch.long)
        blocks = torch.zeros(rows, dtype=torch.long)
        edits = torch.zeros((rows, c.num_blocks - c.first_block), dtype=torch.long)
        steps = min(p.steps, max(1, p.max_new_tokens // p.minimal_topk))
        # Sized by block_length, not by the block's masked count (the official rule, §5.1 setup 4):
        # it differs in a first block that holds the prompt's tail when steps < block_length.
        self.schedule = transfer_schedule(torch.full((rows,), b_len, dtype=torch.long), steps)
        if self.cache is not None and c.first_block > 0:
            self._forward("prefill", c.first_block, -1, slice(0, c.first_block * b_len), 1)
        for block in range(c.first_block, c.num_blocks):
            cols = c.block_slice(block)
            active = self._masked(cols).any(-1)
            if not active.any():
                break
            blocks += active
            self._notify("on_block_start", block, c.tokens[:, cols].clone())
            block_iterations, edits[:, block - c.first_block], stale = self._decode_block(block, cols, active, steps)
            iterations += block_iterations
            self._finish_block(cols, active)
            # dInfer's rule (§5.2 step 5): refresh unless the last forward already saw the final tokens
            # (with editing, a block ends on an iteration that changed nothing).
            if self.cache is not None and block + 1 < c.num_blocks and not self.done.all() and stale:
                self._forward("refresh", block, int(block_iterations.max()), cols, 1)
            if streamer is not None:
                self._stream(streamer, cols)
            self._notify("on_block_end", block, c.tokens[:, cols].clone())
            if self.done.all():
                break
        return self._output(input_ids, iterations, blocks, edits)

    def _decode_block(self, block: int, cols: slice, active: torch.Tensor, steps: int):
        """Denoise one block until each row is final. Returns per-row iterations, per-row edits and
        whether the block's tokens changed after the last forward (its KV is then stale).

        Without editing (LLaDA2.0) a row's block is final when nothing is masked. With
        ``editing_threshold`` (LLaDA2.1, §5.5) each iteration commits by the 2.1 rule (``_scheduled``:
        every mask above ``threshold``, else the ``num_to_transfer`` most confident), each row also
        replaces decoded tokens (``edit_positions``) and keeps iterating: an iteration that starts with
        nothing masked is a post step, and the row's block is final after such an iteration edits
        nothing, or before a post step beyond ``max_post_steps``. Rows are independent: a final row is
        forwarded with the others but never changes again, so it gets the tokens it gets alone.
        ``eos_early_stop`` stops a row mid-block only without editing (§5.1); with editing an EOS can
        still be edited away, so, as in the 2.1 ``generate``, a row stops at the end of the block that
        holds its EOS. Iterations per block are at most the block's masked count plus
        ``max_post_steps`` (at most ``params.MAX_POST_STEPS``): every iteration with masks commits one
        or more, and an edit never re-masks.
        """
        c, p = self.canvas, self.p
        rows = c.tokens.shape[0]
        editing = p.editing_threshold is not None
        cols_idx = torch.arange(cols.start, cols.stop)
        generated = c.valid[:, cols].bool() & (cols_idx[None, :] >= torch.tensor(c.gen_start)[:, None])
        open_rows = active.clone()
        post = torch.zeros(rows, dtype=torch.long)
        iterations = torch.zeros(rows, dtype=torch.long)
        edits = torch.zeros(rows, dtype=torch.long)
        stale, iteration = False, 0
        cap = block_iteration_cap(c.block_length, p.max_post_steps if editing else 0)
        while True:
            masked = self._masked(cols) & open_rows[:, None]
            has_mask = masked.any(-1)
            if editing:
                post += open_rows & ~has_mask
                open_rows &= (post <= p.max_post_steps) & ~self.done
            else:
                open_rows &= has_mask
            if not open_rows.any():
                return iterations, edits, stale
            if iteration >= cap:
                raise RuntimeError(
                    f"block {block} still has {int(masked.sum())} masked token(s) after {cap} denoising "
                    f"iterations (the cap for block_length={c.block_length}); the commit rule stopped committing")
            logits = self._forward("denoise", block, iteration, cols, c.block_length)
            check_finite(logits, masked, block, iteration)
            logits = self._process(logits, cols, masked, block, iteration)
            before = c.tokens[:, cols]
            committed, ids, prob = self._commit(logits, masked, self._scheduled(iteration, steps, editing))
            edited = torch.zeros_like(committed)
            if editing:
                editable = generated & ~masked & open_rows[:, None] & ~self.done[:, None]  # decoded, not prompt
                edited = edit_positions(ids, prob, before, editable, p.editing_threshold)
            changed = committed | edited
            c.tokens[:, cols] = torch.where(changed, ids, before)
            stale = bool(changed.any())
            iterations += open_rows
            edits += edited.sum(-1)
            if p.eos_early_stop and not editing:  # with editing, EOS is checked once the block is final
                self._early_stop(changed)
            if self.observers:
                self._notify("on_iteration", IterationEvent(
                    block, iteration, masked, torch.where(masked, prob, torch.ones_like(prob)), committed,
                    c.tokens[:, cols].clone(), edited))
            iteration += 1
            if editing:
                open_rows &= has_mask | edited.any(-1)

    def _masked(self, cols: slice) -> torch.Tensor:
        c = self.canvas
        return (c.tokens[:, cols] == self.p.mask_token_id) & c.valid[:, cols].bool() & ~self.done[:, None]

    def _scheduled(self, iteration: int, steps: int, editing: bool) -> torch.Tensor:
        """Per row, the fewest masks the official rule commits this iteration (fewer only if fewer are left).

        LLaDA2.0: the per-block schedule (``block_length`` over ``steps``), then one per step past it
        (reachable only when the schedule's commits ran behind). LLaDA2.1 editing mode: the 2.1
        ``generate``'s rule, ``num_to_transfer`` every iteration; ``steps`` sizes nothing.
        """
        rows = self.schedule.shape[0]
        if editing:
            return torch.full((rows,), self.p.num_to_transfer, dtype=torch.long)
        if iteration < steps:
            return self.schedule[:, iteration]
        return torch.ones(rows, dtype=torch.long)

    def _commit(self, logits, masked, scheduled):
        p = self.p
        ids, prob = choose_tokens(logits, p.mask_token_id, do_sample=p.do_sample, temperature=p.temperature,
                                  top_k=p.top_k, top_p=p.top_p, generator=self.generator)
        confidence = torch.where(masked, prob, torch.full_like(prob, float("-inf")))
        if p.commit_rule == "dinfer":
            committed = commit_dinfer(confidence, p.threshold)
        else:
            committed = commit_official(confidence, scheduled, p.threshold)
        return committed & masked, ids, prob

    def _process(self, logits: torch.Tensor, cols: slice, masked: torch.Tensor, block: int,
                 iteration: int) -> torch.Tensor:
        """Transformers' logits controls on one iteration's block logits [rows, B, V], in Transformers'
        order: ``repetition_penalty``, the ``min_new_tokens`` EOS ban, then the caller's
        ``logits_processor``. Absent controls leave the tensor untouched (results do not change)."""
        p = self.p
        if p.repetition_penalty != 1.0:
            logits = repetition_penalty(logits, self._decided(cols.stop), p.repetition_penalty)
        if p.min_new_tokens > 0:
            logits = self._ban_early_eos(logits, cols)
        if p.logits_processor:
            logits = self._apply_processors(logits, cols)
            check_processed(logits, masked, block, iteration)
        return logits

    def _decided(self, end: int) -> torch.Tensor:
        """bool [rows, V]: token ids already in each row's sequence (prompt + committed, up to column ``end``)."""
        c = self.canvas
        tokens = c.tokens[:, :end]
        keep = c.valid[:, :end].bool() & (tokens != self.p.mask_token_id)
        present = torch.zeros((tokens.shape[0], self.model.config.vocab_size + 1), dtype=torch.bool)
        present.scatter_(1, torch.where(keep, tokens, present.shape[1] - 1), True)
        return present[:, :-1]

    def _ban_early_eos(self, logits: torch.Tensor, cols: slice) -> torch.Tensor:
        """EOS logits -inf at positions whose new-token index (0 = first generated) is below ``min_new_tokens``."""
        c = self.canvas
        index = torch.arange(cols.start, cols.stop)[None, :] - torch.tensor(c.gen_start)[:, None]
        early = index < self.p.min_new_tokens
        eos = torch.tensor(self.p.eos_token_ids, dtype=torch.long)
        if not bool(early.any()) or len(eos) == 0:
            return logits
        banned = torch.zeros(logits.shape[-1], dtype=torch.bool)
        banned[eos[eos < logits.shape[-1]]] = True
        return logits.masked_fill(early[..., None] & banned, float("-inf"))

    def _apply_processors(self, logits: torch.Tensor, cols: slice) -> torch.Tensor:
        """The caller's processors, one call each per iteration over every position of the block.

        ``scores`` is [rows * B, V] (row-major: row 0's B positions first); row ``r * B + j`` of
        ``input_ids`` is batch row ``r``'s canvas before block position ``j`` (prompt, earlier blocks,
        and the block's positions before ``j``, still-masked ones as ``mask_token_id``), left-padded
        with ``pad_token_id`` to one width, so the last column is the token just before ``j`` as in an
        autoregressive step. CPU tensors.
        """
        rows, b, vocab = logits.shape
        ids = prefix_ids(self.canvas.tokens, cols, self.p.pad_token_id)
        scores = logits.reshape(rows * b, vocab)
        for i, processor in enumerate(self.p.logits_processor):
            out = processor(ids, scores)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows * b, vocab):
                shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"logits_processor[{i}] ({type(processor).__name__}) returned {shape}; it must return "
                                 f"scores of the shape it was given, [{rows * b}, {vocab}]")
            scores = out.float()
        return scores.reshape(rows, b, vocab)

    def _stopping_criteria_hit(self, cols: slice, live: torch.Tensor) -> torch.Tensor:
        """bool [rows]: rows a ``stopping_criteria`` entry stops after this block.

        Each criterion is called once per completed block (tokens inside a block are not final
        before) with ``input_ids`` = every row's prompt + new tokens so far (each row up to its cut),
        left-padded with ``pad_token_id`` so the last column is the row's newest token, and
        ``scores=None`` (what Transformers passes without ``output_scores``). CPU tensors.
        """
        c = self.canvas
        rows = c.tokens.shape[0]
        seqs = [c.tokens[i, c.shift[i] : min(cols.stop, int(self.cut[i]))] for i in range(rows)]
        width = max(len(seq) for seq in seqs)
        ids = torch.full((rows, width), self.p.pad_token_id, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, width - len(seq):] = seq
        stop = torch.zeros(rows, dtype=torch.bool)
        for i, criterion in enumerate(self.p.stopping_criteria):
            stop |= row_flags(criterion(ids, None), rows, f"stopping_criteria[{i}] ({type(criterion).__name__})")
        return stop & live

    def _eos_hits(self, row_tokens: torch.Tensor) -> torch.Tensor:
        return torch.isin(row_tokens, torch.tensor(self.p.eos_token_ids, dtype=torch.long))

    def _early_stop(self, committed: torch.Tensor) -> None:
        """eos_early_stop: a row stops mid-block once an EOS is committed with nothing masked before it."""
        c = self.canvas
        for i in torch.nonzero(committed.any(-1) & ~self.done).flatten().tolist():
            gen = c.tokens[i, c.gen_start[i] : self.cut[i]]
            eos = torch.nonzero(self._eos_hits(gen)).flatten()
            if len(eos) and not bool((gen[: eos[0]] == self.p.mask_token_id).any()):
                self.cut[i] = c.gen_start[i] + int(eos[0]) + 1
                self.done[i] = True

    def _finish_block(self, cols: slice, active: torch.Tensor) -> None:
        """After a block: rows whose output now holds an EOS (or a stop string) are finished."""
        c = self.canvas
        for i in torch.nonzero(active & ~self.done).flatten().tolist():
            end = min(cols.stop, int(self.cut[i]))
            gen = c.tokens[i, c.gen_start[i] : end]
            eos = torch.nonzero(self._eos_hits(gen)).flatten()
            if len(eos):
                self.cut[i] = c.gen_start[i] + int(eos[0]) + 1
                self.done[i] = True
            elif self.p.stop_strings:
                hit = _stop_string_cut(self.tokenizer, gen, self.p.stop_strings)
                if hit is not None:
                    self.cut[i], self.done[i] = c.gen_start[i] + hit, True
            if end >= int(self.cut[i]):
                self.done[i] = True
        if self.p.stopping_criteria:  # a stopped row ends like an EOS stop: cut at the block's end, padded
            for i in torch.nonzero(self._stopping_criteria_hit(cols, active & ~self.done)).flatten().tolist():
                self.cut[i] = min(int(self.cut[i]), cols.stop)
                self.done[i] = True

    def _stream(self, streamer, cols: slice) -> None:
        c = self.canvas
        start, end = max(cols.start, c.gen_start[0]), min(cols.stop, int(self.cut[0]))
        if end > start:
            streamer.put(c.tokens[0, start:end].clone())

    def _output(self, input_ids, iterations, blocks, edits) -> DiffusionGenerateOutput:
        c, p = self.canvas, self.p
        lengths = (self.cut - torch.tensor(c.gen_start)).clamp(min=0)
        width = int(lengths.max())
        new = torch.full((len(c.gen_start), width), p.pad_token_id, dtype=torch.long)
        for i, g in enumerate(c.gen_start):
            new[i, : int(lengths[i])] = c.tokens[i, g : g + int(lengths[i])]
        sequences = torch.cat([input_ids.cpu(), new], dim=1).to(input_ids.device)
        tpf = lengths.float() / iterations.clamp(min=1).float()
        decoded = int(blocks.max()) if len(blocks) else 0
        return DiffusionGenerateOutput(sequences=sequences, iterations=iterations, tokens_per_forward=tpf,
                                       blocks=blocks, forwards=self.forwards, edits=edits.sum(-1),
                                       edits_per_block=edits[:, :decoded])


def check_streamer(streamer) -> None:
    """A streamer needs callable ``put`` and ``end``: checked before decoding, since ``end`` is called
    only after the whole generation, which a missing one would otherwise lose."""
    if streamer is None:
        return
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise ValueError(f"streamer={type(streamer).__name__} has no callable {' or '.join(missing)}(): a streamer "
                         "needs put(token_ids) and end() (e.g. transformers.TextStreamer)")


def block_iteration_cap(block_length: int, post_steps: int = 0) -> int:
    """Most denoising iterations a block may take: every iteration with masks commits at least one.

    Both commit rules guarantee one commit per iteration while the logits are finite, so a block of
    ``block_length`` positions runs out of masks within that many, plus at most ``post_steps``
    editing-only iterations (LLaDA2.1); more means the decoder is broken and would otherwise loop
    forever.
    """
    return block_length + post_steps


def check_finite(logits: torch.Tensor, masked: torch.Tensor, block: int, iteration: int) -> None:
    """Refuse logits at masked positions that give no distribution (NaN, +inf, or every entry -inf):
    their confidence is NaN and never passes a threshold, so nothing would ever commit. A -inf for
    some tokens is a legitimate ban and passes. Names the forward (block, iteration) and the rows."""
    bad = (logits.isnan().any(-1) | logits.isposinf().any(-1) | logits.isneginf().all(-1)) & masked
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(-1)).flatten().tolist()
        raise FloatingPointError(
            f"the denoise forward of block {block}, iteration {iteration} produced non-finite logits (NaN or inf) "
            f"at {int(bad.sum())} masked position(s) of batch row(s) {rows}; the model's weights give NaN/inf "
            "(e.g. a corrupt expert in the checkpoint), so no token can be chosen")


def repetition_penalty(logits: torch.Tensor, present: torch.Tensor, penalty: float) -> torch.Tensor:
    """Transformers' ``RepetitionPenaltyLogitsProcessor`` rule on [rows, B, V] logits: for every token id
    already in the row's sequence (``present``, bool [rows, V]), a negative logit is multiplied by
    ``penalty`` and a positive one divided by it, at every position of the block alike. Unlike
    Transformers', the result is clamped into the finite range of the logits' dtype: an extreme
    penalty (``params.MIN_REPETITION_PENALTY`` bounds it) saturates a logit instead of making it
    +-inf, which would leave no choosable token (NaN confidences) and the block never finished."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    big = torch.finfo(logits.dtype).max
    penalised = torch.where(logits.isfinite(), penalised.clamp(-big, big), logits)  # a ban (-inf) stays one
    return torch.where(present[:, None, :], penalised, logits)


def prefix_ids(tokens: torch.Tensor, cols: slice, pad_token_id: int) -> torch.Tensor:
    """[rows * B, cols.start + B - 1]: row ``r * B + j`` is ``tokens[r, :cols.start + j]`` right-aligned
    (left-padded with ``pad_token_id``): what a logits processor sees for block position ``j``."""
    rows, b = tokens.shape[0], cols.stop - cols.start
    width = cols.start + b - 1
    source = torch.arange(width)[None, :] - (b - 1 - torch.arange(b))[:, None]  # [B, width], < 0: padding
    gathered = tokens[:, source.clamp(min=0)]  # [rows, B, width]
    ids = torch.where(source[None] >= 0, gathered, torch.full_like(gathered, pad_token_id))
    return ids.reshape(rows * b, width)


def row_flags(result, rows: int, who: str) -> torch.Tensor:
    """A stopping criterion's answer as bool [rows]: a bool, a 0-d or a [rows] tensor (Transformers allows
    each); anything else is the criterion's error, named."""
    try:
        flags = torch.as_tensor(result).to("cpu", torch.bool)
    except (TypeError, ValueError, RuntimeError):
        flags = None
    if flags is not None and flags.dim() == 0:
        return flags.expand(rows)
    if flags is None or tuple(flags.shape) != (rows,):
        got = list(flags.shape) if flags is not None else type(result).__name__
        raise ValueError(f"{who} returned {got}; a stopping criterion returns a bool or a bool tensor of shape "
                         f"[{rows}] (one per row)")
    return flags


def check_processed(logits: torch.Tensor, masked: torch.Tensor, block: int, iteration: int) -> None:
    """After the caller's logits processors: masked positions must still give a distribution (no NaN or
    +inf, not every entry -inf), else no token could be chosen; names the processors, not the model."""
    bad = (logits.isnan().any(-1) | logits.isposinf().any(-1) | logits.isneginf().all(-1)) & masked
    if bool(bad.any()):
        rows = torch.nonzero(bad.any(-1)).flatten().tolist()
        raise ValueError(f"logits_processor left no choosable token (NaN, +inf or every entry -inf) at "
                         f"{int(bad.sum())} masked position(s) of batch row(s) {rows} in block {block}, "
                         f"iteration {iteration}")


def _stop_string_cut(tokenizer, tokens: torch.Tensor, stop_strings: list[str]) -> int | None:
    """Smallest token count whose decoded text contains a stop string (None if none does)."""
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    if not any(s in text for s in stop_strings):
        return None
    for k in range(1, len(tokens) + 1):
        if any(s in tokenizer.decode(tokens[:k], skip_special_tokens=False) for s in stop_strings):
            return k
    return None
