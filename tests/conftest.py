"""Shared fixtures: offline, deterministic, one tiny checkpoint per session."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
# trust_remote_code copies checkpoint code into a module cache: keep it out of the home folder.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="oled-hf-modules-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny shapes gain nothing from threads, and OpenMP spin-waits collapse when cores are shared.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _library_bar_switches(monkeypatch):
    """``quiet_library_bars`` sets these for the libraries a command imports later (a real command ends there);
    in this one process, one test's must not reach the next, nor the subprocesses a later test starts."""
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from oled_hf.checkpoints.factory import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    return OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture
def copy_checkpoint(tiny_path, tmp_path):
    """A fresh copy of the tiny checkpoint with tensors replaced (a tensor), dropped (None) or kept.

    ``copy_checkpoint({"lm_head.weight": None})`` returns the folder; tensors stay in their shards.
    """
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    def make(edits: dict | None = None, name: str = "ckpt"):
        out = tmp_path / name
        shutil.copytree(tiny_path, out)
        index = json.loads((out / "model.safetensors.index.json").read_text())
        for shard in sorted({index["weight_map"][k] for k in (edits or {}) if k in index["weight_map"]}):
            tensors = load_file(out / shard)
            for key, value in (edits or {}).items():
                if index["weight_map"].get(key) == shard:
                    if value is None:
                        del tensors[key]
                    else:
                        tensors[key] = value
            save_file(tensors, out / shard, metadata={"format": "pt"})
        return out

    return make
