"""What a careless or hostile user does on the command line and from Python: files, traces, masks (issues 35, 37).

The CLI and Python-API half of ``eval/attack.py`` (which runs these after its server cases; ``--only cli``
runs just these). Each case is ``case(model) -> (what happened, passed)``, ``model`` a fresh tiny
checkpoint (cases that need trained weights use the shipped addition toy). Every case runs in a fresh
interpreter: ``python -m oled_hf.cli.main ...`` or a short ``python -c`` script, stdin closed, offline,
one thread, a 180 s timeout and a 4 GiB address-space limit (a giant allocation fails instead of stalling
the machine; a file-size limit where the case says so). A refused command must exit 2 with exactly one
stderr line holding the expected text, and leave nothing written or changed.

    .venv/bin/python eval/attack.py --only cli       # several minutes on 2 busy cores

``CASES`` is the table ``eval/attack.py`` runs and tests/eval/test_attack.py checks: (label, case),
each label starting with its issue item ("35.1 ...").
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOY = str(ROOT / "oled_hf" / "toy" / "checkpoint")
AS_LIMIT = 4 << 30  # bytes of address space for every subprocess
TIMEOUT = 180  # seconds for every subprocess
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
WIDTH = 30  # the label column of every printed row

Case = Callable[[str], tuple[str, bool]]


def row(label: str, ok: bool, result: str, health: str = "-", nxt: str = "-") -> str:
    """One printed line per case, the same columns for server and CLI cases (CLI cases have no /health)."""
    return f"{label:{WIDTH}} {'ok' if ok else 'FAIL':4}  {health:>11}  {nxt:4}  {result}"


def run(cmd: list[str], cwd: Path | str = ROOT, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``cmd`` bounded: 4 GiB of address space, ``fsize`` bytes per file if given, stdin closed, 180 s."""
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=cwd, env=ENV, preexec_fn=limits)


def cli(*argv: str, cwd: Path | str = ROOT, fsize: int | None = None) -> subprocess.CompletedProcess:
    """``oled-moe ARGV`` (as ``python -m oled_hf.cli.main``), bounded as :func:`run` is."""
    return run([sys.executable, "-m", "oled_hf.cli.main", *argv], cwd, fsize)


def refused(r: subprocess.CompletedProcess, *expect: str) -> tuple[str, bool]:
    """Exit 2 and exactly one stderr line holding every ``expect``: the project's CLI error contract."""
    lines = r.stderr.strip().splitlines()
    shown = lines[-1][:150] if lines else "(no stderr)"
    more = f" ({len(lines)} stderr lines, first: {lines[0][:100]})" if len(lines) > 1 else ""
    return f"exit {r.returncode}: {shown}{more}", (r.returncode == 2 and len(lines) == 1
                                              and all(e in lines[0] for e in expect))


def py(code: str) -> tuple[str, str]:
    """(last stdout line, stdout + stderr) of ``code`` (dedented) in a fresh interpreter, bounded."""
    r = run([sys.executable, "-c", textwrap.dedent(code)])
    lines = r.stdout.strip().splitlines()
    last = lines[-1] if lines else f"exit {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:150]}"
    return last, r.stdout + r.stderr


def _tiny_prelude(model: str) -> str:
    return (f"import tempfile, torch, oled_hf\nfrom oled_hf.modeling import OledLLaDA2ForDiffusionLM\n"
            f"tiny = {model!r}\nPROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])\n")


def _each(results: dict[str, tuple[str, bool]]) -> tuple[str, bool]:
    """Several sub-checks as one row: the failures in full, the passes by name."""
    shown = "; ".join(f"{name}: {'ok' if ok else text}" for name, (text, ok) in results.items())
    return shown, all(ok for _, ok in results.values())


# ---- 13.5, 35.2, 35.8, 37.1: flags refused in one line before anything loads ---------------------------------
def blank_api_keys(model: str) -> tuple[str, bool]:
    """``serve --api-key '   '`` / ``''`` is refused before loading anything (issue 13.5)."""
    return _each({repr(key): refused(cli("serve", "--model", model, "--api-key", key), "--api-key is blank")
                  for key in ("   ", "")})


def device_without_cuda(model: str) -> tuple[str, bool]:
    """``chat``/``serve --device cuda`` without CUDA printed a 44-line traceback (35.2); skipped where CUDA exists."""
    import torch

    if torch.cuda.is_available():
        return "CUDA is available here: nothing to refuse", True
    return _each({c: refused(cli(c, "--model", model, "--device", "cuda"), "CUDA is not available on this machine")
                  for c in ("chat", "serve")})


