"""Record routing traces of the long-answer toy on held-out prompts (for ``oled-moe trace replay``, sim/).

``python -m oled_hf.toy.long.traces OUT.pt [--n-per-task 25] [--block-length 16] [--threshold 0.95] [--split dev]
[--overwrite]``

Prompts are the first held-out problems of each task of the checkpoint's mix (``--split dev``:
training-split problems, for tuning policies without looking at held-out routing), interleaved task
by task, each decoded greedily with ``generate`` (batch 1, the checkpoint's generation config
unless overridden) while :class:`~oled_hf.offload.recorder.TraceRecorder` records every forward's
routing and every iteration event.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ...progress import add_quiet_argument, progress, quiet_library_bars
from . import LONG_CHECKPOINT, load_mix

SPLITS = ("held-out", "dev")


def split_questions(checkpoint, n_per_task: int, split: str = "held-out") -> list[str]:
    """Round-robin over the mix's tasks: task 1 #1, task 2 #1, ..., task 1 #2, ...; ``dev`` = training split."""
    from .tasks import heldout_problems, train_problems

    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    pick = heldout_problems if split == "held-out" else train_problems
    per_task = [pick(spec, n_per_task) for spec in load_mix(checkpoint)]
    return [problems[i].question for i in range(n_per_task) for problems in per_task]


def record_trace(out: str | Path, checkpoint: str | Path = LONG_CHECKPOINT, *, n_per_task: int = 25,
                 block_length: int | None = None, threshold: float | None = None, split: str = "held-out",
                 quiet: bool = False, overwrite: bool = False) -> dict:
    """Decode the held-out prompts and save their trace to ``out``; returns counts for the caller to print.

    ``out`` is checked before the model loads (:func:`~oled_hf.offload.recorder.check_trace_path`): an
    existing file is refused unless ``overwrite``, and a missing folder is refused, not created (a
    typo far more often than a wish for a new folder; minutes of decoding would end in a file
    nobody looks for). The trace is written whole or not at all.
    Says what it does on stderr as it goes (loading, how many prompts, a per-prompt bar on a terminal):
    a run takes minutes and was silent until its last line.
    """
    from ...offload.recorder import TraceRecorder, check_trace_path

    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    check_trace_path(out, overwrite=overwrite, field="out", flag="--overwrite")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    def say(text: str) -> None:
        if not quiet:
            print(f"traces: {text}", file=sys.stderr, flush=True)

    say(f"loading {checkpoint}")
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tok = AutoTokenizer.from_pretrained(checkpoint)
    gen = {k: v for k, v in dict(block_length=block_length, threshold=threshold).items() if v is not None}
    if "block_length" in gen:
        gen["steps"] = gen["block_length"]
    recorder = TraceRecorder(model, decoding=gen)
    recorder.writer.header["block_length"] = gen.get("block_length", recorder.writer.header["block_length"])
    questions = split_questions(checkpoint, n_per_task, split)
    say(f"recording {len(questions)} {split} prompts ({n_per_task} per task, block "
        f"{gen.get('block_length', 'of the generation config')}) -> {out}")
    new_tokens = 0
    for i, q in enumerate(progress(questions, desc=f"recording {split}", unit="prompt", quiet=quiet)):
        recorder.begin_sequence(i)
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            seq = model.generate(**ids, **gen)
        new_tokens += seq.shape[1] - ids["input_ids"].shape[1]
    recorder.writer.save(str(out))  # atomic, into the folder checked above (recorder.save would make folders)
    path = Path(out)
    recorder.detach()
    trace = recorder.writer.trace()
    return {"path": str(path), "prompts": len(questions), "forwards": trace.num_forwards, "new_tokens": new_tokens}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="trace file to write (torch.save format, see oled_hf/offload/trace.py)")
    parser.add_argument("--model", default=str(LONG_CHECKPOINT))
    parser.add_argument("--n-per-task", type=int, default=25)
    parser.add_argument("--block-length", type=int, default=None)
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--split", choices=SPLITS, default="held-out",
                        help="held-out problems (reports) or training problems (dev: policy tuning)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT file")
    add_quiet_argument(parser)
    args = parser.parse_args(argv)
    quiet_library_bars(args.quiet)  # no "Loading weights" bar in a log
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        r = record_trace(args.out, args.model, n_per_task=args.n_per_task, block_length=args.block_length,
                         threshold=args.threshold, split=args.split, quiet=args.quiet, overwrite=args.overwrite)
    except (ValueError, OSError) as err:  # a refused path, a failed write: one line, exit 2
        parser.error(str(err))
    print(f"recorded {r['prompts']} {args.split} prompts, {r['forwards']} forwards, {r['new_tokens']} new tokens "
          f"-> {r['path']}")


if __name__ == "__main__":
    main()
