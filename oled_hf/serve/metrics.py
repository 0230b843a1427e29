"""Server metrics in the Prometheus text exposition format (no client library needed).

Counters are updated from the HTTP loop (requests) and the worker thread (tokens, timings), so
every update takes one lock. Expert-cache figures are read from ``model.offload_stats()`` at
scrape time when the model is offloaded, and are 0 otherwise.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")


def moe_layer_numbers(config, count: int | None = None) -> list[int]:
    """The decoder-layer number (1-based, as in ``model.layers[n - 1]``) of each MoE layer, in order.

    The offload runtime counts MoE layers from 0; the first ``first_k_dense_replace`` decoder layers
    are dense, so the toy's three MoE layers are decoder layers 2, 3 and 4. Every per-layer figure
    a user reads (``/stats layers``, ``/metrics``) names layers this way, so the numbers agree.
    """
    dense = int(getattr(config, "first_k_dense_replace", 0) or 0)
    if count is None:
        count = int(getattr(config, "num_hidden_layers", dense)) - dense
    return [dense + i + 1 for i in range(count)]


def offload_figures(model) -> dict[str, Any] | None:
    """``hit_rate``, ``bytes_copied``, ``cpu_expert_tokens`` (and ``layer_hit_rates`` when given) from
    ``model.offload_stats()``; None when the model is not offloaded."""
    getter = getattr(model, "offload_stats", None)
    if getter is None:
        return None
    stats = getter()
    if stats is None:
        return None
    if not isinstance(stats, dict):
        stats = stats.to_dict() if hasattr(stats, "to_dict") else vars(stats)
    if isinstance(stats.get("total"), dict):  # the runtime's layout: {"total": {...}, "layers": [{...}, ...]}
        stats = {**stats, **stats["total"]}

    def number(value) -> float:
        if isinstance(value, (list, tuple)):
            value = sum(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            return 0.0

    out = {name: number(stats.get(name, 0)) for name in ("hit_rate", "bytes_copied", "cpu_expert_tokens")}
    layers = stats.get("layers")
    if isinstance(layers, list) and all(isinstance(row, dict) for row in layers):
        out["layer_hit_rates"] = [number(row.get("hit_rate", 0)) for row in layers]
    return out


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generations = {"completed": 0, "aborted": 0, "timed_out": 0, "failed": 0}
        self.rejected = 0
        self._tpot_counts = [0] * (len(TPOT_BUCKETS) + 1)
        self._tpot_sum = 0.0
        self._generation_seconds = 0.0
        self.batches = 0
        self.batched_requests = 0

    def count_request(self, path: str, status: int) -> None:
        endpoint = path if path in ENDPOINTS else ("/v1/models" if path.startswith("/v1/models/") else "other")
        with self._lock:
            self.requests[(endpoint, int(status))] += 1

    def count_rejected(self) -> None:
        with self._lock:
            self.rejected += 1

    def record_batch(self, size: int) -> None:
        """One ``generate`` call decoding ``size`` requests together."""
        with self._lock:
            self.batches += 1
            self.batched_requests += size

    def record_generation(self, outcome: str, prompt_tokens: int, completion_tokens: int, seconds: float) -> None:
        with self._lock:
            self.generations[outcome] += 1
            self.prompt_tokens += prompt_tokens
            self.generated_tokens += completion_tokens
            self._generation_seconds += seconds
            if outcome == "completed" and completion_tokens > 0:
                tpot = seconds / completion_tokens
                self._tpot_sum += tpot
                slot = next((i for i, b in enumerate(TPOT_BUCKETS) if tpot <= b), len(TPOT_BUCKETS))
                self._tpot_counts[slot] += 1

    def render(self, queue_depth: int, running: int, offload: dict[str, Any] | None) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {_fmt(value)}" for labels, value in samples)

        with self._lock:
            requests = sorted(self.requests.items())
            metric("oled_requests_total", "counter", "HTTP requests by endpoint and status code.",
                   [(f'{{endpoint="{e}",status="{s}"}}', n) for (e, s), n in requests])
            metric("oled_requests_rejected_total", "counter", "Requests refused because the queue was full (429).",
                   [("", self.rejected)])
            metric("oled_generations_total", "counter", "Generations by outcome (aborted: the client left).",
                   [(f'{{outcome="{k}"}}', v) for k, v in self.generations.items()])
            metric("oled_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                   [("", self.prompt_tokens)])
            metric("oled_generated_tokens_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
            metric("oled_generation_seconds_total", "counter", "Time spent generating.",
                   [("", self._generation_seconds)])
            metric("oled_batches_total", "counter", "generate calls (each decodes a batch of requests).",
                   [("", self.batches)])
            metric("oled_batched_requests_total", "counter",
                   "Requests decoded by those calls (over oled_batches_total: the mean batch size).",
                   [("", self.batched_requests)])
            cumulative, samples = 0, []
            for bound, count in zip((*TPOT_BUCKETS, "+Inf"), self._tpot_counts):
                cumulative += count
                samples.append((f'_bucket{{le="{bound}"}}', cumulative))
            samples += [("_sum", self._tpot_sum), ("_count", cumulative)]
            metric("oled_time_per_output_token_seconds", "histogram",
                   "Generation time divided by completion tokens, per completed request.", samples)
        metric("oled_queue_depth", "gauge", "Requests waiting for the model.", [("", queue_depth)])
        metric("oled_requests_running", "gauge", "Requests being decoded now (the open rows of the current batch).",
               [("", running)])
        figures = offload or {}
        metric("oled_offload_enabled", "gauge", "1 when experts are offloaded.", [("", int(offload is not None))])
        metric("oled_expert_cache_hit_rate", "gauge", "Expert-cache hit rate since load (0 without offloading).",
               [("", figures.get("hit_rate", 0.0))])
        metric("oled_expert_bytes_copied_total", "counter", "Expert bytes copied host-to-device.",
               [("", figures.get("bytes_copied", 0.0))])
        metric("oled_cpu_expert_tokens_total", "counter", "Routing entries (token x expert) computed on the CPU.",
               [("", figures.get("cpu_expert_tokens", 0.0))])
        if figures.get("layer_hit_rates"):
            metric("oled_expert_cache_layer_hit_rate", "gauge", "Expert-cache hit rate of each MoE layer.",
                   [(f'{{layer="{i}"}}', rate) for i, rate in enumerate(figures["layer_hit_rates"])])
        return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
