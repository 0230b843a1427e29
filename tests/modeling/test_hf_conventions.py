"""Transformers' generate conventions: logits_processor, repetition_penalty, min_new_tokens / min_length and
stopping_criteria implemented for block diffusion; output_* and other unsupported options raise; unknown
arguments raise Transformers' own error; forward warns once when used as an autoregressive scorer."""

import logging

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.generation_oled_llada2 import prefix_ids, repetition_penalty
from transformers import (
    LogitsProcessorList,
    MaxLengthCriteria,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteriaList,
)

from oled_hf import OffloadConfig
from oled_hf.toy import TOY_CHECKPOINT

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])  # 12 tokens: block 1 holds 4 of them
GEN = dict(max_new_tokens=16, block_length=8)
MODELING_LOGGER = "oled_hf.modeling.modeling_oled_llada2"


class _Forwards:
    def __init__(self):
        self.kinds = []

    def on_forward(self, kind, block, iteration):
        self.kinds.append(kind)


def _force_eos_everywhere(model, eos):
    original = model.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        out.logits[:] = -1e4
        out.logits[..., eos] = 1e4
        return out

    return forward


# ---- unknown and unsupported arguments --------------------------------------------------------
def test_a_typo_raises_transformers_error(tiny_model):
    rec = _Forwards()
    with pytest.raises(ValueError, match=r"^The following `model_kwargs` are not used by the model: "
                                         r"\['max_new_token'\] \(note: typos in the generate arguments will "
                                         r"also show up in this list\)$"):
        tiny_model.generate(PROMPT, max_new_token=8, block_length=8, observers=[rec])
    assert rec.kinds == []


def test_an_unknown_argument_set_to_none_is_skipped_as_in_transformers(tiny_model):
    assert torch.equal(tiny_model.generate(PROMPT, something=None, **GEN), tiny_model.generate(PROMPT, **GEN))


@pytest.mark.parametrize("kwargs, message", [
    (dict(output_scores=True), r"output_scores=True is not supported by block diffusion: a block's tokens are "
                               r"committed over several denoising iterations.*observers=.*\(only None or False\)"),
    (dict(output_logits=True), r"output_logits=True is not supported by block diffusion"),
    (dict(output_attentions=True), r"output_attentions=True is not supported by block diffusion"),
    (dict(output_hidden_states=True), r"output_hidden_states=True is not supported by block diffusion"),
    (dict(no_repeat_ngram_size=3), r"no_repeat_ngram_size=3 is not supported by block diffusion: generate does not "
                                   r"implement this Transformers option; leave it unset \(only None or 0\)"),
    (dict(length_penalty=0.5), r"length_penalty=0.5 is not supported by block diffusion"),
    (dict(synced_gpus=True), r"synced_gpus=True is not supported by block diffusion: generate runs on one process"),
    (dict(prefix_allowed_tokens_fn=lambda b, ids: [1]), r"prefix_allowed_tokens_fn=.* is not supported by block "
                                                        r"diffusion: pass a logits_processor instead"),
    (dict(repetition_penalty=0.0), r"repetition_penalty=0.0 is invalid: must be a finite number from 2.939e-39 to "
                                   r"3.403e\+38 \(its reciprocal must be finite in the fp32 logits"),
    (dict(repetition_penalty=1e-39), r"repetition_penalty=1e-39 is invalid: must be a finite number from 2.939e-39"),
    (dict(repetition_penalty=1e39), r"repetition_penalty=1e\+39 is invalid"),
    (dict(repetition_penalty=float("nan")), r"repetition_penalty=nan is invalid"),
    (dict(repetition_penalty="2"), r"repetition_penalty='2' is invalid"),
    (dict(min_new_tokens=-1), r"min_new_tokens=-1 is invalid: must be an integer >= 0"),
    (dict(min_new_tokens=2.5), r"min_new_tokens=2.5 is invalid"),
    (dict(min_length=-3), r"min_length=-3 is invalid: must be an integer >= 0"),
    (dict(logits_processor=RepetitionPenaltyLogitsProcessor(1.5)), r"logits_processor must be a LogitsProcessorList "
                                                                   r"or a list of callables .* got a single "
                                                                   r"RepetitionPenaltyLogitsProcessor: wrap it"),
    (dict(logits_processor=[1]), r"logits_processor\[0\] is a int, not a callable"),
    (dict(stopping_criteria="stop"), r"stopping_criteria must be a StoppingCriteriaList or a list of callables"),
])
def test_unsupported_or_bad_controls_raise_before_any_forward(tiny_model, kwargs, message):
    rec = _Forwards()
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(PROMPT, observers=[rec], **GEN, **kwargs)
    assert rec.kinds == []


