"""One model, one generation at a time: a worker thread fed by a bounded queue.

The HTTP layer submits :class:`GenerationRequest` objects; the worker runs them in order and
reports each through the request's ``emit`` callback (called on the worker thread):
``("start",)`` once decoding begins, ``("delta", text)`` per completed block,
then ``("done", finish_reason, usage)`` or ``("error", status, message)``. :meth:`Engine.cancel`
(the client went away) takes a queued request out of the queue at once (its place is free for the
next client), or aborts a running one after the current diffusion iteration, once every other
observer has seen that iteration. A running request that passes ``request_timeout`` seconds of
generation is aborted the same way and answered 504.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..modeling.events import IterationObserver
from .metrics import Metrics
from .streaming import BlockTextStreamer, LockedTokenizer

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` waiting requests already."""


class GenerationAborted(Exception):
    """Raised inside ``generate`` to stop a request whose client has gone."""


class GenerationTimedOut(Exception):
    """Raised inside ``generate`` when a request has run longer than the engine's ``request_timeout``."""


class _JobQueue:
    """A bounded FIFO from which a waiting request can also be removed (its client left).

    ``queue.Queue`` cannot drop an item from the middle, so a cancelled request would hold its
    place, and make new clients get 429, until the worker reached it.
    """

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()

    def put_nowait(self, item) -> bool:
        with self._ready:
            if len(self._items) >= self.maxsize:
                return False
            self._items.append(item)
            self._ready.notify()
            return True

    def put_sentinel(self) -> None:
        """Wake the worker to stop (beyond ``maxsize``: stopping must never wait for room)."""
        with self._ready:
            self._items.append(None)
            self._ready.notify()

    def get(self):
        with self._ready:
            while not self._items:
                self._ready.wait()
            return self._items.popleft()

    def remove(self, item) -> bool:
        with self._ready:
            try:
                self._items.remove(item)
            except ValueError:
                return False
            return True

    def drain(self) -> list:
        with self._ready:
            items, self._items = list(self._items), collections.deque()
            return items

    def qsize(self) -> int:
        with self._ready:
            return sum(item is not None for item in self._items)


@dataclass(eq=False)  # compared by identity: the queue removes this very request
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


class _Abort(IterationObserver):
    """Stops ``generate`` between diffusion iterations: the client left, or the time limit passed.

    It is the last observer, so every other one (retention policy, stats) has seen the iteration
    it stops after; a prefill forward is never interrupted.
    """

    def __init__(self, cancelled: threading.Event, deadline: float | None):
        self.cancelled, self.deadline = cancelled, deadline

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise GenerationAborted
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GenerationTimedOut

    def on_iteration(self, event) -> None:
        self._check()

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        self._check()


def load_model(path: str, device: str = "auto", cache_size: int | None = None, policy: str | None = None):
    """Load model and tokenizer once. ``offload_config`` is passed only when ``cache_size`` is given."""
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401  (registers the Auto classes)

    from ..checkpoints.tokenizer import load_tokenizer

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
    tokenizer = load_tokenizer(path)
    return model, tokenizer


NORMALIZER_SLACK = 4  # how many characters a tokenizer's normalizer might fold into one, at most


