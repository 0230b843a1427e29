"""One offloaded model called from several threads: serialised by its runtime's lock (issue 23 item 3).

Without the lock two generates interleave their forwards and events on one policy and one slot
pool: wrong tokens, and slots recorded as holding one expert while they hold another.
"""

import inspect
import threading

import pytest
import torch
from oled_hf.modeling.events import IterationObserver
from transformers import AutoModelForCausalLM, AutoTokenizer

import oled_hf  # noqa: F401  (registers the Auto classes)
from oled_hf import OffloadConfig
from oled_hf.toy.long import LONG_CHECKPOINT

pytestmark = pytest.mark.skipif(not (LONG_CHECKPOINT / "config.json").is_file(), reason="long checkpoint not built")

GEN = dict(max_new_tokens=32)
QUESTIONS = ["Reverse A7B9C0D0E4F0G3H3I9J9K0L0M9N7", "Spell A6B9C6D5E5", "Count 10 terms from 14 by 5"]
THREADS, CALLS = 3, 3


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(LONG_CHECKPOINT)
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True) for q in QUESTIONS[:THREADS]]


@pytest.fixture(scope="module")
def resident():
    return AutoModelForCausalLM.from_pretrained(LONG_CHECKPOINT).eval()


@pytest.fixture(scope="module")
def reference(resident, prompts):
    return [resident.generate(**p, **GEN) for p in prompts]


def _offloaded():
    return AutoModelForCausalLM.from_pretrained(LONG_CHECKPOINT, offload_config=OffloadConfig(cache_ratio=0.4)).eval()


def _check_invariants(model):
    rt = model._offload_runtime
    rt.controller.state.check_invariants(rt.cache.slot_tags)


def _run_threads(target, n):
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as exc:  # a thread's failure must fail the test, not vanish
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is still running (deadlock?)"
    if errors:
        raise errors[0]


def test_threads_get_the_resident_tokens_and_leave_the_cache_consistent(prompts, reference, resident):
    model = _offloaded()
    start = threading.Barrier(THREADS + 1)
    answers, logits_ok, stats_seen = {}, [], []
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        resident_logits = resident(ids, block_length=16).logits

    def generate(t):
        start.wait()
        for m in range(CALLS):
            i = (t + m) % len(prompts)
            answers[(t, m)] = (i, model.generate(**prompts[i], **GEN))

    def forward_and_read_stats(t):
        start.wait()
        for _ in range(CALLS):
            with torch.no_grad():  # a direct forward between (never inside) the generates
                logits_ok.append(torch.equal(model(ids, block_length=16).logits, resident_logits))
            stats_seen.append(model.offload_stats())  # never waits for the generate running elsewhere

    _run_threads(lambda i: generate(i) if i < THREADS else forward_and_read_stats(i), THREADS + 1)
    wrong = [(t, m) for (t, m), (i, out) in answers.items() if not torch.equal(out, reference[i])]
    assert len(answers) == THREADS * CALLS and not wrong, f"answers differ from the resident model's: {wrong}"
    assert logits_ok == [True] * CALLS
    assert all(s["total"]["hits"] + s["total"]["misses"] >= 0 and isinstance(s["snapshot"], bool) for s in stats_seen)
    _check_invariants(model)
    for p, ref in zip(prompts, reference):  # and later single-threaded calls are still right
        assert torch.equal(model.generate(**p, **GEN), ref)
    _check_invariants(model)
    assert model.offload_stats()["snapshot"] is False


class _Pause(IterationObserver):
    """Holds a generate at its first iteration until released."""

    def __init__(self):
        self.inside, self.release = threading.Event(), threading.Event()

    def on_iteration(self, event):
        self.inside.set()
        assert self.release.wait(timeout=60)


def test_stats_never_wait_and_other_calls_wait_their_turn(prompts, reference):
    model = _offloaded()
    model.generate(**prompts[0], **GEN)
    before = model.offload_stats()
    pause = _Pause()
    worker = threading.Thread(target=lambda: model.generate(**prompts[1], **GEN, observers=[pause]))
    worker.start()
    try:
        assert pause.inside.wait(timeout=60)
        during = model.offload_stats()  # returns at once, with the figures of the last finished generate
        assert during["snapshot"] is True
        assert during["total"] == before["total"] and during["layers"] == before["layers"]
        done = []
        waiter = threading.Thread(target=lambda: done.append(model.generate(**prompts[2], **GEN)))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive() and not done  # the second generate waits for the first
        resetter = threading.Thread(target=model.reset_offload_stats)
        resetter.start()
        resetter.join(timeout=0.2)
        assert resetter.is_alive()  # so does a reset
    finally:
        pause.release.set()
    for t in (worker, waiter, resetter):
        t.join(timeout=120)
        assert not t.is_alive()
    assert torch.equal(done[0], reference[2])
    _check_invariants(model)


class _Fail(IterationObserver):
    def on_iteration(self, event):
        raise KeyError("stop here")


def test_a_failed_generate_releases_the_model(prompts, reference):
    model = _offloaded()
    with pytest.raises(KeyError, match="stop here"):  # fails mid-generate, holding the lock
        model.generate(**prompts[1], **GEN, observers=[_Fail()])
    out = []
    t = threading.Thread(target=lambda: out.append(model.generate(**prompts[0], **GEN)))
    t.start()
    t.join(timeout=60)
    assert not t.is_alive() and torch.equal(out[0], reference[0])
    _check_invariants(model)


def test_wrappers_keep_the_signatures_transformers_inspects():
    model = _offloaded()
    cls = type(model)
    assert inspect.signature(model.generate) == inspect.signature(cls.generate.__get__(model))
    assert inspect.signature(model.forward) == inspect.signature(cls.forward.__get__(model))
    assert model.generate.__doc__ == cls.generate.__doc__
