"""Held-out accuracy and decoding figures of a long-answer checkpoint, through ``model.generate``.

Per task: accuracy (greedy; the checker's pass rate for a task with many right answers, exact
match otherwise, ``tasks.check``), exact match against the reference answer, mean denoising
iterations per block, tokens committed per forward and blocks per answer, from the statistics
``generate`` returns (the decoder the CLI, the server and lm-eval use, with its prefix KV cache),
and the open tasks pooled (``open``). Printed for the shipped decoding setting
(block 16, threshold 0.95) and for LLaDA2.0-mini's block 32 at threshold 0.9:

    python -m oled_hf.toy.long.evaluate [CHECKPOINT] [--n 200] [--settings 16:0.95 32:0.9] [--json OUT]
                                        [--overwrite] [--update-report]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...fileio import check_new_file, check_writable_folder, write_text_atomically
from .data import LongEncoding
from .tasks import DEFAULT_MIX, OPEN_TASKS, Problem, TaskSpec, check, heldout_problems


@dataclass
class TaskFigures:
    """One task at one decoding setting; sums are kept so figures pool exactly across tasks."""

    task: str
    n: int = 0
    correct: int = 0  # answers ``tasks.check`` accepts (the checker for open tasks, else exact match)
    exact: int = 0  # answers equal to the reference answer
    iterations: int = 0  # denoising iterations, summed over answers
    blocks: int = 0  # blocks decoded, summed over answers
    tokens: int = 0  # tokens generated (EOS included), summed over answers

    def add(self, other: TaskFigures) -> None:
        for name in ("n", "correct", "exact", "iterations", "blocks", "tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def summary(self) -> dict:
        return {"task": self.task, "n": self.n, "accuracy": self.correct / max(1, self.n),
                "scored_by": scored_by(self.task),
                "exact_match": self.exact / max(1, self.n),
                "iterations_per_block": self.iterations / max(1, self.blocks),
                "tokens_per_forward": self.tokens / max(1, self.iterations),
                "blocks_per_answer": self.blocks / max(1, self.n)}


def scored_by(task: str) -> str:
    """How a task's accuracy is scored (pooled rows mix both)."""
    if task in OPEN_TASKS or task == "open":
        return "checker"
    return "both" if task == "all" else "exact match"


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def answer_text(tokenizer, ids: list[int], eos_id: int) -> str:
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return tokenizer.decode(ids, skip_special_tokens=False)


@torch.no_grad()
def decode(model, enc: LongEncoding, problems: list[Problem], *, block_length: int, threshold: float,
           max_new_tokens: int = 96, batch_size: int = 50) -> tuple[list[str], TaskFigures]:
    """Greedy ``generate`` on ``problems`` (batched, left-padded); answers and pooled figures."""
    texts: list[str] = []
    fig = TaskFigures(problems[0].task if problems else "")
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        ids, mask = left_pad(enc.prompt_ids([p.question for p in chunk]), enc.eos)
        out = model.generate(ids, attention_mask=mask, block_length=block_length, threshold=threshold,
                             steps=block_length, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_early_stop=True, return_dict_in_generate=True)
        new = out.sequences[:, ids.shape[1]:].tolist()
        for p, row in zip(chunk, new):
            text = answer_text(enc.tokenizer, row, enc.eos)
            texts.append(text)
            fig.correct += check(p, text)
            fig.exact += text == p.answer
            fig.tokens += min(len(row), (row.index(enc.eos) + 1) if enc.eos in row else len(row))
        fig.n += len(chunk)
        fig.iterations += int(out.iterations.sum())
        fig.blocks += int(out.blocks.sum())
    return texts, fig


