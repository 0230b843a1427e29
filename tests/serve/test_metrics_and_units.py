"""/metrics, /health, the block text streamer, offload figures and stopping the engine."""

from __future__ import annotations

import torch

from oled_hf.serve.metrics import Metrics, offload_figures
from oled_hf.serve.streaming import BlockTextStreamer


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_are_prometheus_client_text():
    """Rendered by prometheus_client from a private registry: parseable, with HELP/TYPE, per instance."""
    from prometheus_client.parser import text_string_to_metric_families

    a, b = Metrics(), Metrics()
    a.record_batch(3)
    a.record_generation("completed", 10, 4, 0.2)
    families = {f.name: f for f in text_string_to_metric_families(a.render(2, 3, None))}
    assert families["oled_batches"].type == "counter" and families["oled_batch_size"].type == "histogram"
    assert families["oled_queue_depth"].samples[0].value == 2
    assert families["oled_requests_running"].samples[0].value == 3
    assert (a.batches, a.batched_requests, a.generations["completed"]) == (1, 3, 1)
    assert (b.batches, b.generations["completed"]) == (0, 0)  # no shared global registry


def test_metrics_count_requests_and_tokens(http):
    body = {"messages": [{"role": "user", "content": "count me"}], "max_tokens": 8, "block_length": 8}
    before = _samples(http.get("/metrics").text)
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert http.post("/v1/chat/completions", json={**body, "max_tokens": 0}).status_code == 400
    response = http.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    after = _samples(response.text)

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew('oled_requests_total{endpoint="/v1/chat/completions",status="200"}') == 1
    assert grew('oled_requests_total{endpoint="/v1/chat/completions",status="400"}') == 1
    assert grew("oled_generated_tokens_total") == 8
    assert grew("oled_time_per_output_token_seconds_count") == 1
    assert after['oled_time_per_output_token_seconds_bucket{le="+Inf"}'] == after[
        "oled_time_per_output_token_seconds_count"]
    assert after["oled_queue_depth"] == 0 and after["oled_offload_enabled"] == 0
    for name in ("oled_expert_cache_hit_rate", "oled_expert_bytes_copied_total", "oled_cpu_expert_tokens_total"):
        assert after[name] == 0
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny"


def test_offload_figures_from_stats_objects():
    class Off:
        pass

    class Dict:
        def offload_stats(self):
            return {"hit_rate": 0.75, "bytes_copied": [10, 20], "cpu_expert_tokens": 3, "per_layer": {}}

    class Stats:
        def offload_stats(self):
            from oled_hf.offload.stats import CacheStats

            s = CacheStats(num_layers=2)
            s.hits, s.misses, s.bytes_copied, s.cpu_expert_tokens = [3, 1], [1, 3], [5, 7], [2, 2]
            return s

    assert offload_figures(Off()) is None
    assert offload_figures(Dict()) == {"hit_rate": 0.75, "bytes_copied": 30.0, "cpu_expert_tokens": 3.0}
    assert offload_figures(Stats()) == {"hit_rate": 0.5, "bytes_copied": 12.0, "cpu_expert_tokens": 4.0}
    text = Metrics().render(0, 0, offload_figures(Stats()))
    assert "oled_offload_enabled 1" in text and "oled_expert_bytes_copied_total 12" in text


class _Chars:
    """A tokenizer whose tokens are byte values (multi-byte characters span tokens)."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def _run(blocks: list[bytes], stop=()) -> tuple[list[str], BlockTextStreamer]:
    pieces: list[str] = []
    s = BlockTextStreamer(_Chars(), pieces.append, stop)
    s.put(torch.tensor([1, 2, 3]))  # the prompt
    for block in blocks:
        s.put(torch.tensor(list(block)))
    s.end()
    return pieces, s


def test_streamer_holds_split_characters_back():
    pieces, s = _run([b"ab\xc3", b"\xa9cd"])  # "é" split across two blocks
    assert pieces == ["ab", "\u00e9cd"] and s.text == "ab\u00e9cd"
    pieces, _ = _run([b"ab\xff"])  # a byte that never completes is flushed at the end
    assert "".join(pieces) == "ab\ufffd"


def test_streamer_stop_sequences():
    pieces, s = _run([b"hello EN", b"D more", b"text"], stop=["END"])
    assert pieces == ["hello ", "", ""] and s.stop_hit and s.text == "hello "
    pieces, s = _run([b"hello E", b"ven more"], stop=["END"])  # a held-back prefix that was no stop
    assert "".join(pieces) == "hello Even more" and not s.stop_hit


def test_engine_stop_refuses_queued_requests(engine):
    from oled_hf.serve.engine import Engine, GenerationRequest, QueueFull

    idle = Engine(engine.model, engine.tokenizer, max_queue=2, block_length=8)  # worker never started
    events: list = []
    jobs = [GenerationRequest(input_ids=torch.tensor([[5, 6, 7]]), max_tokens=8, emit=events.append)
            for _ in range(2)]
    for job in jobs:
        idle.submit(job)
    try:
        idle.submit(GenerationRequest(input_ids=torch.tensor([[5, 6, 7]]), max_tokens=8, emit=events.append))
        raise AssertionError("a third request should not fit")
    except QueueFull:
        pass
    idle.stop()
    assert events == [("error", 503, "the server is shutting down")] * 2
    assert all(job.cancelled.is_set() for job in jobs) and idle.queue_depth == 0


def test_offloaded_engine_reports_cache_figures(tiny_path, engine):
    import threading

    from oled_hf.serve.engine import Engine, GenerationRequest, load_model

    model, tokenizer = load_model(str(tiny_path), device="cpu", cache_size=4, policy="lru")
    offloaded = Engine(model, tokenizer, max_queue=2, block_length=8)
    offloaded.start()
    try:
        ids = offloaded.encode_chat([{"role": "user", "content": "hello"}])
        results: dict[str, list] = {}
        for name, eng in (("offloaded", offloaded), ("resident", engine)):
            events, done = [], threading.Event()

            def emit(event, events=events, done=done):
                events.append(event)
                if event[0] in ("done", "error"):
                    done.set()

            eng.submit(GenerationRequest(input_ids=ids, max_tokens=16, emit=emit))
            assert done.wait(60)
            results[name] = events
        assert results["offloaded"] == results["resident"]  # lossless, block by block
        figures = offload_figures(model)
        assert 0 < figures["hit_rate"] <= 1 and figures["bytes_copied"] > 0 and figures["cpu_expert_tokens"] >= 0
        samples = _samples(offloaded.metrics.render(0, 0, figures))
        assert samples["oled_offload_enabled"] == 1 and samples["oled_expert_cache_hit_rate"] == figures["hit_rate"]
        # MoE layers are labelled by decoder layer from 1 (the tiny model's layer 1 is dense): 2, 3, 4
        assert figures["layer_numbers"] == [2, 3, 4]
        assert samples['oled_expert_cache_layer_hit_rate{layer="2"}'] == figures["layer_hit_rates"][0]
        assert 'oled_expert_cache_layer_hit_rate{layer="0"}' not in samples
    finally:
        offloaded.stop()
