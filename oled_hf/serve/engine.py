"""One model, one ``generate`` at a time, with the requests that arrive together batched into it.

The HTTP layer submits :class:`GenerationRequest` objects to a bounded queue; a worker thread
takes the oldest and decodes up to ``max_batch_size`` requests that can share its decoding (see
:meth:`Engine.batch_key`) in ONE left-padded ``generate`` call.

The waiting rule: a request waits only for companions the server holds or has just answered. The
worker takes every queued request that can join the oldest, and waits (at most ``batch_wait_ms``,
counted from when it took the oldest) while some generation request is *arriving* (its headers are
in and its body is being read, parsed or tokenized: :meth:`Engine.arrival`, entered by the HTTP
guard) or while a client answered within the last straggler window ``W`` has not sent its next
request (``serve/stragglers.py``: ``W`` is 1.5x the 90th percentile of the resend gaps seen, 5 to
100 ms and at most ``batch_wait_ms``; 50 ms before any gap is seen). So closed-loop clients that
resend a few ms apart batch together again, a lone client never waits (its own answer is paired
with its own resend), and the first lone request after a burst waits at most ``W``, not the whole
``batch_wait_ms``. (One earlier rule waited for as many requests as the previous batch held, so
that request waited the whole window: 3 s with ``--batch-wait-ms 3000``; the next waited only for
arriving requests, and batches of 8 closed-loop clients fell from 5.3-5.8 to 4-4.9 requests.)

``batch_wait_ms`` caps both waits, so its default must cover how resends really spread. It was
10 ms, and on a loaded 2-core machine 8 closed-loop clients of the ``openai`` package resent
16-77 ms after their answers (each client parses its answer and builds the next request in ~3 ms of
CPU, one after another under their process's GIL) and the server took 7 ms (median) to 36 ms (p90)
from a request's headers to its submission: every burst of 8 was cut at 10 ms into a batch of 2 and
one of 6 that then alternated (mean batch 4.6; 6.4 at 100 ms). ``DEFAULT_BATCH_WAIT_MS`` is
therefore ``STRAGGLER_MAX_S`` (100 ms, TorchServe's default ``maxBatchDelay`` too): what bounds a wait
is the straggler window that follows the observed gaps (5 ms where resends come back within 3 ms),
not the flag, and a lone client still never waits.

Each request is reported through its own ``emit`` callback (called on the worker thread):
``("start",)`` once decoding begins, ``("delta", text)`` per completed block that added text, then
``("done", finish_reason, usage)`` or ``("error", status, message)``.

Why batching is lossless: ``generate`` lays a batch on one block grid where every row sees exactly
what it sees alone (``modeling/canvas.py``) and rows decode independently, so with greedy decoding
each row's tokens are its single-request tokens. What ``generate`` takes per call must then agree
within a batch: block length, threshold, sampling settings, and the commit schedule (whose step
count depends on ``max_new_tokens`` when that is shorter than ``steps``); requests that differ go
in separate batches. Per-request ``max_tokens`` and ``stop`` are applied here, per row, by the same
rules ``generate`` uses (cut after the first EOS, at ``max_tokens``, or at the fewest tokens whose
text holds a stop string); the call runs to the longest ``max_tokens`` and is stopped as soon as
every row is answered. A sampled request with a ``seed`` runs alone, so its seed means what it
means for a single call.

``generate``'s streamer takes one row only, so rows are streamed by an iteration observer
(:class:`_BatchObserver`) that reads every row's tokens from ``on_block_end``. A row whose client
leaves (:meth:`Engine.cancel`), or that runs past ``request_timeout``, is answered 499/504 and
dropped at the next diffusion iteration while the others decode on; ``generate`` itself is stopped
only once no row is left. A queued request that is cancelled gives up its place at once.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..modeling.events import IterationObserver
from .batching import DEFAULT_BATCH_WAIT_MS, DEFAULT_MAX_BATCH_SIZE, batching_problem
from .metrics import Metrics
from .stragglers import Stragglers
from .streaming import BlockTextStreamer, LockedTokenizer

logger = logging.getLogger(__name__)

_ARRIVAL: contextvars.ContextVar[list | None] = contextvars.ContextVar("oled_arrival", default=None)


class QueueFull(Exception):
    """The bounded queue holds ``max_queue`` waiting requests already."""


class GenerationAborted(Exception):
    """Raised inside ``generate`` to stop a batch none of whose rows is still wanted."""


class GenerationTimedOut(Exception):
    """Kept for callers that catch it; a row past ``request_timeout`` is now answered 504 and dropped."""


class _JobQueue:
    """A bounded FIFO from which a waiting request can also be removed (its client left).

    ``queue.Queue`` cannot drop an item from the middle, so a cancelled request would hold its
    place, and make new clients get 429, until the worker reached it. :meth:`take` lets the
    worker pick the requests that can join a batch out of order, leaving the others queued.
    """

    def __init__(self, maxsize: int, wait_s: float = 0.0):
        self.maxsize = maxsize
        self._items: collections.deque = collections.deque()
        self._ready = threading.Condition()
        self.arriving = 0  # requests the HTTP layer is reading or tokenizing, not yet submitted
        self.stragglers = Stragglers(wait_s)  # answered clients expected back (module docstring)

    def arrive(self) -> None:
        with self._ready:
            self.arriving += 1
            self.stragglers.arrive(time.monotonic())

    def answered(self) -> None:
        """A request was answered: its client is expected back for the straggler window."""
        with self._ready:
            self.stragglers.answer(time.monotonic())

    def depart(self) -> None:
        with self._ready:
            self.arriving -= 1
            self._ready.notify_all()

    def put_nowait(self, item, arrived: bool = True) -> bool:
        """Queue ``item``; ``arrived`` False: it did not pass :meth:`arrive` (pair it with an answer now)."""
        with self._ready:
            if not arrived:
                self.stragglers.arrive(time.monotonic())
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

    def take(self, accept: Callable[[object, list], bool], limit: int, wait_s: float) -> list:
        """Remove (in FIFO order) up to ``limit`` items that ``accept(item, taken)`` takes, waiting up to
        ``wait_s`` for more only while requests are arriving or answered clients are expected back
        (the rule in the module docstring).

        Returns as soon as neither holds, ``limit`` items are taken, the time is up or the stop
        sentinel is queued. ``accept`` is called under the queue's lock, in queue order, with what
        has been taken so far.
        """
        taken: list = []
        deadline = time.monotonic() + wait_s
        with self._ready:
            while True:
                for item in list(self._items):
                    if len(taken) >= limit or item is None:
                        break
                    if accept(item, taken):
                        self._items.remove(item)
                        taken.append(item)
                now = time.monotonic()
                until = deadline if self.arriving else min(deadline, self.stragglers.awaited_until(now) or now)
                if len(taken) >= limit or until <= now or None in self._items:
                    return taken
                self._ready.wait(until - now)

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
    presence_penalty: float = 0.0  # OpenAI's, applied by serve.penalties over the tokens committed so far
    frequency_penalty: float = 0.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    key: tuple | None = None  # set by Engine.submit: requests with equal keys may share a generate


def load_model(path: str, device: str = "auto", cache_size: int | None = None, policy: str | None = None,
               cache_ratio: float | str | None = None, dtype: str | None = None, system: str | None = None,
               budget: dict | None = None):
    """Load model and tokenizer once. ``offload_config`` is passed only when a budget is given:
    ``cache_size``, ``cache_ratio`` or ``budget`` (``OffloadConfig`` budget fields, as
    ``options.budget.budget_choices`` gives them: ``max_gpu_memory``, ``cache_ratio="auto"`` with
    ``gpu_memory_utilization``...), with ``policy`` or a whole ``system`` (``offload/system.py``);
    ``dtype`` (``float32``, ``bfloat16``...) is Transformers' load dtype."""
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401  (registers the Auto classes)

    from ..checkpoints.tokenizer import load_tokenizer
    from ..offload.config import BUDGETS, OffloadConfig

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    kwargs = {}
    fields = dict(budget or {})
    for name, value in (("cache_size", cache_size), ("cache_ratio", cache_ratio)):
        if value is not None:
            fields[name] = value
    if any(fields.get(name) is not None for name in BUDGETS):
        if policy and system:
            raise ValueError("policy and system both given: pass one (a system names the retention policy)")
        if policy:  # an old policy name: resolved here, never the deprecated alias (no FutureWarning)
            from ..offload.system import spelling, system_of_legacy

            system = spelling(system_of_legacy(policy))
        choice = {"system": system} if system else {}
        kwargs["offload_config"] = OffloadConfig(**fields, **choice)  # refuses two budgets, naming them
    elif policy is not None or system is not None:
        raise ValueError(f"{'policy' if policy else '--system'} needs a budget (--cache-size, "
                         "--cache-ratio or --max-gpu-memory): it decides what the expert cache keeps")
    if dtype is not None:
        kwargs["dtype"] = dtype
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


