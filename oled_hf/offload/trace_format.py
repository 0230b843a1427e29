"""The trace file format, checked field by field before anything reads it.

A trace comes from a file anyone may have written or edited, and readers size arrays from its
header (replay keeps state per layer and expert, the synthetic fit draws logits per block position
and expert) and index arrays with its offsets and ids. :func:`check_trace_data` is the one gate
between ``torch.load`` and every reader (``trace replay``, ``trace synth --fit/--like``, the
report, the figures): each header field and array is checked for type, shape and range, offsets
against the arrays they cut, ids against the header, and the memory the readers would allocate
from the header against :data:`READER_BYTES_LIMIT`, before any of it is used. A failure is one
ValueError naming the field, the value and what is allowed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

FORMAT = "oled-trace"
VERSION = 2  # written when predicted routes are present; version-1 files still load
SUPPORTED_VERSIONS = (1, 2)
KINDS = ("prefill", "denoise", "refresh")
OP_FORWARD, OP_EVENT, OP_BLOCK_START, OP_BLOCK_END = 0, 1, 2, 3
HEADER_KEYS = ("num_moe_layers", "num_experts", "top_k", "block_length", "hidden_size",
               "moe_intermediate_size", "dtype_bytes")

# The most memory a reader may allocate from a trace's header alone. The estimate is the larger of:
# replay's per-(layer, expert) state (ready times, prefetch books, residency, policy scores, a few
# float64/bool arrays each: REPLAY_BYTES_PER_EXPERT), and the synthetic fit's draws of
# 40 sequences x 6 blocks x block_length x num_experts float64 logits, with ~5 live copies
# (sim/synth_fit.py route_stats: the draw, the sum, argpartition's negation and int64 indices).
READER_BYTES_LIMIT = 4 << 30
REPLAY_BYTES_PER_EXPERT = 512
FIT_BYTES_PER_POSITION_EXPERT = 40 * 6 * 8 * 5
DTYPE_BYTES = (1, 2, 4, 8)

ARRAY_KINDS = {  # name: (numpy kind: i integer, f float, b bool; dimensions)
    "op": ("i", 1), "op_index": ("i", 1),
    "fwd_kind": ("i", 1), "fwd_seq": ("i", 1), "fwd_block": ("i", 1), "fwd_iter": ("i", 1), "fwd_rows": ("i", 1),
    "topk_ids": ("i", 3), "topk_weights": ("f", 3),
    "ev_block": ("i", 1), "ev_iter": ("i", 1), "ev_batch": ("i", 1), "ev_offsets": ("i", 1),
    "ev_masked": ("b", 1), "ev_confidence": ("f", 1), "ev_committed": ("b", 1), "ev_token_ids": ("i", 1),
    "mk_block": ("i", 1), "mk_batch": ("i", 1), "mk_offsets": ("i", 1), "mk_token_ids": ("i", 1),
}
OPTIONAL_ARRAYS = {"ev_edited": ("b", 1), "pred_ids": ("i", 3), "pred_weights": ("f", 3)}
KIND_NAMES = {"i": "an integer", "f": "a floating-point", "b": "a bool"}


def check_trace_data(data: Any) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
    """``(version, header, arrays)`` of a loaded trace dict, or a ValueError naming the bad field."""
    if not isinstance(data, dict):
        raise ValueError(f"not an {FORMAT} file (a {type(data).__name__}, not a dict)")
    if data.get("format") != FORMAT:
        raise ValueError(f"not an {FORMAT} file (format={data.get('format')!r})")
    version = data.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise ValueError(f"trace version {version!r} is not supported "
                         f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    header = check_header(data.get("header"))
    arrays = {}
    for name, value in data.items():
        if name in ("format", "version", "header"):
            continue
        if name not in ARRAY_KINDS and name not in OPTIONAL_ARRAYS:
            raise ValueError(f"trace field {name!r} is unknown; allowed: {', '.join([*ARRAY_KINDS, *OPTIONAL_ARRAYS])}")
        arrays[name] = _array(name, value)
    missing = [n for n in ARRAY_KINDS if n not in arrays]
    if version == 2:
        missing += [n for n in ("pred_ids", "pred_weights") if n not in arrays]
    if missing:
        raise ValueError(f"trace field {missing[0]!r} is missing (a version-{version} trace has "
                         f"{', '.join(ARRAY_KINDS)}{', pred_ids, pred_weights' if version == 2 else ''})")
    if ("pred_ids" in arrays) != ("pred_weights" in arrays):
        raise ValueError("trace fields 'pred_ids' and 'pred_weights' come together: one is missing")
    check_arrays(header, arrays)
    return int(version), header, arrays


# ------------------------------------------------------------------------------------------------ header
def _int_field(header: dict, name: str, low: int, high: int | None = None, what: str = "") -> int:
    value = header.get(name)
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok and value >= low and (high is None or value <= high):
        return int(value)
    allowed = what or (f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]")
    raise ValueError(f"trace header {name}={value!r} is invalid: must be {allowed}")


def check_header(header: Any) -> dict[str, Any]:
    """The header as a plain dict once every field a reader uses is of the right type and range."""
    if not isinstance(header, dict):
        raise ValueError(f"trace header is a {type(header).__name__}, not a dict")
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise ValueError(f"trace header field {missing[0]!r} is missing (a trace header has {', '.join(HEADER_KEYS)})")
    h = dict(header)
    layers = _int_field(h, "num_moe_layers", 1)
    experts = _int_field(h, "num_experts", 1, np.iinfo(np.int32).max)
    _int_field(h, "top_k", 1, experts, f"an integer in [1, num_experts={experts}]")
    block = _int_field(h, "block_length", 1)
    _int_field(h, "hidden_size", 0, what="an integer >= 0 (0: unknown)")
    _int_field(h, "moe_intermediate_size", 0, what="an integer >= 0 (0: unknown)")
    _int_field(h, "dtype_bytes", 1, 8, f"one of {', '.join(map(str, DTYPE_BYTES))}")
    if h["dtype_bytes"] not in DTYPE_BYTES:
        raise ValueError(f"trace header dtype_bytes={h['dtype_bytes']!r} is invalid: must be one of "
                         f"{', '.join(map(str, DTYPE_BYTES))}")
    for name, low in (("batch_size", 1), ("first_k_dense_replace", 0)):
        if name in h:
            _int_field(h, name, low)
    for name in ("model", "prompts"):
        if name in h and not isinstance(h[name], str):
            raise ValueError(f"trace header {name}={h[name]!r} is invalid: must be a string")
    _check_decoding(h.get("decoding", {}))
    if "cost_model" in h:
        _check_cost_model(h["cost_model"])
    check_reader_memory(layers, experts, block)
    return h


def _check_decoding(decoding: Any) -> None:
    if not isinstance(decoding, dict):
        raise ValueError(f"trace header decoding={decoding!r} is invalid: must be a dict of generate options")
    t = decoding.get("threshold")
    if t is not None and not (_real(t) and 0.0 <= float(t) <= 1.0):
        raise ValueError(f"trace header decoding.threshold={t!r} is invalid: must be a number in [0, 1] or absent")


def _check_cost_model(cost: Any) -> None:
    if not isinstance(cost, dict):
        raise ValueError(f"trace header cost_model={cost!r} is invalid: must be a dict of CostModel fields")
    from .costmodel import CostModel

    try:
        CostModel(**cost)  # its own checks: known fields, finite, >= 0
    except TypeError as err:
        raise ValueError(f"trace header cost_model is invalid: {err}") from None
    except ValueError as err:
        raise ValueError(f"trace header cost_model is invalid: {err}") from None


def _real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def reader_bytes(num_moe_layers: int, num_experts: int, block_length: int) -> int:
    """The estimate of the most memory a reader allocates from these header fields (module doc)."""
    return max(num_moe_layers * num_experts * REPLAY_BYTES_PER_EXPERT,
               block_length * num_experts * FIT_BYTES_PER_POSITION_EXPERT)


def check_reader_memory(num_moe_layers: int, num_experts: int, block_length: int) -> None:
    need = reader_bytes(num_moe_layers, num_experts, block_length)
    if need > READER_BYTES_LIMIT:
        raise ValueError(
            f"trace header num_moe_layers={num_moe_layers}, num_experts={num_experts}, block_length={block_length}: "
            f"readers would allocate about {need / 2**30:.1f} GiB (replay {REPLAY_BYTES_PER_EXPERT} B per layer "
            f"and expert, the synthetic fit {FIT_BYTES_PER_POSITION_EXPERT} B per block position and expert), "
            f"more than the {READER_BYTES_LIMIT / 2**30:g} GiB allowed")


# ------------------------------------------------------------------------------------------------ arrays
def _array(name: str, value: Any) -> np.ndarray:
    kind, ndim = ARRAY_KINDS.get(name) or OPTIONAL_ARRAYS[name]
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if not isinstance(value, np.ndarray):
        raise ValueError(f"trace field {name!r} is a {type(value).__name__}, not a tensor")
    got = "i" if value.dtype.kind in "iu" else value.dtype.kind
    if got != kind or value.ndim != ndim:
        raise ValueError(f"trace field {name!r} has dtype {value.dtype} and {value.ndim} dimension(s); "
                         f"must be {KIND_NAMES[kind]} tensor with {ndim}")
    return value


def _at(name: str, a: np.ndarray, bad: np.ndarray) -> str:
    """``name[i, j]=value`` of the first entry where ``bad`` holds."""
    i = tuple(int(x) for x in np.argwhere(bad)[0])
    return f"{name}[{', '.join(map(str, i))}]={a[i].item()!r}"


def _range(name: str, a: np.ndarray, low: int | float, high: int | float | None = None) -> None:
    if not a.size:
        return
    if a.min() < low or (high is not None and a.max() > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        bad = (a < low) | (a > high) if high is not None else a < low
        raise ValueError(f"trace field {_at(name, a, bad)} is out of range: must be {allowed}")


def _length(name: str, a: np.ndarray, n: int, of: str) -> None:
    if a.shape[0] != n:
        raise ValueError(f"trace field {name!r} has {a.shape[0]} entries; must have {n} ({of})")


def _offsets(name: str, off: np.ndarray, count: int, total: int, data: str, batch: np.ndarray) -> None:
    """``off`` cuts an array of ``total`` entries into ``count`` parts, each a whole [batch, n] tensor."""
    _length(name, off, count + 1, f"one more than the {count} items it cuts")
    if off[0] != 0 or off[-1] != total:
        bad, at = (off[0], 0) if off[0] != 0 else (off[-1], count)
        raise ValueError(f"trace field {name}[{at}]={int(bad)} is invalid: offsets run from 0 to the length of "
                         f"{data!r} ({total})")
    step = np.diff(off)
    if (step < 0).any():
        i = int(np.flatnonzero(step < 0)[0])
        raise ValueError(f"trace field {name}[{i + 1}]={int(off[i + 1])} is below {name}[{i}]={int(off[i])}: "
                         "offsets must not decrease")
    if batch is not None and (step % batch).any():
        i = int(np.flatnonzero(step % batch)[0])
        raise ValueError(f"trace field {name}: item {i} has {int(step[i])} entries, not a multiple of its batch "
                         f"{int(batch[i])}")


def _finite(name: str, a: np.ndarray, low: float) -> None:
    if not np.isfinite(a).all():
        raise ValueError(f"trace field {_at(name, a, ~np.isfinite(a))} is invalid: must be a finite number >= {low}")
    _range(name, a, low)


def check_arrays(h: dict[str, Any], a: dict[str, np.ndarray]) -> None:
    """Shapes, offsets, ids and values of every array against each other and the header."""
    L, E, k = h["num_moe_layers"], h["num_experts"], h["top_k"]
    F, V, M = a["fwd_kind"].shape[0], a["ev_block"].shape[0], a["mk_block"].shape[0]
    _length("op_index", a["op_index"], a["op"].shape[0], "one per timeline op")
    _range("op", a["op"], OP_FORWARD, OP_BLOCK_END)
    counts = {OP_FORWARD: F, OP_EVENT: V, OP_BLOCK_START: M, OP_BLOCK_END: M}
    for op, n in counts.items():
        idx = a["op_index"][a["op"] == op]
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx.min() if idx.min() < 0 else idx.max())
            raise ValueError(f"trace field op_index={bad} is out of range for op {op}: must be in [0, {n - 1}] "
                             f"(its table has {n} entries)")
    for name in ("fwd_seq", "fwd_block", "fwd_iter"):
        _length(name, a[name], F, "one per forward, like fwd_kind")
    _range("fwd_kind", a["fwd_kind"], 0, len(KINDS) - 1)
    _range("fwd_seq", a["fwd_seq"], 0)
    _range("fwd_block", a["fwd_block"], -1)
    _range("fwd_iter", a["fwd_iter"], -1)
    ids, w = a["topk_ids"], a["topk_weights"]
    if ids.shape[0] != L or ids.shape[2] != k:
        raise ValueError(f"trace field 'topk_ids' has shape {list(ids.shape)}; must be [num_moe_layers={L}, rows, "
                         f"top_k={k}]")
    if w.shape != ids.shape:
        raise ValueError(f"trace field 'topk_weights' has shape {list(w.shape)}; must be {list(ids.shape)} "
                         "like topk_ids")
    _offsets("fwd_rows", a["fwd_rows"], F, ids.shape[1], "topk_ids", None)
    _range("topk_ids", ids, 0, E - 1)
    _finite("topk_weights", w, 0.0)
    if "pred_ids" in a:
        for name in ("pred_ids", "pred_weights"):
            if a[name].shape != ids.shape:
                raise ValueError(f"trace field {name!r} has shape {list(a[name].shape)}; must be {list(ids.shape)} "
                                 "like topk_ids")
        _range("pred_ids", a["pred_ids"], -1, E - 1)
        _finite("pred_weights", a["pred_weights"], 0.0)
    for name in ("ev_iter", "ev_batch"):
        _length(name, a[name], V, "one per iteration event, like ev_block")
    _range("ev_block", a["ev_block"], 0)
    _range("ev_iter", a["ev_iter"], 0)
    _range("ev_batch", a["ev_batch"], 1)
    n_ev = a["ev_masked"].shape[0]
    _offsets("ev_offsets", a["ev_offsets"], V, n_ev, "ev_masked", a["ev_batch"])
    for name in ("ev_confidence", "ev_committed", "ev_token_ids", "ev_edited"):
        if name in a:
            _length(name, a[name], n_ev, "one per event token, like ev_masked")
    conf = a["ev_confidence"]
    if np.isnan(conf).any():
        raise ValueError(f"trace field {_at('ev_confidence', conf, np.isnan(conf))} is invalid: must be a number")
    _range("ev_token_ids", a["ev_token_ids"], -1)
    _length("mk_batch", a["mk_batch"], M, "one per block marker, like mk_block")
    _range("mk_block", a["mk_block"], 0)
    _range("mk_batch", a["mk_batch"], 1)
    _offsets("mk_offsets", a["mk_offsets"], M, a["mk_token_ids"].shape[0], "mk_token_ids", a["mk_batch"])
    _range("mk_token_ids", a["mk_token_ids"], -1)