def test_neutral_values_change_nothing(tiny_model):
    want = tiny_model.generate(PROMPT, **GEN)
    neutral = dict(output_scores=False, output_logits=None, output_attentions=False, output_hidden_states=False,
                   renormalize_logits=True, repetition_penalty=1.0, min_new_tokens=0, min_length=0, length_penalty=1.0,
                   no_repeat_ngram_size=0, early_stopping=False, num_beams=1, synced_gpus=False, bos_token_id=1,
                   logits_processor=LogitsProcessorList(), stopping_criteria=StoppingCriteriaList())
    assert torch.equal(tiny_model.generate(PROMPT, **GEN, **neutral), want)


# ---- logits_processor and repetition_penalty ---------------------------------------------------
def test_repetition_penalty_is_transformers_rule():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    present = torch.zeros(2, 11, dtype=torch.bool)
    present[0, [1, 4]] = True
    present[1, [4, 10]] = True
    ids = torch.tensor([[1, 4, 4], [10, 4, 10]])  # the same token sets as Transformers' input_ids
    want = torch.stack([RepetitionPenaltyLogitsProcessor(1.7)(ids, logits[:, j].clone()) for j in range(3)], 1)
    assert torch.equal(repetition_penalty(logits, present, 1.7), want)


def test_prefix_ids_are_the_canvas_before_each_position():
    tokens = torch.arange(24).view(1, 24) + 100
    ids = prefix_ids(tokens, slice(8, 16), pad_token_id=0)
    assert ids.shape == (8, 15)
    assert ids[0].tolist() == [0] * 7 + list(range(100, 108))  # position 0: the 8 tokens before the block
    assert ids[7].tolist() == list(range(100, 115))  # position 7: everything before it, no padding


class _Recorder:
    def __init__(self, ban=None):
        self.calls, self.ban = [], ban

    def __call__(self, input_ids, scores):
        self.calls.append((input_ids.clone(), scores.shape))
        if self.ban is not None:
            scores = scores.clone()
            scores[:, self.ban] = float("-inf")
        return scores


def test_logits_processor_sees_block_positions_and_the_prefix(tiny_model):
    rec = _Recorder()
    out = tiny_model.generate(PROMPT, logits_processor=[rec], **GEN)
    assert torch.equal(out, tiny_model.generate(PROMPT, **GEN))  # returning scores unchanged changes nothing
    first_ids, shape = rec.calls[0]
    assert shape == (8, 512)  # 1 row x 8 positions of block 1, the whole vocabulary
    assert first_ids.shape == (8, 8 + 7)
    mask = tiny_model.config.mask_token_id
    assert first_ids[4, -1] == PROMPT[0, 11]  # position 12 (first new token) sees the prompt's last token
    assert first_ids[5, -1] == mask  # position 13: the still-masked position 12 before it
    assert first_ids[4, -12:].tolist() == PROMPT[0].tolist()


def test_logits_processor_bans_a_token(tiny_model):
    want = tiny_model.generate(PROMPT, **GEN)[0, 12:]
    token = int(want[0])
    got = tiny_model.generate(PROMPT, logits_processor=LogitsProcessorList([_Recorder(ban=token)]), **GEN)[0, 12:]
    assert token not in got.tolist() and not torch.equal(got, want)


def test_a_processor_returning_a_wrong_shape_is_named(tiny_model):
    with pytest.raises(ValueError, match=r"logits_processor\[0\] \(function\) returned \[512\]; it must return "
                                         r"scores of the shape it was given, \[8, 512\]"):
        tiny_model.generate(PROMPT, logits_processor=[lambda ids, scores: scores[0]], **GEN)


def test_repetition_penalty_changes_greedy_output_and_one_is_off(tiny_model):
    want = tiny_model.generate(PROMPT, max_new_tokens=32, block_length=8)
    assert torch.equal(tiny_model.generate(PROMPT, max_new_tokens=32, block_length=8, repetition_penalty=1.0), want)
    got = tiny_model.generate(PROMPT, max_new_tokens=32, block_length=8, repetition_penalty=50.0)
    assert not torch.equal(got, want)
    # a very strong penalty: no new token repeats a prompt token or an earlier committed token less often
    assert len(set(got[0, 12:].tolist()) & set(PROMPT[0].tolist())) <= len(set(want[0, 12:].tolist())
                                                                          & set(PROMPT[0].tolist()))