def model_under_unknown_home(model: str) -> tuple[str, bool]:
    """``--model '~nonexistentuser/x'`` was ``RuntimeError: Could not determine home directory`` (35.8)."""
    del model
    extra = {"benchmark": ["--cache-size", "4"]}
    return _each({c: refused(cli(c, "--model", "~nonexistentuser/x", *extra.get(c, [])), "cannot be expanded")
                  for c in ("chat", "serve", "benchmark")})


def budget_flags(model: str) -> tuple[str, bool]:
    """The README's budget spellings on serve and chat were 'unrecognized arguments' (37.1): without CUDA each
    must reach the budget check (one line: auto needs CUDA); a bad value or two budgets is one line naming them."""
    import torch

    results = {}
    for c in ("serve", "chat"):
        for flags in (["--cache-ratio", "auto"], ["--gpu-memory-utilization", "0.8"]):
            text, ok = refused(cli(c, "--model", model, "--device", "cpu", *flags), "needs a CUDA device")
            results[f"{c} {' '.join(flags)}"] = (text, ok or torch.cuda.is_available())
        results[f"{c} utilization 1.5"] = refused(cli(c, "--model", model, "--gpu-memory-utilization", "1.5"),
                                                  "--gpu-memory-utilization 1.5 is invalid")
        results[f"{c} two budgets"] = refused(cli(c, "--model", model, "--max-gpu-memory", "20GiB", "--cache-size",
                                                  "4"), "not --cache-size and --max-gpu-memory")
    return _each(results)


# ---- 35.1: trace record --out over a file or through a link ---------------------------------------------------
def _record(out: str, *extra: str) -> list[str]:
    return ["trace", "record", "--model", TOY, "--prompts", "p.txt", "--out", out, "--limit", "1",
            "--max-new-tokens", "8", *extra]


def record_over_a_file(model: str) -> tuple[str, bool]:
    """``victim.txt`` and a link to it are refused before recording; --overwrite replaces the link itself."""
    del model
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "p.txt").write_text("hello there\n")
        (d / "victim.txt").write_text("precious\n")
        (d / "link.trace").symlink_to(d / "victim.txt")
        results = {name: refused(cli(*_record(name), cwd=d), "already exists; pass --overwrite")
                   for name in ("victim.txt", "link.trace")}
        kept = (d / "victim.txt").read_text() == "precious\n"
        replaced = cli(*_record("link.trace", "--overwrite"), cwd=d)
        kept &= (d / "victim.txt").read_text() == "precious\n"
        results["victim kept"] = ("CHANGED", kept)
        results["--overwrite replaced the link"] = (f"exit {replaced.returncode}, link still there",
                                                   replaced.returncode == 0 and not (d / "link.trace").is_symlink())
    return _each(results)


