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
