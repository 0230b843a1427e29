"""The lm-eval adapter on the random tiny checkpoint (and on the trained toy when it is built)."""

import importlib.util
import math
from pathlib import Path

import pytest
from lm_eval.api.instance import Instance

from oled_hf.evaluation.lm_eval_adapter import OledLLaDA2LM
from oled_hf.evaluation.runner import make_lm
from oled_hf.toy import TOY_CHECKPOINT

FRAME = "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>{}<|role_end|><role>ASSISTANT</role>"
HAS_TOY = (Path(TOY_CHECKPOINT) / "config.json").is_file()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lm(tiny_path):
    return make_lm(str(tiny_path), {"mc_num": 8, "block_length": 8}, batch_size=2)


def _generate(lm, contexts, **gen_kwargs):
    reqs = [Instance("generate_until", {}, (c, dict(gen_kwargs)), i) for i, c in enumerate(contexts)]
    return lm.generate_until(reqs, disable_tqdm=True)


def _record_generate(lm, monkeypatch):
    widths = []
    original = lm.model.generate

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        widths.append(out.shape[1] - kwargs["input_ids"].shape[1])
        return out

    monkeypatch.setattr(lm.model, "generate", spy)
    return widths


CONTEXTS = ["Hello there, how are you?", "What is 2+2?"]


def test_generate_until_honours_max_gen_toks(lm, monkeypatch):
    widths = _record_generate(lm, monkeypatch)
    long = _generate(lm, CONTEXTS, until=[], max_gen_toks=24)
    short = _generate(lm, CONTEXTS, until=[], max_gen_toks=5)
    assert all(isinstance(s, str) for s in long + short)
    assert widths[0] <= 24 and widths[1] <= 5  # new tokens per generate call (the batch holds both prompts)


def test_generate_until_stops_at_until(lm, monkeypatch):
    free = _generate(lm, CONTEXTS[:1], until=[], max_gen_toks=24)[0]
    stop = free.strip()[2:4]
    assert stop and stop in free, free
    widths = _record_generate(lm, monkeypatch)
    stopped = _generate(lm, CONTEXTS[:1], until=[stop], max_gen_toks=24)[0]
    assert stopped == free.split(stop)[0]
    assert widths[0] < 24  # decoding ended with the block holding the stop string


def test_loglikelihood_is_deterministic_with_shapes(lm, tiny_path):
    prompt = FRAME.format("What is 1+2?")
    reqs = [Instance("loglikelihood", {}, (prompt, c), i) for i, c in enumerate(["3", "4711", "123456"])]
    first = lm.loglikelihood(reqs, disable_tqdm=True)
    assert len(first) == 3
    assert all(isinstance(ll, float) and math.isfinite(ll) and ll < 0 and isinstance(g, bool) for ll, g in first)
    assert lm.loglikelihood(reqs, disable_tqdm=True) == first
    again = make_lm(str(tiny_path), {"mc_num": 8, "block_length": 8}, batch_size=1)  # other packing
    assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(again.loglikelihood(reqs, disable_tqdm=True), first))
    reseeded = make_lm(str(tiny_path), {"mc_num": 8, "block_length": 8, "mc_seed": 7})
    other = reseeded.loglikelihood(reqs, disable_tqdm=True)
    assert other[0] == first[0]  # one token: always masked alone, the estimate is exact
    assert other[2][0] != first[2][0]


def test_loglikelihood_rolling_sums_windows(lm):
    reqs = [Instance("loglikelihood_rolling", {}, ("some text to score",), 0)]
    (total,) = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    assert math.isfinite(total) and total < 0


def test_offloaded_adapter_matches_resident(lm, tiny_path):
    off = make_lm(str(tiny_path), {"mc_num": 8, "block_length": 8, "cache_size": 2, "system": "lru+cpu+adaptive"},
                  batch_size=2)
    assert off.offload_stats() is not None and off.get_model_info()["offload_config"]["cache_size"] == 2
    assert _generate(off, CONTEXTS, until=[], max_gen_toks=12) == _generate(lm, CONTEXTS, until=[], max_gen_toks=12)
    reqs = [Instance("loglikelihood", {}, ("What is 1+2?", c), i) for i, c in enumerate(["3", "4"])]
    got, ref = off.loglikelihood(reqs, disable_tqdm=True), lm.loglikelihood(reqs, disable_tqdm=True)
    assert all(abs(a[0] - b[0]) < 1e-4 and a[1] == b[1] for a, b in zip(got, ref))
    assert off.offload_stats()["total"]["hits"] + off.offload_stats()["total"]["misses"] > 0


def test_bad_model_args_are_named(tiny_path):
    with pytest.raises(ValueError, match="unknown model argument.*bogus"):
        OledLLaDA2LM(pretrained=str(tiny_path), bogus=1)
    with pytest.raises(ValueError, match="need a budget"):
        OledLLaDA2LM(pretrained=str(tiny_path), system="lru+cpu+adaptive")
    # lm-eval passes the size as text
    sized = OledLLaDA2LM(pretrained=str(tiny_path), max_gpu_memory="1MiB", system="lru+cpu+adaptive")
    assert sized.get_model_info()["offload_config"]["max_gpu_memory"] == "1MiB"
    with pytest.raises(ValueError, match="mc_attention"):
        OledLLaDA2LM(pretrained=str(tiny_path), mc_attention="diagonal")


@pytest.mark.skipif(not HAS_TOY, reason="the trained toy checkpoint is not built (oled_hf/toy/checkpoint)")
def test_toy_prefers_the_true_sum():
    """The trained toy: the true sum gets the highest likelihood, is the greedy reading, and is generated."""
    from oled_hf.toy.data import choices_for, heldout_pairs

    spec = importlib.util.spec_from_file_location("toy_task_utils", ROOT / "eval/tasks/toy_addition/utils.py")
    task_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task_utils)
    toy = make_lm(str(TOY_CHECKPOINT), {"mc_num": 16}, batch_size=4)
    pairs = heldout_pairs(8)
    ranked_first = greedy = 0
    for a, b in pairs:
        options, label = choices_for(a, b)
        options = task_utils.doc_to_choice({"choices": options})  # + EOS padding, as the toy is trained
        prompt = FRAME.format(f"What is {a}+{b}?")
        scores = toy.loglikelihood([Instance("loglikelihood", {}, (prompt, o), i) for i, o in enumerate(options)],
                                   disable_tqdm=True)
        ranked_first += max(range(len(options)), key=lambda i: scores[i][0]) == label
        greedy += scores[label][1]
    answers = _generate(toy, [FRAME.format(f"What is {a}+{b}?") for a, b in pairs], until=[], max_gen_toks=8)
    correct = sum(ans == str(a + b) for ans, (a, b) in zip(answers, pairs))
    assert ranked_first >= 6 and greedy >= 6 and correct >= 6, (ranked_first, greedy, correct, answers)