# ---- 35.3: a trace file with one corrupted field; synth parameters out of range ------------------------------
def replay_corrupted_traces(model: str) -> tuple[str, bool]:
    """num_experts 1e12 (was a 69 TiB allocation), expert id 999 (an IndexError), NaN weights (accepted)."""
    del model
    import torch

    from oled_hf.sim.synthetic import synthetic_trace

    edits = {
        "num_experts": (lambda t: t["header"].__setitem__("num_experts", 10 ** 12), "num_experts=1000000000000"),
        "expert 999": (lambda t: t["topk_ids"].__setitem__((0, 0, 0), 999), "topk_ids[0, 0, 0]=999 is out of range"),
        "NaN weight": (lambda t: t["topk_weights"].__setitem__((0, 0, 0), float("nan")), "topk_weights[0, 0, 0]=nan"),
        "fwd_rows": (lambda t: t["fwd_rows"].__setitem__(-1, 10 ** 9), "fwd_rows["),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        synthetic_trace(num_layers=2, num_experts=8, top_k=2, block_length=4, num_blocks=2).save(str(d / "ok.trace"))
        for name, (edit, expect) in edits.items():
            data = torch.load(d / "ok.trace", weights_only=True)
            edit(data)
            torch.save(data, d / "bad.trace")
            results[name] = refused(cli("trace", "replay", "bad.trace", "--cache-size", "2", "--policy", "lru", cwd=d),
                                    expect)
    return _each(results)


def synth_refused(*expect: str, params: dict | None = None, fsize: int | None = None, flags: tuple[str, ...] = ()
                  ) -> Case:
    """``trace synth --out o/o.trace FLAGS`` (with a --like llada2.0-mini parameter file changed by ``params``) is
    refused in one line holding ``expect`` and leaves nothing in ``o/``; ``{out}`` in ``expect`` is the --out path."""
    def case(model: str) -> tuple[str, bool]:
        del model
        from oled_hf.sim.synth_like import like

        with tempfile.TemporaryDirectory() as tmp:
            d, out = Path(tmp), Path(tmp) / "o" / "o.trace"
            out.parent.mkdir()
            argv = ["trace", "synth", "--out", str(out), *flags]
            if params is not None:
                data = {**json.loads(like("llada2.0-mini").to_json()), **params}
                (d / "p.json").write_text(json.dumps(data))  # raw JSON values: NaN allowed
                argv += ["--params", str(d / "p.json")]
            text, ok = refused(cli(*argv, fsize=fsize), *(e.format(out=out) for e in expect))
            left = sorted(p.name for p in out.parent.iterdir())
        return text + (f"; left behind: {left}" if left else ""), ok and not left
    return case


# ---- 35.4: writes that fail ---------------------------------------------------------------------------------
def record_into_a_read_only_folder(model: str) -> tuple[str, bool]:
    """Refused before the model loads (was: every prompt decoded, then the write failed)."""
    del model
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "p.txt").write_text("hello there\n")
        ro = d / "ro"
        ro.mkdir()
        root = os.geteuid() == 0  # root writes through mode bits: make the folder immutable instead
        subprocess.run(["chattr", "+i", str(ro)], capture_output=True) if root else ro.chmod(0o555)
        try:
            start = time.monotonic()
            text, ok = refused(cli(*_record("ro/t.trace"), cwd=d), "is not writable")
            seconds = time.monotonic() - start
            ok &= not any(ro.iterdir())
        finally:
            subprocess.run(["chattr", "-i", str(ro)], capture_output=True) if root else ro.chmod(0o755)
    return f"{text} ({seconds:.1f} s)", ok


def make_tiny_on_a_full_disk(model: str) -> tuple[str, bool]:
    """``ulimit -f`` 1 MiB against 4 MB shards (was: config.json and generation_config.json left behind)."""
    del model
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        text, ok = refused(cli("make-tiny", "sub/tiny", cwd=d, fsize=1 << 20), "could not write")
        left = sorted(p.name for p in d.rglob("*"))
    return f"{text}; left behind: {left}", ok and not left


def synth_on_a_full_disk(model: str) -> tuple[str, bool]:
    """``trace synth`` under ``ulimit -f`` 64 KiB: one line, nothing left; a rerun without the limit then writes."""
    del model
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "o.trace"
        argv = ("trace", "synth", "--out", str(out), "--sequences", "1", "--blocks", "1")
        text, ok = refused(cli(*argv, fsize=64 << 10), f"--out {out}: could not write the trace "
                           "([Errno 27] File too large)", "nothing was written")
        left = sorted(p.name for p in Path(tmp).iterdir())
        rerun = cli(*argv)
        written = sorted(p.name for p in Path(tmp).iterdir())
    return (f"{text}; left behind: {left}; rerun exit {rerun.returncode}, folder {written}",
            ok and not left and rerun.returncode == 0 and written == ["o.trace"])


# ---- 35.6, 35.7, 35.8: the Python API ----------------------------------------------------------------------
def official_additive_mask(model: str) -> tuple[str, bool]:
    """The official sampler's mask (tril over blocks, .log(), model dtype) gives block_length=8's logits."""
    last, _ = py(_tiny_prelude(model) + textwrap.dedent("""
    m = OledLLaDA2ForDiffusionLM.from_pretrained(tiny).eval()
    ids = torch.randint(0, 400, (1, 24), generator=torch.Generator().manual_seed(0))
    blocks = torch.tril(torch.ones(3, 3))
    mask = blocks.repeat_interleave(8, 0).repeat_interleave(8, 1)[None, None].log().to(m.dtype)
    with torch.no_grad():
        diff = (m(ids, block_length=8).logits - m(ids, attention_mask=mask).logits).abs().max().item()
    try:
        m(ids, attention_mask=(mask == 0).float())
        refused = "0/1 float mask accepted"
    except ValueError as e:
        refused = "0/1 float mask refused" if "additive" in str(e) else f"wrong error: {e}"
    print(f"max-abs logit diff {diff:.3g}; {refused}")
    """))
    return last, last.startswith("max-abs logit diff 0;") and last.endswith("0/1 float mask refused")