# ---- min_new_tokens / min_length ------------------------------------------------------------------
def test_min_new_tokens_bans_eos_before_it(tiny_model, monkeypatch):
    eos = tiny_model.config.eos_token_id
    monkeypatch.setattr(tiny_model, "forward", _force_eos_everywhere(tiny_model, eos))
    assert tiny_model.generate(PROMPT, **GEN)[0, 12:].tolist() == [eos]
    new = tiny_model.generate(PROMPT, min_new_tokens=5, **GEN)[0, 12:].tolist()
    assert len(new) == 6 and new[-1] == eos and eos not in new[:5]
    # min_length counts the prompt, as in Transformers
    assert tiny_model.generate(PROMPT, min_length=12 + 3, **GEN)[0, 12:].tolist()[-1] == eos
    assert tiny_model.generate(PROMPT, min_length=12 + 3, **GEN).shape[1] == 12 + 4


# ---- stopping_criteria ----------------------------------------------------------------------------------
def test_stopping_criteria_stop_at_the_end_of_a_block(tiny_model):
    want = tiny_model.generate(PROMPT, max_new_tokens=32, block_length=8, return_dict_in_generate=True)
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=12 + 10)])
    got = tiny_model.generate(PROMPT, max_new_tokens=32, block_length=8, stopping_criteria=criteria,
                              return_dict_in_generate=True)
    # block 1 leaves 4 new tokens (16 < 22), block 2 ends with 12 (24 >= 22): stopped there, nothing after
    assert got.sequences.shape[1] == 12 + 12 and int(got.blocks[0]) == 2
    assert torch.equal(got.sequences, want.sequences[:, :24])


def test_a_stopped_row_is_cut_and_padded_the_others_decode_on(tiny_model):
    pad = tiny_model.config.pad_token_id if tiny_model.config.pad_token_id is not None else 0
    prompts = torch.tensor([[0, 0, 0] + PROMPT[0, 3:].tolist(), PROMPT[0].tolist()])
    mask = torch.tensor([[0, 0, 0] + [1] * 9, [1] * 12])
    want = tiny_model.generate(prompts, attention_mask=mask, max_new_tokens=24, block_length=8, pad_token_id=pad)
    seen = []

    def stop_row_zero(input_ids, scores):
        seen.append(input_ids.clone())
        return torch.tensor([True, False])

    out = tiny_model.generate(prompts, attention_mask=mask, max_new_tokens=24, block_length=8, pad_token_id=pad,
                              stopping_criteria=[stop_row_zero], return_dict_in_generate=True)
    got = out.sequences
    assert torch.equal(got[1], want[1])
    new_row0 = 16 - 9  # row 0 (9 prompt tokens) ends block 1 at column 16 with 7 new tokens
    assert torch.equal(got[0, 12:12 + new_row0], want[0, 12:12 + new_row0])
    assert (got[0, 12 + new_row0:] == pad).all()
    # once per completed block, left-padded: the last column is each row's newest token
    assert len(seen) == int(out.blocks[1]) >= 2
    first = seen[0]
    assert first[0, -1] == want[0, 12 + new_row0 - 1] and first[1, -1] == want[1, 12 + 4 - 1]
    assert first[0, -16:-7].tolist() == PROMPT[0, 3:].tolist()


def test_a_criterion_returning_a_wrong_shape_is_named(tiny_model):
    with pytest.raises(ValueError, match=r"stopping_criteria\[0\] \(function\) returned \[3\]; a stopping criterion "
                                         r"returns a bool or a bool tensor of shape \[1\]"):
        tiny_model.generate(PROMPT, stopping_criteria=[lambda ids, s: torch.zeros(3, dtype=torch.bool)], **GEN)


# ---- offloaded == resident on the 3-digit toy ---------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    from transformers import AutoTokenizer

    from oled_hf.toy.data import heldout_pairs, question_text

    tok = AutoTokenizer.from_pretrained(TOY_CHECKPOINT)
    tok.padding_side = "left"
    batch = tok.apply_chat_template([[{"role": "user", "content": question_text(a, b)}] for a, b in heldout_pairs(6)],
                                    add_generation_prompt=True, return_tensors="pt", return_dict=True, padding=True)
    return tok, batch, OledLLaDA2ForDiffusionLM.from_pretrained(TOY_CHECKPOINT).eval()


