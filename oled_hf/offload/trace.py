"""Routing traces: what a generate call routed, recorded once, replayable through any policy.

A trace is a header plus an ordered timeline of four kinds of item, exactly as the live run saw
them: forwards (per MoE layer ``topk_ids`` [T, k] and ``topk_weights``), iteration events (the
decoder's masked / confidence / committed / token ids / edited), block starts and block ends. Replay walks
the same timeline, so policies hear routing and events in the live order (a forward's routing
first, then its event).

On disk: one ``torch.save`` file holding a dict of flat tensors (ids as int16, gate weights as
float16, ragged parts as offsets), loadable with ``weights_only=True``, written atomically (a
temporary file beside it, then a rename). Every trace, loaded or built in memory, passes
:func:`~oled_hf.offload.trace_format.check_trace_data` first: each field's type, shape and range, and
the memory readers would size from the header.

Version 2 adds, per forward and MoE layer, *predicted* routes (``pred_ids`` / ``pred_weights``,
shaped like ``topk_ids``): for layer l >= 1, layer l's router applied to the hidden state leaving
layer l-1 (the speculative next-layer gating of Mixtral-offloading / Pre-gated MoE / ProMoE /
HybriMoE); layer 0 has none (-1). The prefetch baseline replays them; version-1 traces (no
predictions) still load and replay everything else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import torch

from oled_hf.modeling.events import IterationEvent, IterationObserver

from ..fileio import write_atomically
from .trace_format import (  # the format's names and checks
    FORMAT,
    KINDS,
    OP_BLOCK_END,
    OP_BLOCK_START,
    OP_EVENT,
    OP_FORWARD,
    VERSION,
    check_trace_data,
)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


@dataclass
class ForwardRecord:
    kind: str
    seq: int
    block_index: int
    iteration: int
    topk_ids: np.ndarray  # [num_moe_layers, T, k]
    topk_weights: np.ndarray  # [num_moe_layers, T, k]


class Trace:
    """A loaded trace: header dict + flat arrays; records are views, built on demand."""

    def __init__(self, data: dict[str, Any]) -> None:
        # every field checked for type, shape and range before any reader sizes or indexes with it
        self.version, self.header, self.arrays = check_trace_data(data)
        a = self.arrays
        self.num_layers = int(self.header["num_moe_layers"])
        self.num_experts = int(self.header["num_experts"])
        self.num_forwards = int(a["fwd_kind"].shape[0])
        self.num_events = int(a["ev_block"].shape[0])
        self.row_offsets = a["fwd_rows"]

    # ------------------------------------------------------------------ access
    def ops(self) -> Iterator[tuple[int, int]]:
        """The timeline: ``(op, index)`` with op one of OP_FORWARD, OP_EVENT, OP_BLOCK_START/END."""
        return zip(self.arrays["op"].tolist(), self.arrays["op_index"].tolist())

    def forward(self, i: int) -> ForwardRecord:
        a, r0, r1 = self.arrays, int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        return ForwardRecord(KINDS[int(a["fwd_kind"][i])], int(a["fwd_seq"][i]), int(a["fwd_block"][i]),
                             int(a["fwd_iter"][i]), a["topk_ids"][:, r0:r1], a["topk_weights"][:, r0:r1])

    def routing(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(topk_ids, topk_weights)`` of forward i, each [num_moe_layers, T, k] (views)."""
        r0, r1 = int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        return self.arrays["topk_ids"][:, r0:r1], self.arrays["topk_weights"][:, r0:r1]

    @property
    def has_predictions(self) -> bool:
        """True for version-2 traces that carry predicted next-layer routes."""
        return "pred_ids" in self.arrays

    def predicted_routing(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Predicted ``(ids, weights)`` of forward i, [num_moe_layers, T, k]; layer 0 (and any layer
        without a prediction) holds ids -1. Raises for a trace without predictions."""
        if not self.has_predictions:
            raise ValueError("this trace has no predicted routes (version 1): record it again to get them")
        r0, r1 = int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        return self.arrays["pred_ids"][:, r0:r1], self.arrays["pred_weights"][:, r0:r1]

    def event(self, i: int) -> IterationEvent:
        a = self.arrays
        e0, e1, b = int(a["ev_offsets"][i]), int(a["ev_offsets"][i + 1]), int(a["ev_batch"][i])

        def t(name: str) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a[name][e0:e1])).reshape(b, -1)

        edited = t("ev_edited") if "ev_edited" in a else None  # absent in traces written before editing
        return IterationEvent(int(a["ev_block"][i]), int(a["ev_iter"][i]), t("ev_masked"),
                              t("ev_confidence"), t("ev_committed"), t("ev_token_ids").long(), edited)

    def marker(self, i: int) -> tuple[int, torch.Tensor]:
        a = self.arrays
        m0, m1, b = int(a["mk_offsets"][i]), int(a["mk_offsets"][i + 1]), int(a["mk_batch"][i])
        return int(a["mk_block"][i]), torch.from_numpy(a["mk_token_ids"][m0:m1].astype(np.int64)).reshape(b, -1)

    def deliver(self, observer: IterationObserver, op: int, i: int) -> None:
        """Hand a non-forward timeline item (event, block start, block end) to an observer."""
        if op == OP_EVENT:
            observer.on_iteration(self.event(i))
        elif op == OP_BLOCK_START:
            observer.on_block_start(*self.marker(i))
        elif op == OP_BLOCK_END:
            observer.on_block_end(*self.marker(i))

    @property
    def routing_entries(self) -> int:
        """Total (layer, token, k) routing entries."""
        return int(np.prod(self.arrays["topk_ids"].shape))

    def output_tokens(self) -> int:
        """Tokens committed by the recorded iteration events."""
        return int(self.arrays["ev_committed"].sum())

    def edits(self) -> int:
        """Decoded tokens replaced by LLaDA2.1 editing in the recorded iteration events."""
        return int(self.arrays["ev_edited"].sum()) if "ev_edited" in self.arrays else 0

    def save(self, path: str | os.PathLike | BinaryIO) -> None:
        """The trace as one ``torch.save`` file: a path is written atomically (a temporary file beside
        it, then a rename; a failure is one OSError naming it, and leaves nothing); a binary file
        object gets the bytes as they are."""
        data: dict[str, Any] = {"format": FORMAT, "version": self.version, "header": self.header}
        data.update({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.arrays.items()})
        if hasattr(path, "write"):
            torch.save(data, path)
            return

        def save(tmp: str) -> None:
            with open(tmp, "wb") as fh:  # a Python file: a failed write is an OSError with its errno
                torch.save(data, fh)     # (torch's own file writer says only "enforce fail")

        write_atomically(save, path)


def load_trace(path: str | os.PathLike) -> Trace:
    """The trace in ``path``, every field checked (:mod:`.trace_format`); a ValueError names the file and field."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # pickle/zip errors: say what the file should be
        raise ValueError(f"{path}: not a readable {FORMAT} file ({exc})") from exc
    try:
        return Trace(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


class TraceWriter(IterationObserver):
    """Records a trace. Register it as an iteration observer and feed it each forward's routing.

    Either ``add_forward(kind, block, iteration, ids_per_layer, weights_per_layer)`` at once, or
    ``begin_forward`` / ``add_layer`` (from each MoE layer) / ``end_forward``.
    """

    def __init__(self, num_moe_layers: int, num_experts: int, top_k: int, block_length: int, *,
                 hidden_size: int = 0, moe_intermediate_size: int = 0, dtype_bytes: int = 2,
                 model: str = "", decoding: dict[str, Any] | None = None) -> None:
        self.header = {"num_moe_layers": int(num_moe_layers), "num_experts": int(num_experts),
                       "top_k": int(top_k), "block_length": int(block_length), "hidden_size": int(hidden_size),
                       "moe_intermediate_size": int(moe_intermediate_size), "dtype_bytes": int(dtype_bytes),
                       "model": str(model), "decoding": dict(decoding or {})}
        self.seq = 0
        self._ops: list[tuple[int, int]] = []
        self._fwd: list[tuple[int, int, int, int]] = []
        self._ids: list[np.ndarray] = []
        self._w: list[np.ndarray] = []
        self._ev: list[tuple[int, int, int]] = []
        self._ev_data: list[tuple[np.ndarray, ...]] = []
        self._mk: list[tuple[int, int]] = []
        self._mk_tokens: list[np.ndarray] = []
        self._pending: dict[str, Any] | None = None
        self._pred_ids: list[np.ndarray | None] = []  # per forward: predicted routes [L, T, k] or None
        self._pred_w: list[np.ndarray | None] = []

    def begin_sequence(self, seq: int) -> None:
        self.seq = int(seq)

    def add_forward(self, kind: str, block_index: int, iteration: int,
                    topk_ids_per_layer: Sequence[Any], topk_weights_per_layer: Sequence[Any],
                    predicted: tuple[Sequence[Any | None], Sequence[Any | None]] | None = None) -> None:
        """One forward's routing; ``predicted`` = (ids, weights) per layer (None where a layer has
        no prediction, e.g. layer 0) makes the trace version 2."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")
        if len(topk_ids_per_layer) != self.header["num_moe_layers"]:
            raise ValueError(
                f"got routing for {len(topk_ids_per_layer)} layers, trace has {self.header['num_moe_layers']}"
            )
        dtype = np.int16 if self.header["num_experts"] <= np.iinfo(np.int16).max else np.int32
        ids = np.stack([_np(x).reshape(-1, self.header["top_k"]) for x in topk_ids_per_layer]).astype(dtype)
        w = np.stack([_np(x).astype(np.float32).reshape(ids.shape[1:]) for x in topk_weights_per_layer])
        self._ops.append((OP_FORWARD, len(self._fwd)))
        self._fwd.append((KINDS.index(kind), self.seq, int(block_index), int(iteration)))
        self._ids.append(ids)
        self._w.append(w.astype(np.float16))
        if predicted is None:
            self._pred_ids.append(None)
            self._pred_w.append(None)
            return
        p_ids = np.full(ids.shape, -1, dtype=ids.dtype)
        p_w = np.zeros(ids.shape, dtype=np.float16)
        for layer, (pi, pw) in enumerate(zip(*predicted)):
            if pi is not None:
                p_ids[layer] = _np(pi).reshape(ids.shape[1:])
                p_w[layer] = _np(pw).astype(np.float32).reshape(ids.shape[1:])
        self._pred_ids.append(p_ids)
        self._pred_w.append(p_w)

    def begin_forward(self, kind: str, block_index: int, iteration: int) -> None:
        self._pending = {"kind": kind, "block": block_index, "iteration": iteration, "ids": {}, "w": {},
                         "pred": {}}

    def add_layer(self, layer: int, topk_ids: Any, topk_weights: Any) -> None:
        if self._pending is None:
            raise RuntimeError("add_layer called outside begin_forward/end_forward")
        self._pending["ids"][layer] = _np(topk_ids).copy()
        self._pending["w"][layer] = _np(topk_weights).astype(np.float32)

    def add_prediction(self, layer: int, topk_ids: Any, topk_weights: Any) -> None:
        """Predicted routes of MoE layer ``layer`` in the pending forward (from the previous layer's output)."""
        if self._pending is None:
            raise RuntimeError("add_prediction called outside begin_forward/end_forward")
        self._pending["pred"][layer] = (_np(topk_ids).copy(), _np(topk_weights).astype(np.float32))

    def end_forward(self) -> None:
        p, self._pending = self._pending, None
        if p is None:
            raise RuntimeError("end_forward called without begin_forward")
        layers = range(self.header["num_moe_layers"])
        pred = None
        if p["pred"]:
            got = [p["pred"].get(l, (None, None)) for l in layers]
            pred = ([g[0] for g in got], [g[1] for g in got])
        self.add_forward(p["kind"], p["block"], p["iteration"], [p["ids"][l] for l in layers],
                         [p["w"][l] for l in layers], pred)

    def on_block_start(self, block_index: int, token_ids: torch.Tensor) -> None:
        self._marker(OP_BLOCK_START, block_index, token_ids)

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        self._marker(OP_BLOCK_END, block_index, token_ids)

    def _marker(self, op: int, block_index: int, token_ids: Any) -> None:
        tok = _np(token_ids)
        self._ops.append((op, len(self._mk)))
        self._mk.append((int(block_index), int(tok.shape[0]) if tok.ndim > 1 else 1))
        self._mk_tokens.append(tok.reshape(-1).astype(np.int64))

    def on_iteration(self, event: IterationEvent) -> None:
        masked = _np(event.masked)
        self._ops.append((OP_EVENT, len(self._ev)))
        self._ev.append((int(event.block_index), int(event.iteration), int(masked.shape[0]) if masked.ndim > 1 else 1))
        edited = event.edited if getattr(event, "edited", None) is not None else np.zeros(masked.shape, bool)
        self._ev_data.append(tuple(_np(x).reshape(-1) for x in (event.masked, event.confidence, event.committed,
                                                                 event.token_ids, edited)))

    # ------------------------------------------------------------------ output
    def trace(self) -> Trace:
        k, L = self.header["top_k"], self.header["num_moe_layers"]
        rows = [x.shape[1] for x in self._ids]
        ev_len = [d[0].shape[0] for d in self._ev_data]
        mk_len = [t.shape[0] for t in self._mk_tokens]
        fwd = np.asarray(self._fwd, dtype=np.int64).reshape(-1, 4)

        def cat(parts: list[np.ndarray], dtype: Any, shape: tuple[int, ...] = (0,)) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype=dtype)

        data: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "header": self.header,
            "op": np.asarray([o for o, _ in self._ops], dtype=np.int8),
            "op_index": np.asarray([i for _, i in self._ops], dtype=np.int64),
            "fwd_kind": fwd[:, 0].astype(np.int8), "fwd_seq": fwd[:, 1].astype(np.int32),
            "fwd_block": fwd[:, 2].astype(np.int32), "fwd_iter": fwd[:, 3].astype(np.int32),
            "fwd_rows": np.concatenate(([0], np.cumsum(rows))).astype(np.int64),
            "topk_ids": np.concatenate(self._ids, axis=1) if self._ids else np.zeros((L, 0, k), np.int16),
            "topk_weights": np.concatenate(self._w, axis=1) if self._w else np.zeros((L, 0, k), np.float16),
            "ev_block": np.asarray([e[0] for e in self._ev], dtype=np.int32),
            "ev_iter": np.asarray([e[1] for e in self._ev], dtype=np.int32),
            "ev_batch": np.asarray([e[2] for e in self._ev], dtype=np.int32),
            "ev_offsets": np.concatenate(([0], np.cumsum(ev_len))).astype(np.int64),
            "ev_masked": cat([d[0] for d in self._ev_data], bool),
            "ev_confidence": cat([d[1] for d in self._ev_data], np.float32),
            "ev_committed": cat([d[2] for d in self._ev_data], bool),
            "ev_token_ids": cat([d[3] for d in self._ev_data], np.int32),
            "ev_edited": cat([d[4] for d in self._ev_data], bool),  # LLaDA2.1 edits (optional: older traces lack it)
            "mk_block": np.asarray([m[0] for m in self._mk], dtype=np.int32),
            "mk_batch": np.asarray([m[1] for m in self._mk], dtype=np.int32),
            "mk_offsets": np.concatenate(([0], np.cumsum(mk_len))).astype(np.int64),
            "mk_token_ids": cat(self._mk_tokens, np.int32),
        }
        if any(p is not None for p in self._pred_ids):  # version 2: predicted routes for every forward
            data["version"] = VERSION
            full = [np.full(x.shape, -1, x.dtype) if p is None else p for x, p in zip(self._ids, self._pred_ids)]
            fw = [np.zeros(x.shape, np.float16) if p is None else p for x, p in zip(self._ids, self._pred_w)]
            data["pred_ids"] = np.concatenate(full, axis=1)
            data["pred_weights"] = np.concatenate(fw, axis=1)
        else:
            data["version"] = 1
        return Trace(data)

    def save(self, path: str) -> None:
        self.trace().save(path)
