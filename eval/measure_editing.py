"""LLaDA2.1 token editing on our checkpoints: accuracy, tokens per forward, edits per block.

    .venv/bin/python eval/measure_editing.py [--model oled_hf/toy/checkpoint] [--n 200] [--threads 1]

For each decoding (the checkpoint's own generation_config, i.e. LLaDA2.0 without editing; the
``quality`` (threshold 0.7, editing 0.5) and ``speed`` (threshold 0.5, editing 0.0) presets, both
with 16 post steps and the LLaDA2.1 commit rule; ``editing_threshold`` overrides given with ``--edit``) it
generates answers to the trained toy's held-out additions through the chat template (batched:
rows decode independently, so a batch gives each row its single-prompt tokens) and prints exact-
match accuracy (only meaningful for the trained toy), generated tokens per denoising forward,
total model forwards, edits, and the share of blocks with at least one edit. The shipped toy's
200 prompts take about a minute on one CPU thread.
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import oled_hf  # noqa: F401  (registers the Auto classes)
from oled_hf.toy.data import answer_text, heldout_pairs, question_text

TOY = "oled_hf/toy/checkpoint"


def decodings(extra_edits: list[float]) -> dict[str, dict]:
    runs = {"llada2.0 (generation_config)": {}, "quality": {"decoding": "quality"}, "speed": {"decoding": "speed"}}
    for e in extra_edits:
        runs[f"edit {e:g} (threshold from generation_config)"] = {"editing_threshold": e}
    return runs


@torch.no_grad()
def measure(model, tok, pairs, kwargs: dict, batch_size: int, max_new_tokens: int | None) -> dict:
    tok.padding_side = "left"
    correct = new_tokens = iterations = forwards = edits = blocks = edited_blocks = 0
    eos = model.generation_config.eos_token_id
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        batch = tok.apply_chat_template([[{"role": "user", "content": question_text(a, b)}] for a, b in chunk],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                        padding=True)
        extra = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        out = model.generate(**batch, return_dict_in_generate=True, **extra, **kwargs)
        width = batch["input_ids"].shape[1]
        for r, (a, b) in enumerate(chunk):
            ids = out.sequences[r, width:].tolist()
            ids = ids[: ids.index(eos)] if eos in ids else ids
            correct += tok.decode(ids, skip_special_tokens=True).strip() == answer_text(a, b)
        new_tokens += int((out.tokens_per_forward * out.iterations).round().sum())
        iterations += int(out.iterations.sum())
        forwards += int(out.forwards)
        edits += int(out.edits.sum())
        per_block = out.edits_per_block
        decoded = torch.arange(per_block.shape[1])[None, :] < out.blocks[:, None]
        blocks += int(decoded.sum())
        edited_blocks += int(((per_block > 0) & decoded).sum())
    n = len(pairs)
    return {"accuracy": correct / n, "tokens_per_forward": new_tokens / max(iterations, 1),
            "iterations": iterations, "forwards": forwards, "edits": edits,
            "edits_per_block": edits / max(blocks, 1), "blocks_with_edits": edited_blocks / max(blocks, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=TOY)
    parser.add_argument("--n", type=int, default=200, help="held-out additions to answer")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--edit", type=float, nargs="*", default=[], help="extra editing_threshold runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tok = AutoTokenizer.from_pretrained(args.model)
    pairs = heldout_pairs(args.n)
    rows = {name: measure(model, tok, pairs, kw, args.batch_size, args.max_new_tokens)
            for name, kw in decodings(args.edit).items()}
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.model}: {args.n} held-out prompts")
    print(f"{'decoding':44s} {'acc':>6s} {'tok/fwd':>8s} {'iters':>6s} {'fwds':>6s} {'edits':>6s} "
          f"{'ed/blk':>7s} {'blk w/ ed':>9s}")
    for name, r in rows.items():
        print(f"{name:44s} {r['accuracy']:6.3f} {r['tokens_per_forward']:8.3f} {r['iterations']:6d} "
              f"{r['forwards']:6d} {r['edits']:6d} {r['edits_per_block']:7.3f} {r['blocks_with_edits']:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
