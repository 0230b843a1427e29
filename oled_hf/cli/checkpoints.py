"""``make-tiny`` and ``prepare``: checkpoints the project makes or adapts."""

from __future__ import annotations

import argparse
import time

from ..checkpoints.families import FAMILIES
from ..checkpoints.presets import PRESETS
from ..progress import add_quiet_argument
from .common import add_command


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "make-tiny", "write a random-weight LLaDA2 checkpoint (official layout)", configure_make_tiny)
    add_command(sub, "prepare", "link an official LLaDA2 checkpoint so it loads as oled-hf classes", configure_prepare)


def configure_make_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="output folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="model shape: tiny for tests, small for benchmarks, mini for LLaDA2.0-mini's own "
                        "dimensions (16B parameters, ~32 GB in bf16, written streaming)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="weight dtype (default: bfloat16 for mini, float32 otherwise)")
    p.add_argument("--layers", "--num-hidden-layers", dest="num_hidden_layers", type=int, default=None,
                   help="number of decoder layers (the first is dense): cuts the depth, keeps every other dimension "
                        "(default: the preset's)")
    p.add_argument("--family", choices=FAMILIES, default="llada2.0",
                   help="decoding defaults in generation_config.json: llada2.1 = token editing (quality preset)")
    for field in ("hidden_size", "num_experts", "num_experts_per_tok", "n_group",
                  "topk_group", "moe_intermediate_size", "intermediate_size", "vocab_size"):
        p.add_argument(f"--{field.replace('_', '-')}", dest=field, type=int, default=None,
                       help=f"override the preset's {field} (default: the preset's)")
    add_overwrite_argument(p)
    add_quiet_argument(p)
    p.set_defaults(func=make_tiny)


def configure_prepare(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="official checkpoint folder (model_type llada2_moe), or its Hugging Face hub id "
                               "ORG/NAME[@REVISION] (offline, HF_HUB_OFFLINE=1: from the local HF cache)")
    p.add_argument("out", help="output folder (config, model code, symlinks to SRC's weights)")
    p.add_argument("--family", choices=FAMILIES, default=None,
                   help="decoding defaults (default: llada2.1 when SRC's name says LLaDA2.1, else llada2.0)")
    add_overwrite_argument(p)
    p.set_defaults(func=prepare)


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="write into an output folder that already holds files, replacing them "
                        "(default: refuse a folder that is not empty)")


def make_tiny(args: argparse.Namespace) -> int:
    from ..checkpoints.factory import make_checkpoint

    overrides = {k: v for k, v in vars(args).items() if k in PRESETS[args.preset] and v is not None}
    if args.num_hidden_layers is not None and args.num_hidden_layers < 1:
        raise ValueError(f"--layers {args.num_hidden_layers} is invalid: must be an integer >= 1")
    start = time.perf_counter()
    out = make_checkpoint(args.out, preset=args.preset, seed=args.seed, dtype=args.dtype, family=args.family,
                          overwrite=args.overwrite, quiet=args.quiet, **overrides)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"wrote {args.preset} checkpoint ({args.family} decoding) to {out}: {size / 2**30:.2f} GiB of weights "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


def prepare(args: argparse.Namespace) -> int:
    from ..checkpoints.hub import expand_user
    from ..checkpoints.prepare import prepare_checkpoint, resolve_source

    src = resolve_source(args.src)  # a hub id: its snapshot, resolved once
    out = prepare_checkpoint(src, args.out, family=args.family, overwrite=args.overwrite)
    where = args.src if expand_user(args.src, "SRC").resolve() == src else f"{args.src}, {src}"
    print(f"prepared {out} (weights and tokenizer linked from {where})")
    return 0
