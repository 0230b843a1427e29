"""oled-hf: expert offloading for mixture-of-experts diffusion LLMs (LLaDA2) in Transformers.

Importing the package registers the model with the Auto classes, so ``AutoModelForCausalLM``
and ``pipeline("text-generation")`` resolve ``oled_llada2`` checkpoints without remote code.

Why the import is lazy: torch and transformers take seconds to import (37 s for ``oled-moe
--version`` on a busy machine), and ``oled-moe --help`` or a tokenizer-only script needs
neither. So the names below are imported on first use (PEP 562), and the registration runs as
soon as transformers is imported: at once when it already is, else right after its import
finishes (a one-shot import hook, :class:`_RegisterOnImport`). Either way it has run before any
Auto class can be asked for an ``oled_llada2`` checkpoint.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any

# name -> the module that defines it; imported on first access (``oled_hf.OffloadConfig``)
_LAZY = {
    "OffloadConfig": "oled_hf.offload",
    "OledLLaDA2Config": "oled_hf.modeling",
    "OledLLaDA2ForDiffusionLM": "oled_hf.modeling",
    "OledLLaDA2Model": "oled_hf.modeling",
}
_MODELING = "oled_hf.modeling"  # modeling/, installed as oled_hf.modeling; imports only torch and transformers
_registered = False

__all__ = ["OffloadConfig", "OledLLaDA2Config", "OledLLaDA2ForDiffusionLM", "OledLLaDA2Model", "__version__",
           "register_auto_classes"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from .modeling.auto_map import CODE_VERSION

        return CODE_VERSION
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oled_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def register_auto_classes() -> None:
    """Register ``oled_llada2`` with AutoConfig, AutoModel and AutoModelForCausalLM (idempotent).

    Runs by itself when transformers is imported; calling it again does nothing new.
    """
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from .modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM, OledLLaDA2Model

    AutoConfig.register(OledLLaDA2Config.model_type, OledLLaDA2Config, exist_ok=True)
    AutoModel.register(OledLLaDA2Config, OledLLaDA2Model, exist_ok=True)
    AutoModelForCausalLM.register(OledLLaDA2Config, OledLLaDA2ForDiffusionLM, exist_ok=True)


def _initializing(name: str, finished: str | None) -> bool:
    """Whether module ``name`` is imported but its code has not finished running (``finished`` has)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return name != finished and bool(getattr(spec, "_initializing", False))


def _register_when_ready(finished: str | None = None) -> bool:
    """Register once transformers is imported and no module of ``oled_hf.modeling`` is half-imported.

    Registering imports the model's modules; doing it while one of them is still running its own
    imports (``modeling/events.py`` importing torch, which imported transformers) would import that
    module half-done. Then the registration waits for the outermost such import to finish.
    ``finished``: the module whose import has just run to its end. True when registered.
    """
    global _registered
    if _registered:
        return True
    if "transformers" not in sys.modules or _initializing("transformers", finished):
        return False
    if any(_initializing(name, finished) for name in list(sys.modules)
           if name == _MODELING or name.startswith(_MODELING + ".")):
        return False
    for finder in [f for f in sys.meta_path if isinstance(f, _RegisterOnImport)]:
        sys.meta_path.remove(finder)  # first, so the imports below do not come back here
    register_auto_classes()
    _registered = True
    return True


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for transformers and the model's modules, it asks the other finders
    and makes the loader try the registration when that module's code has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "transformers" and fullname != _MODELING and not fullname.startswith(_MODELING + "."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            run = loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                _register_when_ready(finished=fullname)

            loader.exec_module = exec_module  # this spec's own loader instance only
        return spec


if not _register_when_ready() and not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterOnImport())
