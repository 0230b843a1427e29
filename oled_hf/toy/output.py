"""Where the toy trainers write: the output folder checked before training, the checkpoint saved in one move.

A training run takes minutes to hours; the rules of ``oled-moe make-tiny`` apply to its output
folder (:mod:`oled_hf.checkpoints.output_folder`), checked before the first step, and the
checkpoint (weights, tokenizer, report) is built in a temporary sibling folder and moved into
place, so a failure late in a run never leaves a partial folder or a half-replaced checkpoint.
Shared by ``oled_hf.toy.train`` and ``oled_hf.toy.long.train``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from ..checkpoints.output_folder import check_output_folder, detach_links, remove_stale_shards, safetensors_os_errors
from ..fileio import check_writable_folder, write_folder_atomically


def add_overwrite_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an OUT that already holds files, replacing the checkpoint's (default: "
                             "refuse a folder that is not empty, before training starts)")


def check_output(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """The checkpoint folder a training run will write, or a ValueError before the first step.

    :func:`~oled_hf.checkpoints.output_folder.check_output_folder`'s rules (a file, or a folder
    holding files without ``overwrite``, is refused), and the folder it would be made in (or it)
    must accept a new file: a read-only place found after hours of training loses the run.
    """
    out = check_output_folder(out_dir, overwrite=overwrite)
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    check_writable_folder(existing, field="OUT", path=out)
    return out


def built_tokenizer(build) -> tuple[object, dict[str, bytes]]:
    """``build(folder)``'s tokenizer and the bytes of the files it wrote, built in a temporary folder.

    The files go into the checkpoint with it at the end (:func:`save_checkpoint`), so nothing is
    written to the output folder while training runs; BPE training is too slow to repeat per save.
    """
    with tempfile.TemporaryDirectory(prefix="oled-toy-tokenizer.") as tmp:
        tokenizer = build(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    return tokenizer, files


def save_checkpoint(model, out: Path, files: dict[str, bytes | str], *, shard_size: str) -> None:
    """The model (``save_pretrained``) and ``files`` (name: content) as the checkpoint folder ``out``.

    Built in a temporary sibling folder and moved in (:func:`~oled_hf.fileio.write_folder_atomically`):
    a failure (full disk, ``ulimit -f``) after hours of training leaves no partial folder and an older
    checkpoint there as it was. Into a folder with files (``overwrite``, or a periodic save replaced by
    the final one) the files replace theirs by name, links there are detached, never written through,
    and shards the new index does not name are deleted, as in ``make_checkpoint``.
    """
    written: list[str] = []

    def build(folder: Path) -> None:
        with safetensors_os_errors():
            model.save_pretrained(folder, max_shard_size=shard_size)
        for name, content in files.items():
            (folder / name).write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        written.extend(p.name for p in folder.iterdir())

    write_folder_atomically(build, out, before_install=detach_links)
    remove_stale_shards(out, keep=written)
