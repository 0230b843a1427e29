"""Server metrics in the Prometheus text format, kept and rendered by ``prometheus_client``.

Each :class:`Metrics` owns its own ``CollectorRegistry`` (one per engine; tests run several), so
nothing is registered process-wide. Counters and histograms are updated from the HTTP loop
(requests) and the worker thread (tokens, timings, batches); ``prometheus_client`` makes every
update thread-safe. What is read at scrape time (queue depth, running rows, expert-cache figures
from ``model.offload_stats()``, 0 without offloading) comes from a custom collector fed by
:meth:`Metrics.render`. ``prometheus_client`` is imported when a :class:`Metrics` is made, so the
generation engine's module (which ``oled-moe chat`` loads) needs no server extra.
"""

from __future__ import annotations

import threading
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
    """``hit_rate``, ``bytes_copied``, ``cpu_expert_tokens`` (and ``layer_hit_rates`` with their
    ``layer_numbers`` when given) from ``model.offload_stats()``; None when the model is not offloaded."""
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
        config = getattr(model, "config", None)
        if config is not None:
            out["layer_numbers"] = moe_layer_numbers(config, len(layers))
    return out


OUTCOMES = ("completed", "aborted", "timed_out", "failed")
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class Metrics:
    """The server's counters in a private ``prometheus_client`` registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry = CollectorRegistry()
        self._requests = Counter("oled_requests", "HTTP requests by endpoint and status code.",
                                 ["endpoint", "status"], registry=registry)
        self._rejected = Counter("oled_requests_rejected", "Requests refused because the queue was full (429).",
                                 registry=registry)
        self._generations = Counter("oled_generations", "Generations by outcome (aborted: the client left).",
                                    ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self._generations.labels(outcome=outcome)
        self._prompt_tokens = Counter("oled_prompt_tokens", "Prompt tokens of finished generations.",
                                      registry=registry)
        self._generated_tokens = Counter("oled_generated_tokens", "Tokens generated.", registry=registry)
        self._generation_seconds = Counter("oled_generation_seconds", "Time spent generating.", registry=registry)
        self._batches = Counter("oled_batches", "generate calls (each decodes a batch of requests).",
                                registry=registry)
        self._batched_requests = Counter(
            "oled_batched_requests", "Requests decoded by those calls (over oled_batches_total: the mean batch size).",
            registry=registry)
        self._batch_size = Histogram("oled_batch_size", "Requests decoded together per generate call.",
                                     buckets=BATCH_BUCKETS, registry=registry)
        self._tpot = Histogram("oled_time_per_output_token_seconds",
                               "Generation time divided by completion tokens, per completed request.",
                               buckets=TPOT_BUCKETS, registry=registry)
        self._scrape_lock = threading.Lock()
        self._live = _live_collector()
        registry.register(self._live)

    # ---- updates (any thread) -----------------------------------------------------------------
    def count_request(self, path: str, status: int) -> None:
        endpoint = path if path in ENDPOINTS else ("/v1/models" if path.startswith("/v1/models/") else "other")
        self._requests.labels(endpoint=endpoint, status=str(int(status))).inc()

    def count_rejected(self) -> None:
        self._rejected.inc()

    def record_batch(self, size: int) -> None:
        """One ``generate`` call decoding ``size`` requests together."""
        self._batches.inc()
        self._batched_requests.inc(size)
        self._batch_size.observe(size)

    def record_generation(self, outcome: str, prompt_tokens: int, completion_tokens: int, seconds: float) -> None:
        self._generations.labels(outcome=outcome).inc()
        self._prompt_tokens.inc(prompt_tokens)
        self._generated_tokens.inc(completion_tokens)
        self._generation_seconds.inc(max(0.0, seconds))
        if outcome == "completed" and completion_tokens > 0:
            self._tpot.observe(seconds / completion_tokens)

    # ---- reading -------------------------------------------------------------------------------
    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A sample's current value (0 when it has none yet), e.g. ``value("oled_batches_total")``."""
        return self.registry.get_sample_value(name, labels or {}) or 0.0

    @property
    def batches(self) -> int:
        return int(self.value("oled_batches_total"))

    @property
    def batched_requests(self) -> int:
        return int(self.value("oled_batched_requests_total"))

    @property
    def generations(self) -> dict[str, int]:
        return {o: int(self.value("oled_generations_total", {"outcome": o})) for o in OUTCOMES}

    def render(self, queue_depth: int, running: int, offload: dict[str, Any] | None) -> str:
        """The exposition text, with the scrape-time figures given here."""
        from prometheus_client import generate_latest

        with self._scrape_lock:
            self._live.figures = (queue_depth, running, offload)
            return generate_latest(self.registry).decode()


def content_type() -> str:
    """The media type of :meth:`Metrics.render`'s text (``prometheus_client.CONTENT_TYPE_LATEST``)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return CONTENT_TYPE_LATEST


def _live_collector():
    """A collector yielding what is read at scrape time: queue depth, running rows, expert-cache figures."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class LiveFigures:
        figures: tuple = (0, 0, None)

        def collect(self):
            queue_depth, running, offload = self.figures
            figures = offload or {}
            yield GaugeMetricFamily("oled_queue_depth", "Requests waiting for the model.", value=queue_depth)
            yield GaugeMetricFamily("oled_requests_running",
                                    "Requests being decoded now (the open rows of the current batch).", value=running)
            yield GaugeMetricFamily("oled_offload_enabled", "1 when experts are offloaded.",
                                    value=int(offload is not None))
            yield GaugeMetricFamily("oled_expert_cache_hit_rate",
                                    "Expert-cache hit rate since load (0 without offloading).",
                                    value=figures.get("hit_rate", 0.0))
            yield CounterMetricFamily("oled_expert_bytes_copied", "Expert bytes copied host-to-device.",
                                      value=figures.get("bytes_copied", 0.0))
            yield CounterMetricFamily("oled_cpu_expert_tokens",
                                      "Routing entries (token x expert) computed on the CPU.",
                                      value=figures.get("cpu_expert_tokens", 0.0))
            rates = figures.get("layer_hit_rates")
            if rates:
                numbers = figures.get("layer_numbers") or list(range(1, len(rates) + 1))
                family = GaugeMetricFamily("oled_expert_cache_layer_hit_rate",
                                           "Expert-cache hit rate of each MoE layer (layer: the decoder layer, "
                                           "from 1).", labels=["layer"])
                for number, rate in zip(numbers, rates):
                    family.add_metric([str(number)], rate)
                yield family

    return LiveFigures()
