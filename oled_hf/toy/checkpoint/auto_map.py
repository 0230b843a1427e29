"""What a checkpoint folder needs so that ``trust_remote_code=True`` runs this model on its own.

Every checkpoint the project writes carries the files of this folder verbatim (``CODE_FILES``),
as the official LLaDA2 repos carry theirs: a Hub user with only torch and transformers installed
gets the same model and the same block-diffusion ``generate``. ``config.json`` records which
oled-hf release wrote the code (``oled_hf_version``), so a load can say when the checkpoint's code
and the installed package differ.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

# The oled-hf release this code belongs to; pyproject.toml reads the package version from here.
CODE_VERSION = "0.1.0"

AUTO_MAP = {
    "AutoConfig": "configuration_oled_llada2.OledLLaDA2Config",
    "AutoModel": "modeling_oled_llada2.OledLLaDA2Model",
    "AutoModelForCausalLM": "modeling_oled_llada2.OledLLaDA2ForDiffusionLM",
}

# The model's whole source: each file imports only torch, transformers and these siblings.
CODE_FILES = (
    "attention_mask.py",
    "auto_map.py",
    "cache.py",
    "canvas.py",
    "checkpoint_files.py",
    "commit.py",
    "configuration_oled_llada2.py",
    "events.py",
    "experts.py",
    "generation_oled_llada2.py",
    "modeling_oled_llada2.py",
    "params.py",
    "placement.py",
)


def write_model_code(directory: str | os.PathLike) -> None:
    """Copy the model's source files next to a checkpoint's ``config.json``.

    The source is this module's own folder: the installed package, or the Hub module cache
    when the model itself was loaded with ``trust_remote_code`` (transformers copies every file
    the model imports there). Each file is written whole or not at all (:func:`copy_atomically`).
    """
    here = Path(__file__).resolve().parent
    missing = [name for name in CODE_FILES if not (here / name).is_file()]
    if missing:
        raise FileNotFoundError(f"cannot write the model code: {', '.join(missing)} not found in {here}")
    for name in CODE_FILES:
        target = Path(directory, name)
        if target.resolve() != (here / name):
            copy_atomically(here / name, target)


def copy_atomically(source: Path, target: Path) -> None:
    """``source``'s bytes as ``target``: a temporary file beside it, then one rename.

    A reader never sees half a file, a failure (full disk, ``ulimit -f``) leaves no temporary file
    and the old ``target`` as it was, and a link at ``target`` is replaced, never written through
    (``shutil.copyfile`` would rewrite the file it points to). This is ``oled_hf.fileio``'s
    scheme, written out again because this folder is copied into every checkpoint and must run
    with only torch and transformers installed: it cannot import oled_hf.
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise OSError(err.errno, f"could not write {target}: {err.strerror or err}; nothing was written there") from err
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the code from other users
        os.replace(tmp, target)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise OSError(err.errno, f"could not write {target}: {err.strerror or err}; nothing was written "
                          "there") from err
        raise


def installed_oled_hf_version() -> str | None:
    """The installed oled-hf package's version, or None where only the checkpoint's code exists."""
    try:
        return metadata.version("oled-hf")
    except metadata.PackageNotFoundError:
        return None


def warn_on_code_version(config) -> None:
    """Log once when the oled-hf release that wrote a checkpoint differs from the installed one."""
    written = getattr(config, "oled_hf_version", None)
    installed = installed_oled_hf_version()
    if written is None or installed is None or written == installed:
        return
    from transformers.utils import logging  # here: the version lookup (`oled-moe --version`) needs no transformers

    logging.get_logger(__name__).warning(
        "this checkpoint's model code was written by oled-hf %s but oled-hf %s is installed; the model "
        "runs with the code it was loaded with (this file's: %s). Re-save the checkpoint with "
        "save_pretrained (or `oled-moe prepare`) to update its code.", written, installed, CODE_VERSION,
    )
