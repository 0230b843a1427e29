"""Checks on the synthetic generator's input: every field's type and range, and the memory a trace would take.

Why a module of its own: a parameter file (``trace synth --params``) and the CLI's size flags are user input. A
wrong type used to surface as a NumPy traceback (``top_k="8"``, ``carry={}``), a wrong value was used silently
(``hazard=-1.5``) and a huge size allocated until the machine stalled (``num_experts=1e12``, ``--sequences 1e9``).
Everything here runs before any array is allocated and raises ValueError naming the field, its value and what is
allowed (the CLI prints it as one line, exit 2). Nothing here imports the generator, so both ``synthetic`` and the
CLI can use it.

The memory estimate is an upper bound of what ``synthetic.generate`` / ``synthetic_trace`` hold at once: the
trace's routing arrays (ids, gate weights and predicted routes, top-k per token and layer; held twice while the
writer concatenates them) plus the working arrays of one forward (about eight ``[layers, rows, experts]`` float64
arrays: noise, fresh draws, logits, argpartition indices).
"""

from __future__ import annotations

import math
from typing import Any

MAX_MEMORY_GIB = 4.0  # default budget for one synthetic trace (``trace synth --max-memory``)
WORKING_ARRAYS = 8  # [layers, rows, experts] float64 arrays alive during one forward (see the module docstring)
PLAIN_MAX_ITERATIONS = 34  # the plain generator's decoder: conf = sigmoid(a + b it), a >= -2 - 6 * 1.5, b >= 0.4

# integer fields: (lowest, highest) allowed; sizes are capped so that one forward's working arrays stay small
INT_LIMITS: dict[str, tuple[int, int]] = {
    "num_layers": (1, 1024), "num_experts": (1, 65536), "block_length": (1, 4096),
    "hidden_size": (0, 1 << 20), "moe_intermediate_size": (0, 1 << 20), "popularity_seed": (0, 2 ** 63 - 1),
}
# float fields: (lowest, highest, lowest excluded)
FLOAT_LIMITS: dict[str, tuple[float, float, bool]] = {
    "threshold": (0.0, 1.0, True), "hazard": (0.0, 1.0, False), "conf_jitter": (0.0, 1.0, False),
    "sure_alpha": (0.0, 1e6, True), "sure_beta": (0.0, 1e6, True), "conf_alpha": (0.0, 1e6, True),
    "conf_beta": (0.0, 1e6, True),
}
# per-layer lists: (lowest, highest); None allowed for the optional ones; carries are correlations, [-1, 1]
LAYER_LISTS: dict[str, tuple[float, float]] = {
    "popularity_scale": (0.0, 100.0), "block_scale": (0.0, 100.0), "block_carry": (-1.0, 1.0),
    "predict_carry": (-1.0, 1.0), "mask_scale": (0.0, 100.0), "step_scale": (0.0, 100.0),
}
OPTIONAL_LISTS = ("predict_carry", "mask_scale", "step_scale")


def _name(field: str, value: Any) -> str:
    """``--flag VALUE`` for a CLI flag, ``field=VALUE`` for a parameter-file key."""
    return f"{field} {value}" if field.startswith("--") else f"{field}={value!r}"


def check_int(field: str, value: Any, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi]; bools, floats (1e9) and strings ("8") are refused, not converted."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_name(field, value)}: must be an integer, not {type(value).__name__}")
    if value < lo or (hi is not None and value > hi):
        allowed = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
        raise ValueError(f"{_name(field, value)}: allowed {allowed}")
    return int(value)