def qk_norm_flag_and_tie_rule(model: str) -> tuple[str, bool]:
    """``use_qk_norm=False`` builds no QK-norm modules; a one-ulp tie goes to the larger logit, as officially."""
    del model
    last, _ = py("""
    import torch
    from oled_hf.modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
    from oled_hf.modeling.commit import choose_tokens
    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, rotary_dim=8, num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=8, n_group=2, topk_group=1, mask_token_id=63, eos_token_id=62, pad_token_id=62)
    m = OledLLaDA2ForDiffusionLM(OledLLaDA2Config(**cfg, use_qk_norm=False))
    has_norm = any("query_layernorm" in n or "key_layernorm" in n for n in m.state_dict())
    low = torch.tensor(1e-3)
    logits = torch.full((1, 1, 6), -5.0)
    logits[0, 0, 1], logits[0, 0, 2] = low, torch.nextafter(low, torch.tensor(1.0))
    ids, _ = choose_tokens(logits, mask_token_id=5)
    print(f"use_qk_norm=False has QK-norm modules: {has_norm}; tie between ids 1 and 2 (one ulp) -> {ids.item()}")
    """)
    return last, last.endswith("False; tie between ids 1 and 2 (one ulp) -> 2")


def repetition_penalty_1e_38(model: str) -> tuple[str, bool]:
    """``repetition_penalty=1e-38`` finishes (it left no choosable token); 1e-39 is refused naming the value."""
    del model
    last, _ = py(f"""
    import oled_hf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    m = AutoModelForCausalLM.from_pretrained({TOY!r}).eval()
    tok = AutoTokenizer.from_pretrained({TOY!r})
    ids = tok.apply_chat_template([{{"role": "user", "content": "What is 12+34?"}}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    out = m.generate(ids, repetition_penalty=1e-38)
    try:
        m.generate(ids, repetition_penalty=1e-39)
        small = "1e-39 accepted"
    except ValueError as e:
        small = "1e-39 refused" if "repetition_penalty=1e-39" in str(e) else f"wrong error: {{e}}"
    print(f"1e-38 finished: {{out.shape[1] - ids.shape[1]}} new tokens; {{small}}")
    """)
    return last, last.startswith("1e-38 finished") and last.endswith("1e-39 refused")


def toys_have_their_own_names(model: str) -> tuple[str, bool]:
    del model
    last, _ = py("""
    from oled_hf.cli.common import served_model_name
    from oled_hf.toy import TOY_CHECKPOINT
    from oled_hf.toy.long import DEEP_CHECKPOINT, LONG_CHECKPOINT
    print(sorted(served_model_name(p) for p in (TOY_CHECKPOINT, LONG_CHECKPOINT, DEEP_CHECKPOINT)))
    """)
    return last, last == "['oled-toy-addition', 'oled-toy-deep', 'oled-toy-long']"


# ---- 37.3, 37.4: accelerate's options, tokenizers -----------------------------------------------------------
def accelerate_disk_offload(model: str) -> tuple[str, bool]:
    """device_map/max_memory/offload_folder disk-offload as for any model; with offload_config they are refused."""
    last, _ = py(_tiny_prelude(model) + textwrap.dedent("""
    from transformers import AutoModelForCausalLM
    resident = OledLLaDA2ForDiffusionLM.from_pretrained(tiny).eval()
    resident = resident.generate(PROMPT, max_new_tokens=16, block_length=8)
    disk = AutoModelForCausalLM.from_pretrained(tiny, device_map="auto", max_memory={"cpu": "200KB"},
                                                offload_folder=tempfile.mkdtemp())
    same = bool((disk.generate(PROMPT, max_new_tokens=16, block_length=8) == resident).all())
    try:
        AutoModelForCausalLM.from_pretrained(tiny, max_memory={"cpu": "1GB"},
                                             offload_config=oled_hf.OffloadConfig(cache_size=4))
        refused = "max_memory + offload_config accepted"
    except ValueError as e:
        refused = "refused naming OffloadConfig" if "OffloadConfig" in str(e) and "\\n" not in str(e) else str(e)
    as_dict = AutoModelForCausalLM.from_pretrained(tiny, offload_config={"cache_size": 4}).is_offloaded
    print(f"disk offload tokens == resident: {same}; {refused}; dict offload_config loads offloaded: {as_dict}")
    """))
    return last, last == ("disk offload tokens == resident: True; refused naming OffloadConfig; dict offload_config "
                          "loads offloaded: True")


