"""Record a routing trace from a live model, resident or offloaded.

The recorder wraps each MoE block's experts executor (whatever it is) to capture the routing,
brackets every model forward with ``begin_forward`` / ``end_forward`` hooks, learns each forward's
kind from the decoder's ``on_forward`` notice, and hears iteration events as an observer. The
timeline it writes is the one the live run saw, so replay walks it in the same order.

Predicted routes (trace version 2): a forward hook on every decoder layer that holds MoE layer m
applies MoE layer m+1's post-attention norm and router to the hidden state leaving layer m, the
prediction a next-layer speculative prefetcher has while layer m+1 has not run yet. It reads the
model from outside (hooks only), costs one router GEMM per layer, and changes no output.

Given a ``path`` (``OffloadConfig(record_trace=...)``), the recorder owns that one file for the
model's life: every ``generate`` is appended to the trace as the next sequence and the whole trace
is rewritten atomically (temporary file + rename) when the ``generate`` ends. The path is checked
when the recorder is made (:func:`check_trace_path`): its folder must exist and be writable, it
must not be a folder, and a file already there is refused unless ``overwrite=True``. A write that
still fails after a ``generate`` (disk full) is a :class:`TraceNotSaved` warning, never an error
that would lose the ``generate``'s tokens.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from ..fileio import check_new_file
from ..modeling.events import IterationObserver
from .trace import KINDS, TraceWriter


class TraceNotSaved(UserWarning):
    """A recorder could not write its trace file after a ``generate`` (the result was still returned)."""


def check_trace_path(path: str | os.PathLike, *, overwrite: bool, field: str = "path",
                     flag: str = "overwrite=True") -> Path:
    """The trace file ``path`` names, or ValueError saying why it cannot be written (:func:`check_new_file`):
    a folder, a missing folder, an existing file without ``flag``, or a folder that refuses a new file
    (read-only, full), found by a probe file before any expert is read or any token decoded."""
    if Path(path).is_dir():
        raise ValueError(f"{field}={str(path)!r} is a folder; give the path of a trace file to write")
    return check_new_file(path, overwrite=overwrite, field=field, flag=flag)


def block_length_of(model) -> int:
    """The block length the model's generation config decodes with; absent: LLaDA2's 32. A 0 or other
    non-positive value is refused, not replaced: the trace header would misstate the run."""
    value = getattr(getattr(model, "generation_config", None), "block_length", None)
    if value is None:
        return 32
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"generation_config.block_length={value!r} is invalid: must be an integer >= 1")
    return value


class _RecordingExecutor:
    def __init__(self, recorder: TraceRecorder, moe_index: int, inner):
        self.recorder, self.moe_index, self.inner = recorder, moe_index, inner

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        self.recorder.writer.add_layer(self.moe_index, topk_ids, topk_weights)
        return self.inner(moe_block, hidden_states, topk_ids, topk_weights)


class TraceRecorder(IterationObserver):
    """Records the routing of ``model``; with ``path``, saves it after every ``generate`` (module doc)."""

    def __init__(self, model, path: str | None = None, decoding: dict | None = None, cost_model=None, *,
                 overwrite: bool = False):
        if path is not None:  # before any hook is installed: a refused path leaves the model as it was
            check_trace_path(path, overwrite=overwrite, field="record_trace", flag="record_trace_overwrite=True")
        cfg = model.config
        dtype_bytes = next(model.parameters()).element_size()
        self.writer = TraceWriter(cfg.num_moe_layers, cfg.num_experts, cfg.num_experts_per_tok,
                                  block_length_of(model),
                                  hidden_size=cfg.hidden_size, moe_intermediate_size=cfg.moe_intermediate_size,
                                  dtype_bytes=dtype_bytes, model=str(getattr(cfg, "_name_or_path", "")),
                                  decoding=decoding)
        # decoder layers before the first MoE layer: lets figures number layers as model.layers does
        dense = getattr(cfg, "first_k_dense_replace", None)  # absent (None): no dense layers before the MoE ones
        self.writer.header["first_k_dense_replace"] = 0 if dense is None else int(dense)
        if cost_model is not None:
            self.writer.header["cost_model"] = dict(vars(cost_model))
        self.path = path
        self._overwrite = overwrite  # may replace a file at ``path`` that was there before recording
        self._wrote_own = False  # ``path`` holds our own trace: rewriting it replaces nothing of the user's
        self.model = model
        self._kind = ("prefill", -1, -1)
        self._hooks = []
        self._blocks = model.moe_blocks()
        self._inner = [block.experts_executor for block in self._blocks]
        for i, block in enumerate(self._blocks):
            block.experts_executor = _RecordingExecutor(self, i, block.experts_executor)
        moe_layers = [layer for layer in model.model.layers if any(layer.mlp is b for b in self._blocks)]
        for m in range(len(moe_layers) - 1):
            hook = moe_layers[m].register_forward_hook(self._predictor(m + 1, moe_layers[m + 1]))
            self._hooks.append(hook)
        self._hooks.append(model.model.register_forward_pre_hook(self._begin))
        self._hooks.append(model.model.register_forward_hook(self._end))
        model.add_iteration_observer(self)

    def detach(self) -> None:
        for block, inner in zip(self._blocks, self._inner):
            block.experts_executor = inner
        for hook in self._hooks:
            hook.remove()
        self.model.remove_iteration_observer(self)

    def _predictor(self, next_moe: int, next_layer):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            with torch.no_grad():
                x = next_layer.post_attention_layernorm(hidden).reshape(-1, hidden.shape[-1])
                _, ids, weights = next_layer.mlp.gate(x)
            self.writer.add_prediction(next_moe, ids, weights)

        return hook

    def _begin(self, module, args):
        kind, block, iteration = self._kind
        self.writer.begin_forward(kind, block, iteration)
        self._kind = ("prefill", -1, -1)  # a forward outside generate counts as a prefill

    def _end(self, module, args, output):
        self.writer.end_forward()

    def on_forward(self, kind: str, block_index: int, iteration: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown forward kind {kind!r}")
        self._kind = (kind, block_index, iteration)

    def begin_sequence(self, seq: int) -> None:
        self.writer.begin_sequence(seq)

    def on_block_start(self, block_index, token_ids):
        self.writer.on_block_start(block_index, token_ids)

    def on_iteration(self, event):
        self.writer.on_iteration(event)

    def on_block_end(self, block_index, token_ids):
        self.writer.on_block_end(block_index, token_ids)

    def on_generate_end(self) -> None:
        if self.path:
            self.save_or_warn()
            self.writer.begin_sequence(self.writer.seq + 1)  # the next generate is the next sequence

    def save_or_warn(self) -> Path | None:
        """Rewrite ``self.path``; a failed write warns (one line: the path and the OS error) instead of raising.

        Called as a ``generate`` ends: raising there would lose the tokens the caller waited for, to
        a trace that can be written again. The trace stays in memory, so the next ``generate`` (or
        :meth:`save`) writes the whole of it; nothing partial is left at the path.
        """
        try:
            return self._save_own()
        except (OSError, ValueError) as err:
            warnings.warn(f"record_trace={self.path!r}: the trace was not saved ({' '.join(str(err).split())}); "
                          "the generate result is returned, and the next generate tries again",
                          TraceNotSaved, stacklevel=2)
            return None

    def _save_own(self) -> Path:
        """Rewrite ``self.path`` with the whole trace so far; no folder is created, no foreign file replaced."""
        target = Path(self.path)
        if not self._wrote_own:  # a file may have appeared since the check at construction
            check_trace_path(target, overwrite=self._overwrite, field="record_trace",
                             flag="record_trace_overwrite=True")
        elif target.is_dir():
            raise ValueError(f"record_trace={self.path!r} became a folder; the trace was not written")
        self.writer.save(str(target))  # atomic: a temporary file beside it, then a rename
        self._wrote_own = True
        return target

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the trace to ``path``; None: the recorder's own path, with its checks.

        An explicit ``path`` is written as given (its missing folders created, a file or link there
        replaced, never written through): the caller (``oled-moe trace record --out``) owns that
        decision and checks it first (:func:`check_trace_path`). Either way the file is written
        whole or not at all.
        """
        if path is None:
            return self._save_own()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.writer.save(str(target))
        return target