def evaluate(model, tokenizer, mix: tuple[TaskSpec, ...] = DEFAULT_MIX, *, n: int = 200, block_length: int = 16,
             threshold: float = 0.95, batch_size: int = 50, examples: int = 2) -> dict:
    """Per-task and pooled figures on the first ``n`` held-out problems of each task."""
    enc = LongEncoding.from_tokenizer(tokenizer)
    overall, open_tasks = TaskFigures("all"), TaskFigures("open")
    tasks, shown = [], []
    for spec in mix:
        problems = heldout_problems(spec, n)
        texts, fig = decode(model, enc, problems, block_length=block_length, threshold=threshold,
                            batch_size=batch_size)
        tasks.append(fig.summary())
        overall.add(fig)
        if spec.name in OPEN_TASKS:
            open_tasks.add(fig)
        shown += [{"question": p.question, "expected": p.answer, "got": t} for p, t in zip(problems, texts)][:examples]
    result = {"block_length": block_length, "threshold": threshold, "tasks": tasks, "overall": overall.summary(),
              "examples": shown}
    if open_tasks.n:  # the open tasks pooled: where the hesitation has to come from choice
        result["open"] = open_tasks.summary()
    return result


def format_table(result: dict) -> str:
    lines = [f"block {result['block_length']}, threshold {result['threshold']}",
             f"{'task':<16} {'n':>5} {'accuracy':>9} {'exact':>7} {'iter/block':>11} {'tok/forward':>12} "
             f"{'blocks/answer':>14}"]
    for row in result["tasks"] + [result[k] for k in ("open", "overall") if k in result]:
        lines.append(f"{row['task']:<16} {row['n']:>5} {row['accuracy']:>9.3f} {row['exact_match']:>7.3f} "
                     f"{row['iterations_per_block']:>11.2f} "
                     f"{row['tokens_per_forward']:>12.2f} {row['blocks_per_answer']:>14.2f}")
    return "\n".join(lines)


def parse_setting(text: str) -> tuple[int, float]:
    block, _, thr = text.partition(":")
    return int(block), float(thr)


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oled_hf  # noqa: F401  (registers the Auto classes)

    from . import LONG_CHECKPOINT, load_mix

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", default=str(LONG_CHECKPOINT))
    parser.add_argument("--n", type=int, default=200, help="held-out problems per task")
    parser.add_argument("--settings", nargs="+", default=["16:0.95", "32:0.9"], help="block:threshold pairs")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures here (a new file unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    parser.add_argument("--update-report", action="store_true",
                        help="store the figures (and this command) as 'heldout' in the checkpoint's long_report.json")
    args = parser.parse_args(argv)
    try:  # refused now, not after minutes of decoding
        check_outputs(args.json, args.overwrite, Path(args.checkpoint) if args.update_report else None)
    except ValueError as err:
        parser.error(str(err))
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    results = []
    for setting in args.settings:
        block, thr = parse_setting(setting)
        r = evaluate(model, tokenizer, load_mix(args.checkpoint), n=args.n, block_length=block, threshold=thr,
                     batch_size=args.batch_size)
        results.append(r)
        print(format_table(r), flush=True)
        print()
    record = {"command": ["python", "-m", "oled_hf.toy.long.evaluate", *(argv if argv is not None else sys.argv[1:])],
              "n_per_task": args.n, "torch": torch.__version__, "results": results}
    if args.json:
        write_text_atomically(json.dumps(record, indent=2), args.json)
    if args.update_report:
        update_report(Path(args.checkpoint), record)


def check_outputs(json_path: str | None, overwrite: bool, checkpoint: Path | None) -> None:
    """Refuse an output this run could not write, before the model loads: an existing ``--json``
    without ``--overwrite`` (:func:`check_new_file`), a checkpoint folder that refuses a new file
    (``--update-report`` rewrites its report through a temporary file there)."""
    if json_path:
        check_new_file(json_path, overwrite=overwrite, field="--json", flag="--overwrite")
    if checkpoint is not None:
        check_writable_folder(checkpoint, field="--update-report: the checkpoint")


def update_report(checkpoint: Path, record: dict) -> Path:
    """``record`` as ``heldout`` in the checkpoint's report, the rest kept; the file replaced whole or not at all."""
    from . import REPORT_NAME

    path = checkpoint / REPORT_NAME
    report = json.loads(path.read_text()) if path.is_file() else {}
    report["heldout"] = record
    write_text_atomically(json.dumps(report, indent=2) + "\n", path)
    return path


__all__ = ["TaskFigures", "decode", "evaluate", "format_table", "asdict"]

if __name__ == "__main__":
    main()
