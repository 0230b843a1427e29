"""``oled-moe prepare SRC OUT``: make an official LLaDA2 checkpoint load as our classes.

OUT gets a ``config.json`` naming our classes (every official field kept), the model's code files,
a ``generation_config.json`` with block-diffusion defaults (LLaDA2.1 folders, recognised by name
or given ``family="llada2.1"``, get the 2.1 editing preset), and *symlinks* to SRC's weight shards
and tokenizer files: a 16B checkpoint is never copied.

OUT must lie apart from SRC (neither the same folder nor one inside the other) and be new or
empty unless ``overwrite=True``: linking SRC's files into SRC itself once turned every shard
into a symlink to itself. Nothing in SRC is ever written, unlinked or replaced, every check
runs before the first write, and OUT's files are made in a temporary sibling folder and renamed
into place, so a failure half-way (full disk) leaves OUT as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..fileio import write_folder_atomically
from ..modeling.auto_map import AUTO_MAP, CODE_FILES, CODE_VERSION, write_model_code
from ..modeling.configuration_oled_llada2 import OledLLaDA2Config
from .families import check_family, decoding_defaults, detect_family
from .hub import expand_user
from .output_folder import check_output_folder

LINKED_PATTERNS = ("*.safetensors", "model.safetensors.index.json", "tokenizer*", "special_tokens_map.json",
                   "chat_template.jinja", "vocab*", "merges.txt", "added_tokens.json")
GENERATION_DEFAULTS = dict(block_length=32, threshold=0.95, steps=32, max_new_tokens=256, do_sample=False,
                           eos_early_stop=True)
WRITTEN_FILES = ("config.json", "generation_config.json", *CODE_FILES)


def _read_source_config(src: Path) -> dict:
    path = src / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{src} has no config.json: expected a LLaDA2 checkpoint folder")
    config = json.loads(path.read_text())
    if config.get("model_type") not in ("llada2_moe", OledLLaDA2Config.model_type):
        raise ValueError(
            f"{path} has model_type={config.get('model_type')!r}; prepare accepts 'llada2_moe' "
            f"(official LLaDA2) or {OledLLaDA2Config.model_type!r}"
        )
    if not any(src.glob("*.safetensors")):
        raise FileNotFoundError(f"{src} has no *.safetensors weight files")
    return config


def prepare_checkpoint(src: str | os.PathLike, out: str | os.PathLike, family: str | None = None, *,
                       overwrite: bool = False) -> Path:
    """``family`` (``llada2.0`` / ``llada2.1``) overrides the one recognised from SRC's name.

    ``overwrite=True`` lets OUT be a folder that already holds files (a previous ``prepare`` of SRC,
    say): the names prepare writes are replaced there, links are replaced as links, and nothing they
    point to is written. OUT inside, around or equal to SRC is refused either way.

    SRC may be a Hugging Face hub id (``inclusionAI/LLaDA2.0-mini[@REVISION]``): its snapshot in
    the local HF cache is linked (downloaded first when online; offline, only the cache answers).
    A folder of that spelling wins.
    """
    src, out = resolve_source(src), expand_user(out, "OUT")
    config = _read_source_config(src)
    family = detect_family(src, config) if family is None else check_family(family)
    config.pop("auto_map", None)
    # Validates every field and fills ours (mask id, etc.) with LLaDA2's defaults.
    ours = OledLLaDA2Config.from_dict(config)
    check_apart(src, out)
    linked = linked_files(src)
    check_output_folder(out, overwrite=overwrite)
    check_targets(src, out, [*WRITTEN_FILES, *(f.name for f in linked)])
    serialised = ours.to_dict()
    serialised["architectures"] = ["OledLLaDA2ForDiffusionLM"]
    serialised["auto_map"] = dict(AUTO_MAP)
    serialised["oled_hf_version"] = CODE_VERSION

    def build(folder: Path) -> None:  # a new temporary folder: every name below is created, none replaced
        (folder / "config.json").write_text(json.dumps(serialised, indent=2, sort_keys=True, default=str) + "\n")
        write_model_code(folder)
        for file in linked:
            (folder / file.name).symlink_to(file)
        _write_generation_config(src, folder, ours, family)

    # built beside OUT, then renamed in: a failure half-way leaves OUT as it was; an entry of OUT
    # with a written name (a link included) is replaced by rename, so nothing it points to is written
    write_folder_atomically(build, out)
    return out


def resolve_source(src: str | os.PathLike) -> Path:
    """SRC as a folder (a hub id: its cache snapshot), or a ValueError naming SRC and what it is not."""
    from .hub import EXAMPLE_ID, resolve_checkpoint

    folder = resolve_checkpoint(src, "SRC")
    if not folder.exists():
        raise ValueError(f"SRC {src}: no such folder and not a Hugging Face hub id (ORG/NAME[@REVISION], "
                         f"e.g. {EXAMPLE_ID})")
    return folder.resolve()


def linked_files(src: Path) -> list[Path]:
    """SRC's weight and tokenizer files that OUT links to, each once, in a stable order."""
    found = {file.name: file for pattern in LINKED_PATTERNS for file in sorted(src.glob(pattern))}
    return [file for name, file in found.items() if name not in WRITTEN_FILES]