def check_float(field: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    """``value`` as a finite float in [lo, hi] (``(lo, hi]`` with ``lo_open``); NaN, inf, bools, strings refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{_name(field, value)}: must be a number, not {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v > hi or v < lo or (lo_open and v == lo):
        allowed = f"greater than {lo:g} and at most {hi:g}" if lo_open else f"from {lo:g} to {hi:g}"
        raise ValueError(f"{_name(field, value)}: allowed a finite number {allowed}")
    return v


def check_layer_list(field: str, value: Any, layers: int, lo: float, hi: float) -> list[float]:
    """A list of ``layers`` finite numbers in [lo, hi]."""
    if not isinstance(value, list):
        raise ValueError(f"{field}: must be a list of {layers} numbers (one per MoE layer), not "
                         f"{type(value).__name__}")
    if len(value) != layers:
        raise ValueError(f"{field}: {len(value)} values; allowed: exactly num_layers={layers} (one per MoE layer)")
    return [check_float(f"{field}[{i}]", v, lo, hi) for i, v in enumerate(value)]


def check_params(data: Any, required: set[str], known: set[str], labels: list[str]) -> dict[str, Any]:
    """A parameter file's content, every field checked (type, range, per-layer length); normalised copy.

    ``required``/``known``: the dataclass's fields without / with defaults; ``labels``: the token states every
    ``carry`` entry must name (``routing_stats.state_labels``)."""
    if not isinstance(data, dict):
        raise ValueError(f"not a synthetic-workload parameter file: a JSON object is needed, not "
                         f"{type(data).__name__}")
    unknown, missing = set(data) - known, required - set(data)
    if unknown:
        raise ValueError(f"not a synthetic-workload parameter file: unknown keys {sorted(unknown)}")
    if missing:
        raise ValueError(f"not a synthetic-workload parameter file: missing keys {sorted(missing)}")
    out = dict(data)
    for key, (lo, hi) in INT_LIMITS.items():
        if key in out:
            out[key] = check_int(key, out[key], lo, hi)
    if "dtype_bytes" in out:
        out["dtype_bytes"] = check_int("dtype_bytes", out["dtype_bytes"], 1, 8)
        if out["dtype_bytes"] not in (1, 2, 4, 8):
            raise ValueError(f"dtype_bytes={out['dtype_bytes']}: allowed 1, 2, 4 or 8")
    out["top_k"] = check_int("top_k", out["top_k"], 1, out["num_experts"])
    for key, (lo, hi, open_) in FLOAT_LIMITS.items():
        if key in out:
            out[key] = check_float(key, out[key], lo, hi, open_)
    layers = out["num_layers"]
    for key, (lo, hi) in LAYER_LISTS.items():
        if key in out and not (key in OPTIONAL_LISTS and out[key] is None):
            out[key] = check_layer_list(key, out[key], layers, lo, hi)
    out["carry"] = _check_carry(out["carry"], layers, labels)
    for key in ("source",):
        if key in out and not isinstance(out[key], str):
            raise ValueError(f"{_name(key, out[key])}: must be a string")
    if "assumptions" in out and not (isinstance(out["assumptions"], list)
                                     and all(isinstance(a, str) for a in out["assumptions"])):
        raise ValueError("assumptions: must be a list of strings")
    if "targets" in out and not isinstance(out["targets"], dict):
        raise ValueError(f"{_name('targets', out['targets'])}: must be an object")
    return out


def _check_carry(carry: Any, layers: int, labels: list[str]) -> dict[str, list[float]]:
    if not isinstance(carry, dict):
        raise ValueError(f"{_name('carry', carry)}: must be an object with one list per token state "
                         f"({', '.join(labels)})")
    missing, unknown = [s for s in labels if s not in carry], sorted(set(carry) - set(labels))
    if missing or unknown:
        raise ValueError(f"carry: {'missing states ' + repr(missing) if missing else ''}"
                         f"{'; ' if missing and unknown else ''}{'unknown states ' + repr(unknown) if unknown else ''}"
                         f"; allowed exactly: {', '.join(labels)}")
    return {s: check_layer_list(f"carry[{s!r}]", carry[s], layers, -1.0, 1.0) for s in labels}


# ------------------------------------------------------------------------------------------------ memory
def memory_bytes(layers: int, experts: int, top_k: int, routed_rows: int, max_rows: int, event_rows: int) -> int:
    """Upper bound of a synthetic trace's memory: routing arrays (ids of 2 or 4 bytes, fp16 weights, the same again
    for predicted routes; twice while ``TraceWriter.trace`` concatenates), iteration events (mask, confidence,
    commit, tokens: 14 bytes a position) and one forward's working arrays."""
    id_bytes = 2 if experts <= 32767 else 4
    routing = 2 * layers * routed_rows * top_k * 2 * (id_bytes + 2)
    return routing + 2 * 14 * event_rows + WORKING_ARRAYS * 8 * layers * max_rows * experts


def uniform_rows(sequences: int, blocks: int, block_length: int, batch: int, prompt_length: int,
                 iterations: int, refreshes: int) -> tuple[int, int, int]:
    """(routed rows, widest forward, event rows) of ``sequences`` x ``blocks`` blocks, each at most ``iterations``
    denoising forwards and ``refreshes`` of the blocks followed by a refresh forward (pure arithmetic: nothing is
    built, so a billion sequences cost nothing to check)."""
    rows = batch * block_length
    per_seq = batch * prompt_length + blocks * iterations * rows + refreshes * rows
    return sequences * per_seq, max(rows, batch * prompt_length), sequences * blocks * iterations * rows


def check_memory(need: int, limit_gib: float, what: str) -> None:
    """ValueError if ``need`` bytes exceed ``limit_gib``; ``what`` names the sizes that led there."""
    if need > limit_gib * 2 ** 30:
        raise ValueError(f"{what}: an estimated {need / 2 ** 30:.3g} GiB (routing arrays held twice while saving, "
                         f"plus one forward's working arrays); allowed at most {limit_gib:g} GiB (--max-memory); "
                         "lower the sizes or raise --max-memory")
