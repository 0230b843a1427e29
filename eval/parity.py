"""Offload parity on the toy held-out split: accuracy and every answer identical with and without offloading.

    python eval/parity.py [--model DIR] [--limit N | --full] [--policies oled lru ...] [--batch-size 32]
    python eval/parity.py --long [--limit 20]     # the long-answer toy: its 4 tasks at 10% and 40%

For each policy (oled, lru, lfu, static, tide) at ~40% of routed-expert bytes and at 1 slot per MoE
layer, runs lm-eval's ``toy_addition`` through ``oled_llada2`` and compares every generated answer
with the fully resident model. Default data: the committed 500 held-out problems
(eval/tasks/toy_addition/data); ``--full`` writes and uses the complete held-out split (~25k).
``--long`` checks the long-answer toy (oled_hf/toy/long/checkpoint) on its four lm-eval tasks
(long_reverse_labeled, long_spell_labeled, long_count, long_add) at 10% and 40% of routed-expert bytes;
with ``--model`` (the deep toy, oled_hf/toy/deep/checkpoint), on the tasks of that model's own mix.
Exit status 1 when any row differs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from oled_hf.evaluation.parity import (
        DEFAULT_BUDGETS,
        LONG_BUDGETS,
        LONG_TASKS,
        POLICIES,
        TASK,
        format_table,
        full_split_files,
        run_parity,
    )

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint (default: the toy checkpoint)")
    parser.add_argument("--limit", type=int, default=None, help="first N held-out problems")
    parser.add_argument("--full", action="store_true", help="the complete held-out split instead of the 500")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--cache-ratio", type=float, default=dict(DEFAULT_BUDGETS)["cache_ratio"])
    parser.add_argument("--cache-size", type=int, default=dict(DEFAULT_BUDGETS)["cache_size"])
    parser.add_argument("--long", action="store_true",
                        help="the long-answer toy and its tasks, at 10%% and 40%% of expert bytes")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks: tuple[str, ...] = (TASK,)
    budgets = [("cache_ratio", args.cache_ratio), ("cache_size", args.cache_size)]
    if args.long:
        from oled_hf.toy.long import LONG_CHECKPOINT

        tasks, budgets = LONG_TASKS, list(LONG_BUDGETS)
        if args.full:
            parser.error("--full is for the 3-digit toy; the long tasks ship their 200 held-out problems each")
    if args.model:
        model = args.model
        if args.long:  # the lm-eval tasks of the model's own mix (the deep toy's differ from the shipped long toy's)
            from oled_hf.toy.long import load_mix

            tasks = tuple(f"long_{spec.name}" for spec in load_mix(model))
    elif args.long:
        model = str(LONG_CHECKPOINT)
    else:
        from oled_hf.cli.eval import default_model

        model = str(default_model())
    with tempfile.TemporaryDirectory() as tmp:
        data_files = full_split_files(Path(tmp)) if args.full else None
        reference, rows = run_parity(model, policies=args.policies, budgets=budgets, limit=args.limit,
                                     batch_size=args.batch_size, data_files=data_files, tasks=tasks,
                                     echo=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"model: {model}; problems: {len(reference.answers)}; threads: {torch.get_num_threads()}")
    print(format_table(reference, rows))
    ok = all(r.identical for r in rows)
    print("parity: " + ("every answer identical" if ok else "DIFFERENCES"))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