def _contains(outer: Path, inner: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies inside it, by resolved path or (bind mounts, case-folding
    file systems) by being the same folder on disk."""
    inner, outer = inner.resolve(), outer.resolve()
    if inner == outer or outer in inner.parents:
        return True
    if not outer.exists():
        return False
    return any(p.exists() and os.path.samefile(p, outer) for p in (inner, *inner.parents))


def check_apart(src: Path, out: Path) -> None:
    """A ValueError unless OUT and SRC are separate folders, neither inside the other.

    OUT gets symlinks named as SRC's files: inside SRC they would replace SRC's own files (or
    point at themselves); around SRC, OUT's config and links sit over the user's tree.
    """
    if _contains(src, out) and _contains(out, src):
        raise ValueError(f"OUT {out} is the same folder as SRC {src}: prepare would replace SRC's weights and "
                         f"tokenizer with links to themselves; give a new folder outside SRC")
    if _contains(src, out):
        raise ValueError(f"OUT {out} is inside SRC {src}; give a new folder outside SRC (prepare never writes "
                         f"into the checkpoint it links)")
    if _contains(out, src):
        raise ValueError(f"SRC {src} is inside OUT {out}; give a new folder that does not contain SRC")


def check_targets(src: Path, out: Path, names: list[str]) -> None:
    """A ValueError if any path prepare would replace in OUT is a folder or one of SRC's files.

    An OUT entry with the inode of a source file is a hard link of it or the source itself seen
    through another path (a bind mount): the two cannot be told apart, so such a target is refused,
    never unlinked or written (writing ``config.json`` into a hard link would rewrite SRC's).
    """
    if not out.is_dir():
        return
    sources = {_file_id(file): file for file in src.iterdir() if file.is_file()}
    for name in names:
        target = out / name
        if target.is_symlink():
            continue  # replaced as a link; what it points to is never opened
        if target.is_dir():
            raise ValueError(f"OUT {out} has a folder {name} where prepare writes a file; move it or give "
                             f"another OUT")
        if target.exists() and _file_id(target) in sources:
            raise ValueError(f"OUT {target} is the same file as SRC's {sources[_file_id(target)].name} (a hard "
                             f"link): prepare never replaces a source file; remove {target} or give another OUT")


def _file_id(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_dev, info.st_ino


def _write_generation_config(src: Path, out: Path, config: OledLLaDA2Config, family: str) -> None:
    values = {**GENERATION_DEFAULTS, **decoding_defaults(family)}
    official = src / "generation_config.json"
    if official.is_file():
        values.update({k: v for k, v in json.loads(official.read_text()).items() if k != "transformers_version"})
    values.update(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                  mask_token_id=config.mask_token_id)
    (out / "generation_config.json").write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
