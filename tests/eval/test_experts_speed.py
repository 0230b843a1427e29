"""eval/experts_speed.py keeps its 387 MB checkpoint in the user's cache, beside make bench's, not in the repository."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_experts_speed_uses_the_bench_cache_folder(monkeypatch, tmp_path):
    speed, bench = _load("experts_speed"), _load("bench_generate")
    assert speed.build_parser().parse_args([]).model is None  # no repository-relative default
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert speed.default_model() == bench.cache_dir() / "small" == tmp_path / "oled-hf" / "small"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert speed.default_model() == Path.home() / ".cache" / "oled-hf" / "small"
    assert ROOT not in speed.default_model().parents
