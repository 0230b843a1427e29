"""lm-eval integration: the ``oled_llada2`` model, offline tasks, offload parity.

Importing this package is cheap; :func:`register` imports lm-eval and registers the model (the
adapter module registers it at import). The entry points: ``oled-moe eval``, ``oled-lm-eval``
(:mod:`.lm_eval_cli`, lm-eval's own CLI with the model registered) and ``eval/parity.py``.
"""

from __future__ import annotations


def register() -> type:
    """Register ``oled_llada2`` with lm-eval's model registry and return the adapter class."""
    from .lm_eval_adapter import OledLLaDA2LM

    return OledLLaDA2LM


__all__ = ["register"]
