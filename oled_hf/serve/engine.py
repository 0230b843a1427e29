"""One model, one generation at a time: a worker thread fed by a bounded queue.

The HTTP layer submits :class:`GenerationRequest` objects; the worker runs them in order and
reports each through the request's ``emit`` callback (called on the worker thread):
``("start",)`` once decoding begins, ``("delta", text)`` per completed block,
then ``("done", finish_reason, usage)`` or ``("error", status, message)``. Setting
``request.cancelled`` (the client went away) skips a queued request, or aborts a running one at the
next block boundary, after every other observer has seen that block end.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..modeling.events import IterationObserver
from .metrics import Metrics
from .streaming import BlockTextStreamer, LockedTokenizer

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` waiting requests already."""


class GenerationAborted(Exception):
    """Raised inside ``generate`` to stop a request whose client has gone."""


@dataclass
class GenerationRequest:
    input_ids: torch.Tensor  # [1, prompt_len]
    max_tokens: int
    emit: Callable[[tuple], None]
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    block_length: int | None = None
    threshold: float | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)


class _AbortAtBlockEnd(IterationObserver):
    def __init__(self, cancelled: threading.Event):
        self.cancelled = cancelled

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        if self.cancelled.is_set():
            raise GenerationAborted


def default_model_path() -> str | None:
    """The trained toy checkpoint when the ``oled_hf.toy`` module provides one."""
    try:
        from .. import toy
    except ImportError:
        return None
    path = getattr(toy, "TOY_CHECKPOINT", None)
    return None if path is None else str(path)


def resolve_model_path(model: str | None) -> str:
    if model is None:
        model = default_model_path()
        if model is None:
            raise ValueError("--model is required (a checkpoint folder; `oled-moe make-tiny ./tiny` writes one)")
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"no --model given and the default toy checkpoint {model} does not exist yet; "
                             "train it or pass --model")
    elif not Path(model).exists():
        raise ValueError(f"--model {model}: no such checkpoint folder")
    return model


def load_model(path: str, device: str = "auto", cache_size: int | None = None, policy: str | None = None):
    """Load model and tokenizer once. ``offload_config`` is passed only when ``cache_size`` is given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs = {}
    if cache_size is not None:
        from ..offload.config import OffloadConfig

        kwargs["offload_config"] = OffloadConfig(cache_size=cache_size, **({"policy": policy} if policy else {}))
    elif policy is not None:
        raise ValueError("--policy needs --cache-size (the policy decides what the expert cache keeps)")
    if device != "cpu":
        kwargs["device_map"] = device
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


class Engine:
    """Owns the model and tokenizer; runs queued generations one by one on a worker thread."""

    def __init__(self, model, tokenizer, *, max_queue: int = 16, default_max_tokens: int = 256,
                 block_length: int | None = None, threshold: float | None = None, metrics: Metrics | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue={max_queue} is invalid: must be at least 1")
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens={default_max_tokens} is invalid: must be at least 1")
        self.model, self.tokenizer = model, LockedTokenizer(tokenizer)
        self.max_queue, self.default_max_tokens = max_queue, default_max_tokens
        gen = getattr(model, "generation_config", None)
        self.block_length = block_length or getattr(gen, "block_length", None) or 32
        self.threshold = threshold
        self.context_length = int(getattr(model.config, "max_position_embeddings", 4096))
        eos = getattr(gen, "eos_token_id", None)
        eos = model.config.eos_token_id if eos is None else eos
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        self.metrics = metrics or Metrics()
        self._queue: queue.Queue[GenerationRequest | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._current: GenerationRequest | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="oled-generation", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse what is queued, abort what runs (at its next block end) and end the worker."""
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            if pending is not None:
                pending.cancelled.set()
                pending.emit(("error", 503, "the server is shutting down"))
        if self._current is not None:
            self._current.cancelled.set()
        if self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout)
            self._thread.join(timeout)
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> int:
        return int(self._current is not None)

    # ---- encoding (on the caller's thread) --------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]]) -> torch.Tensor:
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        return enc["input_ids"]

    def encode_text(self, text: str) -> torch.Tensor:
        return torch.tensor([self.tokenizer(text)["input_ids"]], dtype=torch.long)

    # ---- submission ------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> None:
        """Queue a request, or raise :class:`QueueFull` at once; ``ValueError`` for parameters ``generate`` refuses."""
        self.check(request)
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self.metrics.count_rejected()
            raise QueueFull(f"the server is busy: {self.max_queue} requests are already waiting") from None

    def check(self, request: GenerationRequest) -> None:
        """Run generate's own parameter validation now, so that a bad request never waits in the queue."""
        try:
            from ..modeling.params import resolve_params
        except ImportError:  # a model-agnostic engine: generate will validate
            return
        resolve_params(self.model.config, getattr(self.model, "generation_config", None),
                       int(request.input_ids.shape[1]), self._generate_kwargs(request))

    def _generate_kwargs(self, request: GenerationRequest) -> dict:
        kwargs = dict(max_new_tokens=request.max_tokens, block_length=request.block_length or self.block_length,
                      return_dict_in_generate=True)
        threshold = request.threshold if request.threshold is not None else self.threshold
        if threshold is not None:
            kwargs["threshold"] = threshold
        if request.temperature:  # absent or 0: greedy
            kwargs.update(do_sample=True, temperature=request.temperature, top_p=request.top_p)
        else:
            kwargs["do_sample"] = False
        if request.stop:
            kwargs["stop_strings"] = list(request.stop)
        return kwargs

    # ---- the worker ------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            request = self._queue.get()
            if request is None:
                return
            if request.cancelled.is_set():
                self.metrics.record_generation("aborted", 0, 0, 0.0)
                continue
            self._current = request
            try:
                self._run(request)
            finally:
                self._current = None

    def _run(self, request: GenerationRequest) -> None:
        prompt_len = int(request.input_ids.shape[1])
        streamer = BlockTextStreamer(self.tokenizer, lambda text: request.emit(("delta", text)), request.stop,
                                     on_start=lambda: request.emit(("start",)))
        generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
        device = getattr(self.model, "device", torch.device("cpu"))
        started = time.perf_counter()
        outcome, completion = "failed", 0
        try:
            out = self.model.generate(
                input_ids=request.input_ids.to(device), attention_mask=torch.ones_like(request.input_ids).to(device),
                streamer=streamer, observers=[_AbortAtBlockEnd(request.cancelled)], generator=generator,
                tokenizer=self.tokenizer if request.stop else None, **self._generate_kwargs(request))
        except GenerationAborted:
            outcome, completion = "aborted", len(streamer.token_ids)
            request.emit(("error", 499, "the client closed the request"))
        except ValueError as err:
            request.emit(("error", 400, str(err)))
        except Exception as err:  # keep serving: one bad generation must not kill the worker
            logger.exception("generation failed")
            request.emit(("error", 500, f"generation failed: {type(err).__name__}: {err}"))
        else:
            new = out.sequences[0, prompt_len:].tolist()
            completion, outcome = len(new), "completed"
            if streamer.stop_hit or (new and new[-1] in self.eos_ids) or len(new) < request.max_tokens:
                finish = "stop"
            else:
                finish = "length"
            usage = {"prompt_tokens": prompt_len, "completion_tokens": completion,
                     "total_tokens": prompt_len + completion}
            request.emit(("done", finish, usage))
        finally:
            self.metrics.record_generation(outcome, prompt_len, completion, time.perf_counter() - started)
