"""Checkpoints carry their own model code: they run with only torch and transformers installed.

The subprocess blocks ``import oled_hf`` before anything else and loads a copy of the checkpoint
from a folder outside the repository, so nothing can reach the installed package's source.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from oled_hf.modeling.auto_map import CODE_FILES
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.dynamic_module_utils import get_class_from_dynamic_module

import oled_hf
from oled_hf.toy import TOY_CHECKPOINT

REPO = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "123+456="}]

STANDALONE = r"""
import json, sys
sys.modules["oled_hf"] = None  # `import oled_hf` now raises ImportError
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

torch.set_num_threads(1)  # as the test process: same kernels, same rounding
path, messages = sys.argv[1], json.loads(sys.argv[2])
try:
    import oled_hf  # noqa: F401
    raise SystemExit("oled_hf is importable in the standalone process")
except ImportError:
    pass
model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    logits = model(ids).logits
gen = model.generate(ids, max_new_tokens=16, block_length=8)
pipe = pipeline("text-generation", model=path, trust_remote_code=True)
text = pipe(messages, max_new_tokens=16, block_length=8)[0]["generated_text"][-1]["content"]
leaked = sorted(name for name in sys.modules if name.startswith("oled_hf") and sys.modules[name] is not None)
print(json.dumps({"module": type(model).__module__, "logits": logits[0, -1].tolist(), "tokens": gen[0].tolist(),
                  "text": text, "leaked": leaked}))
"""


def _standalone(path: Path, tmp_path: Path) -> dict:
    copy = shutil.copytree(path, tmp_path / "checkpoint", symlinks=False)
    assert REPO not in copy.resolve().parents
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    out = subprocess.run([sys.executable, "-c", STANDALONE, str(copy), json.dumps(PROMPT)], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _installed(path: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        logits = model(ids["input_ids"]).logits
    gen = model.generate(ids["input_ids"], max_new_tokens=16, block_length=8)
    return {"logits": logits[0, -1].tolist(), "tokens": gen[0].tolist(),
            "text": tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)}


@pytest.mark.parametrize("which", ["make-tiny", "trained-toy"])
def test_checkpoint_runs_without_oled_hf(which, tiny_path, tmp_path):
    path = tiny_path if which == "make-tiny" else Path(TOY_CHECKPOINT)
    for name in CODE_FILES:  # the real code, verbatim: not shims that import the package
        assert (path / name).read_bytes() == (REPO / "modeling" / name).read_bytes(), name
    alone, here = _standalone(path, tmp_path), _installed(path)
    assert alone["module"].startswith("transformers_modules.")
    assert alone["leaked"] == []
    assert alone["logits"] == here["logits"]  # bit-identical
    assert alone["tokens"] == here["tokens"]
    assert alone["text"] == here["text"]


def test_checkpoint_code_offloads(tiny_path):
    """The checkpoint's own code (not the package's) takes an offload_config and stays lossless.

    With ``oled_hf`` imported, transformers 5 prefers the registered package classes over a
    checkpoint's ``auto_map`` even under ``trust_remote_code=True`` ("explicit local code"), so
    the checkpoint's class is fetched from its folder the way ``AutoModel`` fetches remote code.
    """
    remote = get_class_from_dynamic_module("modeling_oled_llada2.OledLLaDA2ForDiffusionLM", str(tiny_path))
    assert remote.__module__.startswith("transformers_modules.") and remote is not oled_hf.OledLLaDA2ForDiffusionLM
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    resident = remote.from_pretrained(tiny_path).eval()
    config = oled_hf.OffloadConfig(cache_size=4, system="lru+cpu+adaptive")
    offloaded = remote.from_pretrained(tiny_path, offload_config=config)
    assert type(offloaded) is remote and offloaded.is_offloaded
    want = resident.generate(ids, max_new_tokens=16, block_length=8)
    assert torch.equal(offloaded.eval().generate(ids, max_new_tokens=16, block_length=8), want)
    assert offloaded.offload_stats()["total"]["misses"] > 0


def test_save_writes_code_and_version(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["oled_hf_version"] == oled_hf.__version__
    for name in CODE_FILES:
        assert (tmp_path / "saved" / name).read_bytes() == (REPO / "modeling" / name).read_bytes()


def test_version_mismatch_warns_once(tiny_path, tmp_path, caplog):
    copy = shutil.copytree(tiny_path, tmp_path / "old")
    config = json.loads((copy / "config.json").read_text())
    config["oled_hf_version"] = "0.0.1"
    (copy / "config.json").write_text(json.dumps(config))
    logger = logging.getLogger("transformers")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING):
            AutoModelForCausalLM.from_pretrained(copy)
    finally:
        logger.removeHandler(caplog.handler)
    notes = [r.getMessage() for r in caplog.records if "written by oled-hf 0.0.1" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in caplog.records]
    assert f"oled-hf {oled_hf.__version__} is installed" in notes[0]
