"""``oled-moe demo``: the case for offloading in one run, on any machine.

Held-out questions of the tasks the model solves; the experts' device memory resident vs
offloaded; live runs of ``oled`` and ``lru-full`` (LRU with the same dispatch and allocation, the
strongest fair baseline) at the same budget, each checked token for token against full residency;
times measured round-robin with their spread; and, clearly labelled, a projection: this run's own
routing replayed as LLaDA2.0-mini on H200 + PCIe 5. The figures are built in ``demo_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from ..options.budget import add_budget_arguments, budget_choices, budget_name, check_budget_device
from ..options.model import MODEL_HELP, add_device_argument
from ..progress import add_quiet_argument, progress
from .common import (
    add_command,
    cpu_compute_note,
    default_model_path,
    resolve_device,
    resolve_model,
)
from .demo_report import (
    SOLVED_AT,
    TERMS,
    Live,
    budget_line,
    check_mark,
    heldout_entry,
    left_out_line,
    live_table,
    memory_table,
    noise_line,
    projection,
    report_source,
    routed_expert_bytes,
    solved_tasks,
)

DEFAULT_PROMPTS = ["What is 123+456?", "Tell me about the sea."]
DEFAULT_CACHE_RATIO = 0.4  # the budget without a budget flag: 40% of routed-expert bytes on the device
WARMUP_RUNS = 1  # untimed round-robin passes before the timed ones (their one-off costs would be outliers)
PROMPTS_PER_TASK = 2  # held-out questions per solved task (1 with --quick)
CPU_TIMES_NOTE = ("  on a CPU the offloaded runs are not expected to be faster: host and device are the same "
                  "memory,\n  so a copy saves nothing; the point is the device memory above")


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "demo", "offloaded experts vs full residency: memory, hits, identical tokens, times", configure)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help=f"{MODEL_HELP} (default: the deep long-answer toy, oled_hf/toy/deep/checkpoint, once its "
                        "report shows every task solved, else oled_hf/toy/long/checkpoint)")
    add_device_argument(p)
    p.add_argument("--prompt", action="append",
                   help="prompt (repeatable; default: held-out questions of the tasks the toy solves, "
                        "sample prompts for other models)")
    p.add_argument("--prompts-per-task", type=int, default=PROMPTS_PER_TASK,
                   help="held-out questions per solved task when no --prompt is given")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="most new tokens per answer (default: the checkpoint's generation_config)")
    p.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")
    add_budget_arguments(p, default=f"--cache-ratio {DEFAULT_CACHE_RATIO}")  # the budget oled and lru-full share
    p.add_argument("--runs", type=int, default=None,
                   help="timed passes over the prompts, systems taking turns (default: 3; 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="one held-out question per solved task, one timed run and no untimed warm-up run: a few "
                        "seconds, with noisier times")
    add_quiet_argument(p)
    p.set_defaults(func=demo)


class BlockPrinter:
    """A ``generate`` streamer that prints each finished block as it lands, blocks separated by ``|``."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompt_seen, self.blocks = tokenizer, False, 0

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate hands the prompt first
            self.prompt_seen = True
            return
        text = self.tokenizer.decode(value.reshape(-1), skip_special_tokens=True)
        print(("|" if self.blocks else "") + text, end="", flush=True)
        self.blocks += 1

    def end(self) -> None:
        print(flush=True)


def default_demo_model() -> Path | None:
    """The deep long-answer toy (8 MoE layers, hesitating by choice: the workload offloading is for) once
    its held-out report shows every task solved, else the 3-MoE-layer one, if installed."""
    try:
        from ..toy.long import DEEP_CHECKPOINT, LONG_CHECKPOINT, REPORT_NAME
    except ImportError:
        return default_model_path()
    return Path(DEEP_CHECKPOINT if _all_solved(Path(DEEP_CHECKPOINT) / REPORT_NAME) else LONG_CHECKPOINT)


def _all_solved(report_path: Path) -> bool:
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        return False
    entry = heldout_entry(report, *_checkpoint_decoding(report_path.parent))
    return entry is not None and not solved_tasks(entry)[1]


def _checkpoint_decoding(path: Path) -> tuple[int | None, float | None]:
    """The block length and threshold of the checkpoint's generation_config (None where it has none)."""
    try:
        gen = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        gen = {}
    return gen.get("block_length"), gen.get("threshold")


