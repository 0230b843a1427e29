"""``--model`` and ``--device``, spelled and explained the same by every command that loads a model."""

from __future__ import annotations

import argparse

MODEL_HELP = ("checkpoint folder with config.json, or a Hugging Face hub id ORG/NAME[@REVISION] (offline, "
              "HF_HUB_OFFLINE=1: from the local HF cache; a folder of the same name wins)")


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """``--model``, the same for every subcommand: a checkpoint folder or hub id, the trained toy when omitted."""
    p.add_argument("--model", default=None, help=f"{MODEL_HELP} (default: the shipped trained toy model)")


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto: cuda when available, else cpu; "
                   "benchmark also takes emulated (an asynchronous device emulated on the CPU) "
                   "(default: auto)")