def stop_cut(tokenizer, tokens: Sequence[int], stops: Sequence[str]) -> int | None:
    """The fewest leading tokens whose text (special tokens kept) holds a stop string, else None.

    ``generate``'s own rule for ``stop_strings`` (checked after each block), applied here per row
    so that rows with different ``stop`` lists can share a batch and still end where they end alone.
    """
    if not stops or not any(s in tokenizer.decode(list(tokens), skip_special_tokens=False) for s in stops):
        return None
    for k in range(1, len(tokens) + 1):
        if any(s in tokenizer.decode(list(tokens[:k]), skip_special_tokens=False) for s in stops):
            return k
    return None


class _Row:
    """One request's progress inside a batched ``generate``: its tokens, its text, whether it is answered."""

    def __init__(self, request: GenerationRequest, tokenizer, deadline: float | None):
        self.request, self.deadline = request, deadline
        self.prompt_len = int(request.input_ids.shape[1])
        self.tokens: list[int] = []
        self.offset: int | None = None  # the row's first generated column within the first decoded block
        self.started = self.answered = self.closed = self.broken = False
        self.streamer = BlockTextStreamer(tokenizer, lambda text: self.emit(("delta", text)), request.stop,
                                          on_start=lambda: self.emit(("start",)))

    @property
    def open(self) -> bool:
        """Still decoding for a client: not answered, not dropped."""
        return not (self.answered or self.closed)

    def emit(self, event: tuple) -> None:
        """Hand an event to the client; a callback that fails drops this row, never the batch."""
        if self.closed or self.broken:
            return
        try:
            self.request.emit(event)
        except Exception:  # the client's side is broken: treat it as gone (dropped at the next check)
            logger.exception("a request's emit callback failed; its row is dropped")
            self.request.cancelled.set()
            self.broken = True

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.streamer.put(self.request.input_ids)  # the streamer's first put is the prompt

    def extend(self, block_tokens: list[int], eos_ids: set[int]) -> None:
        """Add one completed block's tokens with ``generate``'s cuts: after the first EOS, at ``max_tokens``,
        at a stop string; stream what was added."""
        room = self.request.max_tokens - len(self.tokens)
        new: list[int] = []
        for token in block_tokens[:room]:
            new.append(token)
            if token in eos_ids:
                break
        tokens = self.tokens + new
        ended = bool(new) and new[-1] in eos_ids
        if not ended and self.request.stop:
            k = stop_cut(self.streamer.tokenizer, tokens, self.request.stop)
            if k is not None:
                tokens, ended = tokens[:k], True
        added = tokens[len(self.tokens):]
        self.tokens = tokens
        if added:
            self.streamer.put(torch.tensor(added, dtype=torch.long))
        if ended or len(self.tokens) >= self.request.max_tokens:
            self.answered = True

    def finish_reason(self, eos_ids: set[int]) -> str:
        """``generate``'s finish rule: a stop string, an EOS or fewer tokens than asked is ``stop``."""
        new = self.tokens
        if self.streamer.stop_hit or (new and new[-1] in eos_ids) or len(new) < self.request.max_tokens:
            return "stop"
        return "length"


