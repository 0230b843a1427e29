"""Hub ids (``ORG/NAME[@REVISION]``) wherever a checkpoint folder is taken, offline from a HF cache.

The cache is built here in the layout ``huggingface_hub`` writes (``models--ORG--NAME/snapshots/
COMMIT/FILE`` symlinked to ``../../blobs/HASH``, ``refs/main`` holding the commit), from the tiny
checkpoint; the hub is off (``HF_HUB_OFFLINE=1``, set by conftest) so nothing touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from oled_hf.cli import common
from oled_hf.cli.main import main

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_cache(cache: Path, repo_id: str, src: Path, commit: str = COMMIT) -> Path:
    """Put the files of ``src`` into ``cache`` as hub repo ``repo_id`` at ``commit``; its snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for file in sorted(p for p in src.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / file.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty HF cache that huggingface_hub and transformers read (their constant is set at import)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert constants.is_offline_mode()  # conftest: never the network
    return cache


@pytest.fixture
def cached_tiny(hub_cache, tiny_path):
    return add_to_cache(hub_cache, "org/tiny", tiny_path)


def test_a_cached_hub_id_resolves_to_its_snapshot(cached_tiny):
    assert common.resolve_model("org/tiny") == cached_tiny
    assert common.resolve_model("org/tiny@main") == cached_tiny
    assert common.resolve_model(f"org/tiny@{COMMIT}") == cached_tiny
    assert (cached_tiny / "model.safetensors.index.json").is_symlink()  # the real cache layout
    assert common.served_model_name(cached_tiny) == "org/tiny"  # not the commit hash


def test_a_folder_wins_over_an_id_of_the_same_spelling(cached_tiny, tiny_path, tmp_path, monkeypatch):
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_path, tmp_path / "org" / "tiny")
    assert common.resolve_model("org/tiny") == Path("org/tiny")


def test_an_uncached_id_offline_is_one_line_naming_folder_and_hub(hub_cache, capsys):
    with pytest.raises(ValueError) as err:
        common.resolve_model("org/missing")
    assert str(err.value) == (
        f"--model org/missing: no such folder, and no cached Hugging Face hub model org/missing in {hub_cache} "
        "(the hub is off: HF_HUB_OFFLINE=1; download it online first or give a checkpoint folder)")
    assert main(["trace", "record", "--model", "org/missing", "--prompts", "p", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oled-moe trace record: error: --model org/missing: no such folder, and no cached ")
    assert err.count("\n") == 1


def test_an_uncached_revision_is_named(cached_tiny):
    with pytest.raises(ValueError, match=r"^--model org/tiny@v9: no such folder, and no cached Hugging Face hub "
                                         r"model org/tiny at revision v9 in "):
        common.resolve_model("org/tiny@v9")


def test_offloaded_from_pretrained_by_id_generates_the_folders_tokens(cached_tiny, tiny_path, tiny_tokenizer):
    """Transformers resolves the id; the ExpertStore then reads the snapshot's shard symlinks."""
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf import OffloadConfig

    ids = tiny_tokenizer("the cat sat on", return_tensors="pt").input_ids
    tokens = []
    for source in (tiny_path, "org/tiny"):
        model = OledLLaDA2ForDiffusionLM.from_pretrained(source, offload_config=OffloadConfig(cache_ratio=0.5))
        assert model.is_offloaded
        with torch.no_grad():
            tokens.append(model.generate(ids, max_new_tokens=8, block_length=8).tolist())
    assert tokens[0] == tokens[1]


def test_prepare_takes_a_hub_id(hub_cache, tiny_path, tmp_path, capsys):
    snapshot = add_to_cache(hub_cache, "inclusionAI/LLaDA2.1-mini", tiny_path)
    out = tmp_path / "prepared"
    assert main(["prepare", "inclusionAI/LLaDA2.1-mini", str(out)]) == 0
    assert capsys.readouterr().out == (f"prepared {out} (weights and tokenizer linked from "
                                       f"inclusionAI/LLaDA2.1-mini, {snapshot})\n")
    shards = sorted(out.glob("*.safetensors"))
    assert shards and all(s.is_symlink() and s.resolve().parent.name == "blobs" for s in shards)
    assert json.loads((out / "generation_config.json").read_text())["decoding"] == "quality"  # 2.1, by its id
    assert common.resolve_model(str(out)) == out


def test_prepare_names_an_id_that_is_not_cached(hub_cache, tmp_path, capsys):
    assert main(["prepare", "inclusionAI/LLaDA2.0-mini", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oled-moe prepare: error: SRC inclusionAI/LLaDA2.0-mini: no such folder, and no cached "
                          "Hugging Face hub model inclusionAI/LLaDA2.0-mini in ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def _online(monkeypatch, answer):
    """The hub "on", with ``snapshot_download`` replaced by ``answer`` (nothing reaches the network)."""
    import huggingface_hub
    from huggingface_hub import constants

    calls = []

    def fake(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return answer(repo_id)

    monkeypatch.setattr(constants, "is_offline_mode", lambda: False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return calls


def test_online_an_id_is_downloaded_through_snapshot_download(cached_tiny, monkeypatch):
    calls = _online(monkeypatch, lambda repo_id: str(cached_tiny))
    assert common.resolve_model("org/tiny@v1") == cached_tiny
    (repo_id, kwargs), = calls
    assert repo_id == "org/tiny" and kwargs["revision"] == "v1" and kwargs["local_files_only"] is False
    assert "*.safetensors" in kwargs["allow_patterns"] and "*.bin" not in kwargs["allow_patterns"]


def test_online_an_unknown_id_is_one_line(hub_cache, monkeypatch):
    import httpx2
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(repo_id):
        response = httpx2.Response(401, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}"))
        raise RepositoryNotFoundError("401 Client Error. Repository Not Found", response=response)

    _online(monkeypatch, missing)
    with pytest.raises(ValueError, match=r"^--model org/typo: no such folder, and the Hugging Face hub has no model "
                                         r"org/typo \(or it is private: log in with `hf auth login`\)$"):
        common.resolve_model("org/typo")

    def unreachable(repo_id):
        raise OSError("Connection refused\nretry later")

    _online(monkeypatch, unreachable)
    with pytest.raises(ValueError, match=rf"^--model org/tiny: no such folder, and the Hugging Face hub model org/tiny "
                                         rf"is neither in {hub_cache} nor reachable: Connection refused retry later$"):
        common.resolve_model("org/tiny")


def test_names_that_cannot_be_ids_keep_the_folder_message(hub_cache, monkeypatch):
    _online(monkeypatch, lambda repo_id: pytest.fail("a path is not an id"))
    for name in ("./org/tiny", "/abs/org", "a/b/c", "~/models/x", "no/such/model!"):
        with pytest.raises(ValueError, match=r": no such folder \(give a checkpoint folder"):
            common.resolve_model(name)


def test_a_subcommand_runs_on_a_cached_id(cached_tiny, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    code = main(["trace", "record", "--model", "org/tiny", "--prompts", str(prompts), "--out",
                 str(tmp_path / "t.trace"), "--max-new-tokens", "8", "--block-length", "8"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("recorded 1 prompts, ") and (tmp_path / "t.trace").is_file()