def _decoding(path: Path, args: argparse.Namespace) -> tuple[int | None, float | None]:
    """The block length and threshold the demo decodes with: the flags, else the checkpoint's generation_config."""
    block, threshold = _checkpoint_decoding(path)
    return args.block_length or block, args.threshold or threshold


def default_prompts(path: Path, args: argparse.Namespace) -> tuple[list[str], str | None]:
    """Held-out questions for the shipped toys (of the solved tasks only, with a line naming the others)."""
    toy = default_model_path()
    if toy is not None and path.resolve() == toy.resolve():
        from ..toy import demo_prompts

        return demo_prompts(), None
    try:
        from ..toy.long import REPORT_NAME, load_mix
        from ..toy.long.tasks import heldout_problems
    except ImportError:
        return DEFAULT_PROMPTS, None
    report_path = path / REPORT_NAME
    entry = heldout_entry(json.loads(report_path.read_text()), *_decoding(path, args)) \
        if report_path.is_file() else None
    if entry is None:
        return DEFAULT_PROMPTS, None
    solved, unsolved = solved_tasks(entry)
    specs = [spec for spec in load_mix(path) if spec.name in solved]
    if not specs:
        raise ValueError(f"--model {path}: its {REPORT_NAME} shows no task at >= {SOLVED_AT:.0%} held-out exact "
                         "match, so there is nothing right to show; pass --prompt")
    prompts = [p.question for spec in specs for p in heldout_problems(spec, args.prompts_per_task)]
    return prompts, left_out_line(unsolved, entry, report_source(report_path)) if unsolved else None


def _settle_quick(args: argparse.Namespace) -> int:
    """Apply ``--quick`` to the counts not given; the untimed warm-up runs to do."""
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.quick and args.prompts_per_task == PROMPTS_PER_TASK:
        args.prompts_per_task = 1
    return 0 if args.quick else WARMUP_RUNS


def _check_args(args: argparse.Namespace) -> None:
    for flag, value in (("--runs", args.runs), ("--prompts-per-task", args.prompts_per_task),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value} is invalid: must be >= 1")