def tokenizer_left_padding_no_prompt(model: str) -> tuple[str, bool]:
    """The toy's tokenizer pads left and loads without Transformers' custom-code prompt."""
    del model
    last, out = py(f"""
    import oled_hf
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained({TOY!r})
    m = AutoModelForCausalLM.from_pretrained({TOY!r}).eval()
    batch = tok(["What is 1+2?", "What is 123+456?"], padding=True, return_tensors="pt")
    out = m.generate(**batch, max_new_tokens=8)
    print(f"padding_side={{tok.padding_side}}; padded batch generated {{tuple(out.shape)}}")
    """)
    prompt = "Do you wish to run the custom code" in out
    ok = last.startswith("padding_side=left; padded batch generated") and not prompt
    return f"{last}; prompt shown: {prompt}", ok


CASES: list[tuple[str, Case]] = [
    ("13.5 blank --api-key", blank_api_keys),
    ("35.1 record over a file/link", record_over_a_file),
    ("35.2 --device cuda, no CUDA", device_without_cuda),
    ("35.3 corrupted trace fields", replay_corrupted_traces),
    ("35.3 synth --sequences 1e9", synth_refused("--sequences 1000000000", "allowed at most 4 GiB",
                                                 flags=("--sequences", "1000000000"))),
    ("35.3 synth --experts 1e9", synth_refused("--experts 1000000000: allowed 1 to 65536",
                                               flags=("--experts", "1000000000"))),
    ("35.3 synth --batch-size 1e6", synth_refused("--batch-size 1000000", "allowed at most 4 GiB",
                                                  flags=("--batch-size", "1000000"))),
    ("35.3 synth --top-k 0", synth_refused("--top-k 0: allowed 1 to 256", flags=("--top-k", "0"))),
    ("35.3 synth --block-length 0", synth_refused("--block-length 0: allowed 1 to 4096",
                                                  flags=("--block-length", "0"))),
    ("35.3 params num_experts=1e12", synth_refused("num_experts=1000000000000: allowed 1 to 65536",
                                                   params={"num_experts": 10 ** 12})),
    ("35.3 params num_experts=true", synth_refused("num_experts=True: must be an integer, not bool",
                                                   params={"num_experts": True})),
    ("35.3 params block_length=1e7", synth_refused("block_length=10000000: allowed 1 to 4096",
                                                   params={"block_length": 10 ** 7})),
    ("35.3 params top_k=\"8\"", synth_refused("top_k='8': must be an integer", params={"top_k": "8"})),
    ("35.3 params threshold=NaN", synth_refused("threshold=nan: allowed a finite number",
                                                params={"threshold": float("nan")})),
    ("35.3 params hazard=-1.5", synth_refused("hazard=-1.5: allowed a finite number from 0 to 1",
                                              params={"hazard": -1.5})),
    ("35.3 params carry={}", synth_refused("carry: missing states", params={"carry": {}})),
    ("35.4 record into read-only", record_into_a_read_only_folder),
    ("35.4 make-tiny, ulimit -f 1M", make_tiny_on_a_full_disk),
    ("35.4 synth, ulimit -f 64K", synth_on_a_full_disk),
    ("35.6 official additive mask", official_additive_mask),
    ("35.7 use_qk_norm, tie rule", qk_norm_flag_and_tie_rule),
    ("35.8 repetition_penalty 1e-38", repetition_penalty_1e_38),
    ("35.8 toys' served names", toys_have_their_own_names),
    ("35.8 --model ~nouser/x", model_under_unknown_home),
    ("37.1 budget flags parse", budget_flags),
    ("37.3 accelerate disk offload", accelerate_disk_offload),
    ("37.4 tokenizer pads left", tokenizer_left_padding_no_prompt),
]


def run_cases(model: str, cases: list[tuple[str, Case]] = CASES) -> bool:
    """Each case, one printed row; a case that raises (or times out) is a failed case. True if all passed."""
    passed_all = True
    for label, case in cases:
        start = time.monotonic()
        try:
            result, ok = case(model)
        except Exception as err:
            result, ok = f"{type(err).__name__}: {err}", False
        passed_all &= ok
        print(row(label, ok, f"{result} [{time.monotonic() - start:.0f} s]"), flush=True)
    return passed_all
