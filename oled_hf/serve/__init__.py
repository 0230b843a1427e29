"""OpenAI-compatible HTTP serving of one diffusion model: ``oled-moe serve``.

``engine`` (model, tokenizer, worker thread, bounded queue), ``protocol`` (request validation),
``app`` (the FastAPI routes, ``create_app``), ``guard`` (Host and content-type checks, body, time
and connection limits, API-key rules), ``metrics`` (Prometheus text) and ``streaming``
(block-by-block text, shared with ``oled-moe chat``). Only ``app`` needs FastAPI.
"""