def timed_runs(systems: list[Live], encoded: list, reference: list, gen: dict, runs: int, *,
               warmup_runs: int = WARMUP_RUNS, sync=lambda: None, clock=time.perf_counter,
               tick=lambda: None) -> None:
    """Time ``runs`` passes over the prompts into each system's ``seconds``/``tokens``, after ``warmup_runs``.

    Round-robin: per prompt every system in turn, the order rotating with the run and the prompt.
    Every pass is checked token for token against ``reference`` (``identical``), the warm-up ones
    too, but the warm-up passes are not timed: the counted first pass already warmed the caches,
    yet the first timed pass could still pay one-off costs (allocator growth, kernels for new
    shapes: a reported range was 1.90-25.65 ms per token), an outlier no later run repeats.
    """
    import torch

    for r in range(warmup_runs + runs):
        seconds, tokens = {s.name: 0.0 for s in systems}, {s.name: 0 for s in systems}
        for i, inputs in enumerate(encoded):
            for k in range(len(systems)):
                s = systems[(k + r + i) % len(systems)]
                sync()
                start = clock()
                out = s.model.generate(**inputs, **gen)
                sync()
                seconds[s.name] += clock() - start
                tokens[s.name] += out.sequences.shape[1] - inputs["input_ids"].shape[1]
                s.identical &= torch.equal(out.sequences, reference[i])
                tick()  # the progress line: minutes pass here on a busy machine
        if r >= warmup_runs:
            for s in systems:
                s.seconds.append(seconds[s.name])
                s.tokens.append(tokens[s.name])


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def demo(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf

    from ..checkpoints.tokenizer import load_tokenizer
    from ..offload.recorder import TraceRecorder

    warmup_runs = _settle_quick(args)
    _check_args(args)
    # never created here: a folder the user named is only read
    path = resolve_model(args.model if args.model is not None else default_demo_model())
    device = resolve_device(args.device)
    budget = (budget_choices(args) or [{"cache_ratio": DEFAULT_CACHE_RATIO}])[0]
    check_budget_device([budget], device)
    prompts, left_out = (args.prompt, None) if args.prompt else default_prompts(path, args)
    tok = load_tokenizer(path)
    load = dict(device_map=device)
    resident = AutoModelForCausalLM.from_pretrained(path, **load).eval()
    load_tokenizer(path, model=resident)  # checks the pair once the model's vocabulary is known
    oled = AutoModelForCausalLM.from_pretrained(
        path, offload_config=oled_hf.OffloadConfig(**budget, system="oled"), **load).eval()
    stats = oled.offload_stats()
    # the very slots oled got (a budget sized from the device is sized once: a second sizing would see less free)
    same = oled_hf.OffloadConfig(cache_ratio=stats["total_slots"] / (len(stats["layers"]) * oled.config.num_experts),
                                 system="lru-full")
    lru = AutoModelForCausalLM.from_pretrained(path, offload_config=same, **load).eval()
    systems = [Live("resident", resident), Live("oled", oled), Live("lru-full", lru)]
    print(f"model: {path} ({type(oled).__name__}, {oled.num_parameters() / 1e6:.2f}M parameters), on {device}")
    print(budget_line(budget_name(budget), stats, oled.config.num_experts))
    print(TERMS)
    print(memory_table(routed_expert_bytes(resident), stats))
    if left_out:
        print(left_out)
    gen = dict(return_dict_in_generate=True)
    if args.max_new_tokens is not None:
        gen["max_new_tokens"] = args.max_new_tokens
    gen.update({k: v for k, v in dict(block_length=args.block_length, threshold=args.threshold).items() if v})
    encoded = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True).to(resident.device) for p in prompts]
    recorder = TraceRecorder(oled)  # this run's routing, in memory, for the projection
    recorder.begin_sequence(0)
    warm = tok("warm up", return_tensors="pt").to(resident.device)
    for s in systems:  # first calls pay one-off costs; the warm-up is not counted, and warms every cache alike
        s.model.generate(**warm, max_new_tokens=4, block_length=4)
        if s.name != "resident":
            s.model.reset_offload_stats()
    reference = []
    for i, (prompt, inputs) in enumerate(zip(prompts, encoded)):  # the counted first pass, untimed
        recorder.begin_sequence(i + 1)
        print(f"\nuser: {prompt}\nstreaming (oled offloaded, blocks separated by |): ", end="")
        outs = {s.name: s.model.generate(**inputs, **gen, streamer=BlockPrinter(tok) if s.name == "oled" else None)
                for s in systems}
        reference.append(outs["resident"].sequences)
        for s in systems[1:]:
            s.identical &= torch.equal(outs[s.name].sequences, reference[-1])
        out, n = outs["resident"], inputs["input_ids"].shape[1]
        answer = tok.decode(out.sequences[0, n:], skip_special_tokens=True)
        same = ", ".join(f"{s.name} {'yes' if torch.equal(outs[s.name].sequences, out.sequences) else 'NO'}"
                         for s in systems[1:])
        print(f"assistant: {answer!r}{check_mark(prompt, answer)}\n  {int(out.iterations[0])} iterations over "
              f"{int(out.blocks[0])} blocks, {float(out.tokens_per_forward[0]):.2f} tokens per forward; "
              f"tokens identical to resident: {same}")
    recorder.detach()
    for s in systems[1:]:
        s.stats = s.model.offload_stats()
    sync = torch.cuda.synchronize if resident.device.type == "cuda" else (lambda: None)
    calls = (warmup_runs + args.runs) * len(encoded) * len(systems)
    load_before = load_average()
    with progress(total=calls, desc="timing the systems", unit="generate", quiet=args.quiet) as bar:
        timed_runs(systems, encoded, reference, gen, args.runs, warmup_runs=warmup_runs, sync=sync,
                   tick=lambda: bar.update(1))
    load = None if load_before is None else (load_before, load_average())
    print()
    print(live_table(systems, len(prompts), warmup_runs))
    print(noise_line(systems, load, os.cpu_count() or 1))
    print(f"  {cpu_compute_note(stats)}")
    if device == "cpu":
        print(CPU_TIMES_NOTE)
    print()
    print(projection(recorder.writer.trace(), stats["total_slots"]))
    same = all(s.identical for s in systems)
    print(f"\ntokens identical to resident for every system: {'yes' if same else 'NO'}")
    return 0 if same else 1