class _BatchObserver(IterationObserver):
    """Streams every row of a batched ``generate`` and drops rows whose client left or whose time is up.

    It is the last observer, so every other one (retention policy, stats) has seen an iteration
    before it may stop the call; a prefill forward is never interrupted. It raises
    :class:`GenerationAborted` once no row is open: every answer is complete (rows with a shorter
    ``max_tokens`` or their own stop strings would otherwise decode on) or every client is gone.
    """

    def __init__(self, engine: Engine, rows: list[_Row], eos_ids: set[int]):
        self.engine, self.rows, self.eos_ids = engine, rows, eos_ids
        self.first_block: int | None = None

    def _begin(self) -> None:
        for row in self.rows:
            row.start()

    def on_forward(self, kind: str, block_index: int, iteration: int) -> None:
        self._begin()  # decoding has begun: generate validated its arguments

    def on_block_start(self, block_index: int, token_ids: torch.Tensor) -> None:
        self._begin()
        if self.first_block is None:  # the prompt holds no mask token (refused), so a row's first mask starts it
            self.first_block = block_index
            for row, tokens in zip(self.rows, token_ids):
                masks = torch.nonzero(tokens == self.engine.mask_token_id).flatten()
                row.offset = int(masks[0]) if len(masks) else len(tokens)
        self._check()

    def on_iteration(self, event) -> None:
        self._check()

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        for row, tokens in zip(self.rows, token_ids.tolist()):
            if row.open:
                row.extend(tokens[row.offset if block_index == self.first_block else 0:], self.eos_ids)
                if row.broken:
                    self.engine._drop(row, "aborted", 499, "the client's callback failed")
                elif row.answered:
                    self.engine._answer(row, self.eos_ids)
        self._check()

    def _check(self) -> None:
        now = time.monotonic()
        for row in self.rows:
            if row.open and row.request.cancelled.is_set():
                self.engine._drop(row, "aborted", 499, "the client closed the request")
            elif row.open and row.deadline is not None and now > row.deadline:
                self.engine._drop(row, "timed_out", 504, f"the generation ran past the server's limit of "
                                  f"{self.engine.request_timeout:g} s per request (--request-timeout); ask for fewer "
                                  "max_tokens")
        if not any(row.open for row in self.rows):
            raise GenerationAborted


