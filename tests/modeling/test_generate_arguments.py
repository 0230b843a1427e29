"""generate() refuses bad arguments and bad generation configs before any forward, naming the source."""

import json
import math
import shutil

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from transformers import GenerationConfig

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])


class _Forwards:
    def __init__(self):
        self.kinds = []

    def on_forward(self, kind, block, iteration):
        self.kinds.append(kind)


class _NoEnd:
    def put(self, value):
        pass


@pytest.mark.parametrize("kwargs, message", [
    (dict(do_sample=True, temperature=math.nan), r"temperature=nan is invalid: must be 0 \(greedy\) or a finite "
                                                 r"number >= 0.01"),
    (dict(do_sample=True, temperature=1e-300), r"temperature=1e-300 is invalid"),
    (dict(temperature=math.inf), r"temperature=inf is invalid"),
    (dict(do_sample=True, top_k=math.nan), r"top_k=nan is invalid: must be None or an integer >= 0"),
    (dict(do_sample=True, top_k=2.5), r"top_k=2.5 is invalid"),
    (dict(do_sample=True, top_p="x"), r"top_p='x' is invalid"),
    (dict(pad_token_id=-1), r"pad_token_id=-1 is invalid: must be a token id from 0 to 511 \(vocab_size=512\)"),
    (dict(pad_token_id=512), r"pad_token_id=512 is invalid"),
    (dict(eos_token_id="x"), r"eos_token_id='x' is invalid"),
    (dict(streamer=_NoEnd()), r"streamer=_NoEnd has no callable end\(\): a streamer needs put\(token_ids\) and end"),
    (dict(streamer=object()), r"streamer=object has no callable put or end\(\)"),
    (dict(inputs_embeds=torch.zeros(1, 12, 128)), r"inputs_embeds is not supported by block-diffusion generate"),
    # a block longer than the context used to say "allowed max_new_tokens here: at most -12"
    (dict(block_length=5000), r"block_length=5000 does not fit the context: it is longer than "
                              r"max_position_embeddings=4096"),
])
def test_bad_arguments_raise_before_any_forward(tiny_model, kwargs, message):
    rec = _Forwards()
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(PROMPT, observers=[rec], **{"max_new_tokens": 8, "block_length": 8, **kwargs})
    assert rec.kinds == []


def test_prompt_leaving_no_room_for_a_block_says_so(tiny_model):
    with pytest.raises(ValueError, match=r"the prompt \(4000 tokens\) does not leave room for a block: .* "
                                         r"block_length=3000, needs 6000 positions but max_position_embeddings=4096"):
        tiny_model.generate(torch.ones(1, 4000, dtype=torch.long), max_new_tokens=1, block_length=3000)
    with pytest.raises(ValueError, match=r"allowed max_new_tokens here: at most 6$"):
        tiny_model.generate(torch.ones(1, 4090, dtype=torch.long), max_new_tokens=8, block_length=8)


def test_input_ids_twice_is_a_type_error(tiny_model):
    with pytest.raises(TypeError, match=r"generate\(\) got multiple values for argument 'input_ids'"):
        tiny_model.generate(PROMPT, input_ids=PROMPT, max_new_tokens=8, block_length=8)


def test_temperature_zero_and_the_floor_are_accepted(tiny_model):
    greedy = tiny_model.generate(PROMPT, max_new_tokens=8, block_length=8)
    assert torch.equal(tiny_model.generate(PROMPT, max_new_tokens=8, block_length=8, do_sample=True,
                                           temperature=0.0), greedy)
    out = tiny_model.generate(PROMPT, max_new_tokens=8, block_length=8, do_sample=True, temperature=0.01,
                              generator=torch.Generator().manual_seed(0))
    assert out.shape == greedy.shape


def _with_generation_config(tiny_path, tmp_path, **fields):
    out = tmp_path / "ckpt"
    shutil.copytree(tiny_path, out)
    path = out / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("fields, message", [
    (dict(block_length=0), r"block_length=0 \(from generation_config\) is invalid: must be a positive integer"),
    (dict(threshold=5), r"threshold=5 \(from generation_config\) is invalid: must be between 0 and 1"),
    (dict(steps=0), r"steps=0 \(from generation_config\) is invalid"),
    (dict(editing_threshold=0.5, max_post_steps=10**9),
     r"max_post_steps=1000000000 \(from generation_config\) is invalid: must be an integer from 0 to 256"),
    (dict(decoding="fast"), r"decoding='fast' \(from generation_config\) is invalid"),
    (dict(pad_token_id=-1), r"pad_token_id=-1 \(from generation_config\) is invalid"),
    # Transformers options the decoder does not implement used to be dropped silently
    (dict(no_repeat_ngram_size=3), r"no_repeat_ngram_size=3 \(from generation_config\) is not supported by block "
                                   r"diffusion"),
    (dict(num_beams=4), r"num_beams=4 \(from generation_config\) is not supported by block diffusion"),
    (dict(output_scores=True), r"output_scores=True \(from generation_config\) is not supported by block diffusion"),
    (dict(repetition_penalty=-1.0), r"repetition_penalty=-1.0 \(from generation_config\) is invalid"),
])
def test_bad_generation_config_json_is_refused_at_load(tiny_path, tmp_path, fields, message):
    folder = _with_generation_config(tiny_path, tmp_path, **fields)
    with pytest.raises(ValueError, match=r"generation_config\.json: " + message + r".*; fix or remove that field"):
        OledLLaDA2ForDiffusionLM.from_pretrained(folder)


def test_generation_config_json_with_a_preset_loads(tiny_path, tmp_path):
    # temperature 0.001 is unused by a greedy config, so it does not block loading (sampling would refuse it)
    folder = _with_generation_config(tiny_path, tmp_path, decoding="speed", num_to_transfer=2, temperature=0.001)
    model = OledLLaDA2ForDiffusionLM.from_pretrained(folder).eval()
    out = model.generate(PROMPT, max_new_tokens=8, block_length=8, return_dict_in_generate=True)
    assert int(out.edits[0]) > 0  # the speed preset edits
    with pytest.raises(ValueError, match=r"temperature=0.001 \(from generation_config\) is invalid"):
        model.generate(PROMPT, max_new_tokens=8, block_length=8, do_sample=True)


def test_bad_generation_config_set_on_the_model_is_named_at_generate(tiny_model):
    saved = tiny_model.generation_config
    tiny_model.generation_config = GenerationConfig(**{**saved.to_dict(), "block_length": 0})
    try:
        with pytest.raises(ValueError, match=r"block_length=0 \(from generation_config\) is invalid"):
            tiny_model.generate(PROMPT, max_new_tokens=8)
        with pytest.raises(ValueError, match=r"^block_length=0 is invalid"):  # an argument is named as one
            tiny_model.generate(PROMPT, max_new_tokens=8, block_length=0)
    finally:
        tiny_model.generation_config = saved


def test_generation_config_controls_apply_and_unsupported_ones_raise(tiny_model):
    """repetition_penalty / min_new_tokens in a generation_config apply as the arguments do (as in Transformers)."""
    base = tiny_model.generation_config.to_dict()
    penalised = tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8, repetition_penalty=50.0)
    config = GenerationConfig(**{**base, "repetition_penalty": 50.0})
    assert torch.equal(tiny_model.generate(PROMPT, generation_config=config, max_new_tokens=16, block_length=8),
                       penalised)
    with pytest.raises(ValueError, match=r"num_beams=4 \(from generation_config\) is not supported by block diffusion"):
        tiny_model.generate(PROMPT, generation_config=GenerationConfig(**{**base, "num_beams": 4}), max_new_tokens=8)
