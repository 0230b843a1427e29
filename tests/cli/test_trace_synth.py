"""``oled-moe trace synth``: --like prints its assumptions, --fit compares, user errors are one line, exit 2."""

from oled_hf.cli.main import main
from oled_hf.sim.synthetic import TraceShape, generate
from oled_hf.sim.trace import load_trace
from tests.sim.test_synthetic_fit import truth


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    return err


def test_like_mini_prints_each_figure_with_its_source(tmp_path, capsys):
    out = tmp_path / "mini.trace"
    assert main(["trace", "synth", "--like", "llada2.0-mini", "--out", str(out), "--sequences", "1",
                 "--blocks", "1", "--save-params", str(tmp_path / "mini.json")]) == 0
    text = capsys.readouterr().out
    assert "69.5 distinct experts per block step: dMoE, arXiv 2605.30876" in text
    assert "activation cosine 0.985 between adjacent steps: TIDE, arXiv 2605.20179" in text
    assert "3.5 tokens per forward: assumed" in text
    t = load_trace(str(out))
    assert (t.num_layers, t.num_experts, t.header["top_k"], t.header["block_length"]) == (19, 256, 8, 32)
    assert main(["trace", "synth", "--params", str(tmp_path / "mini.json"), "--out", str(tmp_path / "again.trace"),
                 "--sequences", "1", "--blocks", "1"]) == 0


def test_fit_prints_recorded_against_regenerated(tmp_path, capsys):
    rec = tmp_path / "rec.trace"
    generate(truth(), TraceShape.uniform(6, 2, 8), seed=1).save(str(rec))
    assert main(["trace", "synth", "--fit", str(rec), "--out", str(tmp_path / "syn.trace")]) == 0
    text = capsys.readouterr().out
    assert "rec.trace" in text and "regenerated" in text and "overlap across blocks" in text
    assert len(set(load_trace(str(tmp_path / "syn.trace")).arrays["fwd_seq"].tolist())) == 6  # the trace's shape


def test_errors_are_one_line_exit_2(tmp_path, capsys):
    assert main(["trace", "synth", "--fit", str(tmp_path / "missing.trace"), "--out", str(tmp_path / "o")]) == 2
    err = _err(capsys)
    assert "--fit" in err and "no such file" in err
    assert main(["trace", "synth", "--like", "llada9", "--out", str(tmp_path / "o")]) == 2
    assert "allowed: llada2.0-flash, llada2.0-mini" in _err(capsys)
    (tmp_path / "exists.trace").write_text("x")
    assert main(["trace", "synth", "--out", str(tmp_path / "exists.trace")]) == 2
    assert "pass --overwrite" in _err(capsys)
