"""``oled-moe trace synth``: --like prints its assumptions, --fit compares, user errors are one line, exit 2."""

from oled_hf.cli.main import main
from oled_hf.offload.trace import load_trace
from oled_hf.sim.synthetic import TraceShape, generate
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


# ------------------------------------------------------------------ issue 35: sizes, zeros, --out written whole
def test_sizes_are_checked_against_the_memory_estimate_before_allocating(tmp_path, capsys):
    """Used to hang (--sequences 1e9 grew RSS without bound) or allocate giant arrays before any check."""
    out = tmp_path / "o.trace"
    assert main(["trace", "synth", "--out", str(out), "--sequences", "2", "--blocks", "1", "--max-memory",
                 "0.001"]) == 2  # first: on the old code the next case hangs
    assert "allowed at most 0.001 GiB" in _err(capsys)
    assert main(["trace", "synth", "--out", str(out), "--sequences", "1000000000"]) == 2
    err = _err(capsys)
    assert "--sequences 1000000000" in err and "GiB" in err and "allowed at most 4 GiB (--max-memory)" in err
    assert main(["trace", "synth", "--out", str(out), "--experts", "1000000000"]) == 2
    assert "--experts 1000000000: allowed 1 to 65536" in _err(capsys)
    assert main(["trace", "synth", "--out", str(out), "--batch-size", "1000000"]) == 2
    assert "--batch-size 1000000" in _err(capsys)
    assert main(["trace", "synth", "--like", "llada2.0-mini", "--out", str(out), "--sequences", "100000000"]) == 2
    assert "--sequences 100000000" in _err(capsys)
    assert not out.exists()


def test_zero_is_refused_never_replaced_by_the_default(tmp_path, capsys):
    """--top-k 0 and --block-length 0 used to become 8 and 32 through ``args.x or default``."""
    for flag, allowed in (("--top-k", "allowed 1 to 256"), ("--block-length", "allowed 1 to 4096"),
                          ("--layers", "allowed 1 to 1024"), ("--experts", "allowed 1 to 65536"),
                          ("--blocks", "allowed at least 1"), ("--sequences", "allowed at least 1"),
                          ("--batch-size", "allowed at least 1")):
        assert main(["trace", "synth", "--out", str(tmp_path / "o.trace"), flag, "0"]) == 2
        assert f"{flag} 0: {allowed}" in _err(capsys)
    assert main(["trace", "synth", "--out", str(tmp_path / "o.trace"), "--seed", "-1"]) == 2
    assert "--seed -1: allowed at least 0" in _err(capsys)


def test_bad_params_file_fields_are_one_line_errors(tmp_path, capsys):
    """A parameter file's fields used to reach NumPy unchecked: tracebacks, giant arrays, a hazard of -1.5."""
    import json

    from tests.sim.test_synthetic_fit import truth

    good = json.loads(truth().to_json())
    for key, value, says in (("top_k", "8", "top_k='8': must be an integer, not str"),
                             ("num_experts", 10 ** 12, "num_experts=1000000000000: allowed 1 to 65536"),
                             ("block_length", 10 ** 7, "block_length=10000000: allowed 1 to 4096"),
                             ("hazard", -1.5, "hazard=-1.5: allowed a finite number from 0 to 1")):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(good | {key: value}))
        assert main(["trace", "synth", "--params", str(path), "--out", str(tmp_path / "o.trace")]) == 2
        err = _err(capsys)
        assert str(path) in err and says in err, err
    assert not (tmp_path / "o.trace").exists()


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_out_under_a_file_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    """``ulimit -f``: used to die with torch's ``RuntimeError: [enforce fail at inline_container.cc:672]`` and leave
    a partial file that blocked a rerun. Now: one line naming the path and the OS error, exit 2, nothing left."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "o.trace"
    cmd = [sys.executable, "-m", "oled_hf.cli.main", "trace", "synth", "--out", str(out), "--sequences", "1",
           "--blocks", "1"]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, timeout=300,
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert f"--out {out}: could not write the trace" in r.stderr and "File too large" in r.stderr
    assert _leftovers(tmp_path) == []
    assert main(cmd[3:]) == 0  # the rerun (no limit, in this process) is not blocked by a partial file
    assert load_trace(str(out)).num_forwards > 0


def test_out_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A full disk mid-write (simulated: the trace's writer fails after writing part of the file)."""
    import errno

    from oled_hf.offload.trace import Trace

    def full(self, fh):
        fh.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Trace, "save", full)
    out = tmp_path / "o.trace"
    assert main(["trace", "synth", "--out", str(out), "--sequences", "1", "--blocks", "1"]) == 2
    err = _err(capsys)
    assert f"--out {out}: could not write the trace" in err and "No space left on device" in err
    assert _leftovers(tmp_path) == []


def test_out_folder_missing_or_a_folder_is_refused_before_work(tmp_path, capsys):
    assert main(["trace", "synth", "--out", str(tmp_path / "no" / "o.trace")]) == 2
    assert "does not exist" in _err(capsys)
    assert main(["trace", "synth", "--out", str(tmp_path)]) == 2
    assert "is a folder" in _err(capsys)