def test_offloaded_equals_resident_with_processors_on_the_toy(toy):
    tok, batch, resident = toy
    one = tok("1")["input_ids"][-1]
    controls = [dict(repetition_penalty=2.0), dict(logits_processor=[_Recorder(ban=one)]),
                dict(repetition_penalty=5.0, logits_processor=[_Recorder(ban=one)])]
    plain = resident.generate(**batch)
    wants = [resident.generate(**batch, **kw) for kw in controls]
    assert all(not torch.equal(want, plain) for want in wants)  # every control changes some answer
    offloaded = OledLLaDA2ForDiffusionLM.from_pretrained(
        TOY_CHECKPOINT, offload_config=OffloadConfig(cache_ratio=0.3)).eval()
    assert offloaded.is_offloaded
    for kw, want in zip(controls, wants):
        assert torch.equal(offloaded.generate(**batch, **kw), want), kw


# ---- forward used as an autoregressive scorer -------------------------------------------------------------
def _fresh(tiny_path):
    return OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()


def _warnings(caplog):
    return [r for r in caplog.records if r.name == MODELING_LOGGER and "is a masked-diffusion LM" in r.getMessage()]


def test_causal_lm_labels_warn_once(tiny_path, caplog):
    model = _fresh(tiny_path)
    caplog.set_level(logging.WARNING, logger=MODELING_LOGGER)
    with torch.no_grad():
        model(PROMPT, labels=PROMPT)
        model(PROMPT, labels=PROMPT)
    found = _warnings(caplog)
    assert len(found) == 1
    assert "labels at unmasked positions" in found[0].getMessage() and "oled_llada2" in found[0].getMessage()


def test_our_own_callers_do_not_warn(tiny_path, caplog):
    model = _fresh(tiny_path)
    caplog.set_level(logging.WARNING, logger=MODELING_LOGGER)
    mask = model.config.mask_token_id
    noised = PROMPT.clone()
    noised[0, 8:] = mask
    labels = torch.full_like(PROMPT, -100)
    labels[0, 8:] = PROMPT[0, 8:]
    with torch.no_grad():
        model(noised, labels=labels, block_length=8)  # masked-diffusion labels: only at masked inputs
        model(noised, labels=labels)
        model(PROMPT)  # a plain forward outside lm-eval
        model(PROMPT, block_length=8)
    model.generate(PROMPT, **GEN)
    assert _warnings(caplog) == []


def test_lm_eval_hf_adapter_scoring_warns_and_oled_llada2_does_not(tiny_path, caplog):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from oled_hf.evaluation.runner import make_lm

    request = [Instance("loglikelihood", {}, ("one two", " three"), 0)]
    caplog.set_level(logging.WARNING, logger=MODELING_LOGGER)
    ours = make_lm(str(tiny_path), {"mc_num": 2, "block_length": 8}, batch_size=1)
    ours.loglikelihood(request, disable_tqdm=True)
    assert _warnings(caplog) == []
    model = _fresh(tiny_path)
    hf = HFLM(pretrained=model, tokenizer=AutoTokenizer.from_pretrained(tiny_path), batch_size=1)
    hf.loglikelihood(request, disable_tqdm=True)
    hf.loglikelihood(request, disable_tqdm=True)
    found = _warnings(caplog)
    assert len(found) == 1 and "lm-eval's hf adapter" in found[0].getMessage()


@pytest.fixture(scope="module")
def toy_prompt():
    from transformers import AutoTokenizer

    model = OledLLaDA2ForDiffusionLM.from_pretrained(TOY_CHECKPOINT).eval()
    tok = AutoTokenizer.from_pretrained(TOY_CHECKPOINT)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 12+34?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    return model, ids


@pytest.mark.parametrize("penalty", [1e-38, 3e-39, 3e38])
def test_extreme_repetition_penalty_finishes_every_block(toy_prompt, penalty):
    """Issue 35.8: 1e-38 was accepted and turned the toy's positive logits of present tokens into +inf, so
    no token could be chosen and generate ended in "block 2 still has 1 masked token(s) after 8 denoising
    iterations". Accepted penalties saturate instead, and every block finishes."""
    model, ids = toy_prompt
    out = model.generate(ids, repetition_penalty=penalty, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:]
    assert new.numel() > 0 and not (new == model.config.mask_token_id).any()


def test_penalised_logits_stay_finite_and_bans_stay_bans():
    logits = torch.tensor([[[5.0, -3.0, float("-inf"), 0.5]]])
    present = torch.tensor([[True, True, True, False]])
    big = torch.finfo(torch.float32).max
    out = repetition_penalty(logits, present, 1e-38)[0, 0]  # 5 / 1e-38 overflows fp32: saturated
    assert out[0].item() == big and -1e-37 < out[1].item() < 0 and out[2].item() == float("-inf") and out[3] == 0.5
    assert repetition_penalty(logits, present, 3e38)[0, 0, 1].item() == -big