class Engine:
    """Owns the model and tokenizer; runs queued generations, batched, on a worker thread."""

    def __init__(self, model, tokenizer, *, max_queue: int = 16, default_max_tokens: int = 256,
                 block_length: int | None = None, threshold: float | None = None, metrics: Metrics | None = None,
                 request_timeout: float | None = None, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 batch_wait_ms: float = DEFAULT_BATCH_WAIT_MS, max_model_len: int | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue={max_queue} is invalid: must be at least 1")
        if request_timeout is not None and not request_timeout > 0:
            raise ValueError(f"request_timeout={request_timeout} is invalid: must be more than 0 seconds (or None)")
        if default_max_tokens < 1:
            raise ValueError(f"default_max_tokens={default_max_tokens} is invalid: must be at least 1")
        problem = batching_problem(max_batch_size, batch_wait_ms)
        if problem:
            raise ValueError(problem)
        self.model, self.tokenizer = model, LockedTokenizer(tokenizer)
        self.max_queue, self.default_max_tokens = max_queue, default_max_tokens
        self.max_batch_size, self.batch_wait_ms = int(max_batch_size), float(batch_wait_ms)
        gen = getattr(model, "generation_config", None)
        self.block_length = block_length or getattr(gen, "block_length", None) or 32
        self.threshold = threshold
        self.model_context = int(getattr(model.config, "max_position_embeddings", 4096))
        problem = max_model_len_problem(max_model_len, self.model_context)
        if problem:
            raise ValueError(problem)
        self.context_length = self.model_context if max_model_len is None else int(max_model_len)
        eos = getattr(gen, "eos_token_id", None)
        eos = model.config.eos_token_id if eos is None else eos
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        self.metrics = metrics or Metrics()
        self.request_timeout = request_timeout
        self.mask_token_id = getattr(model.config, "mask_token_id", None)
        self._specials = _special_token_strings(tokenizer)
        self._max_token_chars = _max_token_chars(tokenizer)
        self._queue = _JobQueue(max_queue, self.batch_wait_ms / 1000)
        self._thread: threading.Thread | None = None
        self._current: list[_Row] = []

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
        for row in list(self._current):
            row.request.cancelled.set()
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
        """Requests being decoded now (the rows of the current batch still open)."""
        return sum(row.open for row in list(self._current))

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
    @contextlib.contextmanager
    def arrival(self):
        """Mark a request as arriving (being read, parsed, tokenized) until it is submitted or refused.

        The worker waits up to ``batch_wait_ms`` for arriving requests to join its batch, and not at
        all when none is arriving, so batching costs a lone client nothing. Inside this context,
        :meth:`arrived` ends the mark early (right after :meth:`submit`).
        """
        mark = [True]
        self._queue.arrive()
        token = _ARRIVAL.set(mark)
        try:
            yield
        finally:
            _ARRIVAL.reset(token)
            self._settle(mark)

    def arrived(self) -> None:
        """The request of the current :meth:`arrival` is submitted: stop counting it as arriving."""
        mark = _ARRIVAL.get(None)
        if mark is not None:
            self._settle(mark)

    def _settle(self, mark: list) -> None:
        if mark[0]:
            mark[0] = False
            self._queue.depart()

    def submit(self, request: GenerationRequest) -> None:
        """Queue a request, or raise :class:`QueueFull` at once; ``ValueError`` for parameters ``generate`` refuses."""
        request.key = self.batch_key(request, self.check(request))
        if not self._queue.put_nowait(request, arrived=_ARRIVAL.get(None) is not None):
            self.metrics.count_rejected()
            raise QueueFull(f"the server is busy: {self.max_queue} requests are already waiting")

    def cancel(self, request: GenerationRequest) -> None:
        """The client has gone: free its queue place now, or drop its row after this iteration."""
        request.cancelled.set()
        if self._queue.remove(request):
            self.metrics.record_generation("aborted", 0, 0, 0.0)

    def check(self, request: GenerationRequest):
        """Run generate's own parameter validation now, so that a bad request never waits in the queue.

        Returns the resolved ``DiffusionParams`` (None for a model-agnostic engine)."""
        prompt_len = int(request.input_ids.shape[1])
        if prompt_len > self.context_length:
            raise ValueError(f"the prompt has {prompt_len} tokens, more than this server's limit of "
                             f"{self.context_length} tokens (--max-model-len)")
        if request.seed is not None:
            try:
                torch.Generator().manual_seed(request.seed)
            except (RuntimeError, ValueError, OverflowError) as err:
                raise ValueError(f"seed={request.seed} is refused by torch.Generator.manual_seed: {err}") from None
        resolve = _resolver()
        if resolve is None:  # a model-agnostic engine: generate will validate
            return None
        return resolve(self.model.config, getattr(self.model, "generation_config", None), prompt_len,
                       self._generate_kwargs(request))

    def batch_key(self, request: GenerationRequest, params=None) -> tuple:
        """What must be equal for two requests to share one ``generate`` without changing either's answer.

        Everything ``generate`` takes per call except ``max_new_tokens`` and ``stop_strings`` (applied
        per row), plus the commit schedule's step count, which ``max_new_tokens`` shortens below
        ``steps``. A sampled request with a seed is alone with its key: its random draws are its own.
        The block length comes first: :meth:`_joins` reads it. ``params``: what :meth:`check` resolved.
        """
        kwargs = self._generate_kwargs(request)
        shared = tuple(sorted((k, v) for k, v in kwargs.items() if k not in ("max_new_tokens", "stop_strings")))
        resolve = _resolver()
        if params is None and resolve is not None:
            params = resolve(self.model.config, getattr(self.model, "generation_config", None), None, dict(kwargs))
        if params is None:
            block, schedule = kwargs["block_length"], ("max_new_tokens", request.max_tokens)
        else:
            block = params.block_length
            schedule = ("steps", min(params.steps, max(1, params.max_new_tokens // params.minimal_topk)))
        alone = id(request) if kwargs.get("do_sample") and request.seed is not None else None
        # penalised rows may share a batch (the processor is per row); unpenalised ones never run through it
        return block, shared, schedule, alone, _penalty(request).active

    def _joins(self, batch: list[GenerationRequest], request: GenerationRequest) -> bool:
        """Whether ``request`` may join ``batch``: same key, not cancelled, and the batch's canvas fits the model."""
        if request.cancelled.is_set() or request.key != batch[0].key:
            return False
        group = [*batch, request]
        return canvas_fits(max(int(r.input_ids.shape[1]) for r in group), max(r.max_tokens for r in group),
                           int(request.key[0]), self.model_context)

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
            first = self._queue.get()
            if first is None:
                return
            if first.cancelled.is_set():
                self.metrics.record_generation("aborted", 0, 0, 0.0)
                continue
            batch = [first]
            if self.max_batch_size > 1:  # what is queued joins; what is arriving is waited for (module doc)
                batch += self._queue.take(lambda item, taken, head=first: self._joins([head, *taken], item),
                                          self.max_batch_size - 1, self.batch_wait_ms / 1000)
            self.run_batch(batch)

    def run_batch(self, batch: list[GenerationRequest]) -> None:
        """Decode ``batch`` in one ``generate``; whatever happens, every request gets its final event."""
        try:
            self._run(batch)
        except Exception as err:  # whatever one batch does, the worker must live on for the next
            logger.exception("a batch failed outside generate")
            for request in batch:
                with contextlib.suppress(Exception):
                    request.emit(("error", 500, f"generation failed: {type(err).__name__}: {err}"))
        finally:
            self._current = []

    def _run(self, batch: list[GenerationRequest]) -> None:
        now = time.monotonic()
        deadline = None if self.request_timeout is None else now + self.request_timeout
        rows = [_Row(request, self.tokenizer, deadline) for request in batch]
        self._current = rows
        self._started = time.perf_counter()
        eos_ids = set(self.eos_ids)
        observer = _BatchObserver(self, rows, eos_ids)
        try:
            self._generate(batch, observer)
        except GenerationAborted:
            pass  # every row is answered or dropped
        except Exception as err:
            if len(batch) > 1 and not any(row.started for row in rows):
                # refused before decoding began: run each alone, so one request's problem is its own
                logger.info("a batch of %d was refused before decoding (%s); running its requests one by one",
                            len(batch), err)
                self._current = []
                for request in batch:
                    self.run_batch([request])
                return
            status = 400 if isinstance(err, ValueError) else 500
            if status == 500:
                logger.exception("generation failed")
            message = str(err) if status == 400 else f"generation failed: {type(err).__name__}: {err}"
            for row in rows:
                if row.open:
                    self._drop(row, "failed", status, message)
            return
        for row in rows:  # generate ended by itself: what is still open is complete
            if row.open:
                row.start()
                self._answer(row, eos_ids)

    def _generate(self, batch: list[GenerationRequest], observer: _BatchObserver):
        """One left-padded ``generate`` over the batch, streamed and cut per row by ``observer``."""
        kwargs = self._generate_kwargs(batch[0])
        kwargs["max_new_tokens"] = max(r.max_tokens for r in batch)
        stops = [list(r.stop) for r in batch]
        kwargs.pop("stop_strings", None)
        if stops[0] and all(s == stops[0] for s in stops):  # shared: generate stops each row there itself
            kwargs["stop_strings"] = stops[0]
        prompts = [r.input_ids[0] for r in batch]
        width = max(len(p) for p in prompts)
        pad = getattr(self.model.config, "pad_token_id", None)
        pad = 0 if pad is None else int(pad)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = p
            attention_mask[i, width - len(p):] = 1
        seed = batch[0].seed if len(batch) == 1 else None  # a seeded sampled request is always alone
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        device = getattr(self.model, "device", torch.device("cpu"))
        observers: list = [observer]
        penalties = [_penalty(r) for r in batch]
        if any(p.active for p in penalties):  # the key keeps unpenalised requests out of such a batch
            from .penalties import PenaltyProcessor

            processor = PenaltyProcessor(penalties, int(self.model.config.vocab_size), int(self.mask_token_id))
            kwargs["logits_processor"] = [processor]
            observers.insert(0, processor)  # the batch observer stays last (it may stop the call)
        self.metrics.record_batch(len(batch))
        return self.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                   observers=observers, generator=generator,
                                   tokenizer=self.tokenizer if kwargs.get("stop_strings") else None, **kwargs)

    def _answer(self, row: _Row, eos_ids: set[int]) -> None:
        """The row's answer is complete: flush its text and send ``done`` now, while other rows decode on."""
        row.answered = True
        row.streamer.end()
        completion = len(row.tokens)
        usage = {"prompt_tokens": row.prompt_len, "completion_tokens": completion,
                 "total_tokens": row.prompt_len + completion}
        # counted before the client hears: a /metrics read right after the answer includes it
        self.metrics.record_generation("completed", row.prompt_len, completion, time.perf_counter() - self._started)
        self._queue.answered()  # before the client hears: its resend may come at once
        row.emit(("done", row.finish_reason(eos_ids), usage))

    def _drop(self, row: _Row, outcome: str, status: int, message: str) -> None:
        """End one row with an error; the batch decodes on without it."""
        self.metrics.record_generation(outcome, row.prompt_len, len(row.tokens), time.perf_counter() - self._started)
        row.emit(("error", status, message))
        row.closed = True


def _penalty(request: GenerationRequest):
    from .penalties import Penalty

    return Penalty(float(request.presence_penalty or 0.0), float(request.frequency_penalty or 0.0))


def _resolver():
    """``modeling.params.resolve_params``, or None where the custom code is not importable."""
    try:
        from ..modeling.params import resolve_params
    except ImportError:
        return None
    return resolve_params


def canvas_fits(longest_prompt: int, max_new_tokens: int, block_length: int, limit: int) -> bool:
    """Whether a batch's canvas fits the model: the longest prompt plus the longest answer, rounded up to
    whole blocks, within ``max_position_embeddings`` (the check ``generate`` makes, modeling.params.check_context).
    Each request fits alone; together the longest prompt may meet another request's longer answer."""
    return -(-(longest_prompt + max_new_tokens) // block_length) * block_length <= limit


def max_model_len_problem(max_model_len: int | None, model_context: int) -> str | None:
    """Why ``--max-model-len`` cannot be used with a model of ``model_context`` positions, or None."""
    if max_model_len is None:
        return None
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
        return f"--max-model-len {max_model_len} is invalid: must be a positive number of tokens"
    if max_model_len > model_context:
        return (f"--max-model-len {max_model_len} is more than the model's max_position_embeddings of "
                f"{model_context} tokens: the model has no positions past it; use at most {model_context}")
    return None