def _special_token_strings(tokenizer) -> list[str]:
    """The strings the tokenizer turns into special tokens (``<|mask|>``, ``<role>``...), longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {token.content for token in decoder.values() if getattr(token, "special", False)}
    found.update(getattr(tokenizer, "all_special_tokens", None) or [])
    return sorted((t for t in found if t), key=len, reverse=True)


def _max_token_chars(tokenizer) -> int:
    """The longest token's length in characters (a byte-level token's form has one character per byte)."""
    try:
        return max(1, max(len(token) for token in tokenizer.get_vocab()))
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        return 1 << 20  # unknown: the bound never refuses anything


class Engine:
    """Owns the model and tokenizer; runs queued generations one by one on a worker thread."""

    def __init__(self, model, tokenizer, *, max_queue: int = 16, default_max_tokens: int = 256,
                 block_length: int | None = None, threshold: float | None = None, metrics: Metrics | None = None,
                 request_timeout: float | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue={max_queue} is invalid: must be at least 1")
        if request_timeout is not None and not request_timeout > 0:
            raise ValueError(f"request_timeout={request_timeout} is invalid: must be more than 0 seconds (or None)")
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
        self.request_timeout = request_timeout
        self.mask_token_id = getattr(model.config, "mask_token_id", None)
        self._specials = _special_token_strings(tokenizer)
        self._max_token_chars = _max_token_chars(tokenizer)
        self._queue = _JobQueue(max_queue)
        self._thread: threading.Thread | None = None
        self._current: GenerationRequest | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="oled-generation", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse what is queued, abort what runs (after its current iteration) and end the worker."""
        for pending in self._queue.drain():
            if pending is not None:
                pending.cancelled.set()
                pending.emit(("error", 503, "the server is shutting down"))
        if self._current is not None:
            self._current.cancelled.set()
        if self._thread is not None and self._thread.is_alive():
            self._queue.put_sentinel()
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
    def min_tokens(self, chars: int) -> int:
        """A lower bound on the tokens a text of ``chars`` characters encodes to, found without tokenizing it.

        No token spans more than ``max_token_chars`` characters, and normalizers (NFC and the like)
        shrink text by a small factor at most, so a prompt far past the context can be refused
        before a tokenizer spends seconds (and the lock the worker also needs) on it.
        """
        return chars // (self._max_token_chars * NORMALIZER_SLACK)

    def encode_chat(self, messages: list[dict[str, str]]) -> torch.Tensor:
        """The chat template's tokens, with every message's content encoded as plain text.

        A client's ``<|mask|>`` or ``<role>`` must stay text, as HF chat templates and vLLM keep user
        content: otherwise a user could forge turns or plant mask tokens in the prompt. Content
        without special-token strings (almost all of it) takes the ordinary path unchanged.
        """
        if not any(special in m["content"] for m in messages for special in self._specials):
            return self._template(messages, tokenize=True)["input_ids"]
        marks = [f"\x00oled-content-{uuid.uuid4().hex}\x00" for _ in messages]
        rendered = self._template([{**m, "content": mark} for m, mark in zip(messages, marks)], tokenize=False)
        ids: list[int] = []
        for message, mark in zip(messages, marks):
            head, found, rendered = rendered.partition(mark)
            if not found or mark in rendered:
                raise ValueError("this chat template copies or changes message content, so text that looks like the "
                                 "model's control tokens cannot be kept as text; remove it from the messages")
            ids += self._ids(head) + self._ids(message["content"], as_text=True)
        return torch.tensor([ids + self._ids(rendered)], dtype=torch.long)

    def encode_text(self, text: str) -> torch.Tensor:
        return torch.tensor([self.tokenizer(text)["input_ids"]], dtype=torch.long)

    def _template(self, messages: list[dict[str, str]], tokenize: bool):
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize,
                                                  return_tensors="pt" if tokenize else None, return_dict=tokenize)

    def _ids(self, text: str, as_text: bool = False) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=as_text)["input_ids"])

    # ---- submission ------------------------------------------------------------------------
    def submit(self, request: GenerationRequest) -> None:
        """Queue a request, or raise :class:`QueueFull` at once; ``ValueError`` for parameters ``generate`` refuses."""
        self.check(request)
        if not self._queue.put_nowait(request):
            self.metrics.count_rejected()
            raise QueueFull(f"the server is busy: {self.max_queue} requests are already waiting")

    def cancel(self, request: GenerationRequest) -> None:
        """The client has gone: free its queue place now, or stop its generation after this iteration."""
        request.cancelled.set()
        if self._queue.remove(request):
            self.metrics.record_generation("aborted", 0, 0, 0.0)

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
            except Exception as err:  # whatever one request does, the worker must live on for the next
                logger.exception("request failed outside generate")
                with contextlib.suppress(Exception):
                    request.emit(("error", 500, f"generation failed: {type(err).__name__}: {err}"))
            finally:
                self._current = None

    def _run(self, request: GenerationRequest) -> None:
        prompt_len = int(request.input_ids.shape[1])
        streamer = BlockTextStreamer(self.tokenizer, lambda text: request.emit(("delta", text)), request.stop,
                                     on_start=lambda: request.emit(("start",)))
        device = getattr(self.model, "device", torch.device("cpu"))
        started = time.perf_counter()
        outcome, completion = "failed", 0
        deadline = None if self.request_timeout is None else time.monotonic() + self.request_timeout
        try:
            generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
            out = self.model.generate(
                input_ids=request.input_ids.to(device), attention_mask=torch.ones_like(request.input_ids).to(device),
                streamer=streamer, observers=[_Abort(request.cancelled, deadline)], generator=generator,
                tokenizer=self.tokenizer if request.stop else None, **self._generate_kwargs(request))
        except GenerationAborted:
            outcome, completion = "aborted", len(streamer.token_ids)
            request.emit(("error", 499, "the client closed the request"))
        except GenerationTimedOut:
            outcome, completion = "timed_out", len(streamer.token_ids)
            request.emit(("error", 504, f"the generation ran past the server's limit of {self.request_timeout:g} s "
                                        "per request (--request-timeout); ask for fewer max_tokens"))
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
