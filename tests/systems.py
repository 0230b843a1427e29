"""The ``system=`` spelling of an old policy name, for tests that run the systems the old names ran.

``OffloadConfig(policy=P, layer_adaptive=A)`` is a deprecated alias of ``OffloadConfig(system=S)``
with ``S = system_for(P, A)``: the spelling its FutureWarning advises, which resolves to the very
same system (``tests/sim/test_system.py`` checks that for every alias, under ``pytest.warns``).
The prefetch part of ``prefetch``/``moe-infinity`` is left out: a live config runs none. Tests of the
aliases themselves build them with :func:`legacy_config`, which expects the warning.
"""

from __future__ import annotations

import dataclasses

import pytest

from oled_hf.offload.config import DEFAULT_POLICY, OffloadConfig
from oled_hf.offload.system import resolve_system, spelling


def system_for(policy: str, layer_adaptive: bool = True) -> str:
    named = resolve_system(None, policy=policy, layer_adaptive=layer_adaptive)
    return spelling(dataclasses.replace(named, prefetch="none"))


def legacy_config(**fields) -> OffloadConfig:
    """``OffloadConfig(**fields)`` through the deprecated aliases: where ``policy`` or ``layer_adaptive``
    differs from its default, the FutureWarning must come (and is caught here, so it is tested)."""
    aliased = fields.get("policy", DEFAULT_POLICY) != DEFAULT_POLICY or fields.get("layer_adaptive", True) is not True
    if not aliased:
        return OffloadConfig(**fields)
    with pytest.warns(FutureWarning, match="is deprecated and will be removed"):
        return OffloadConfig(**fields)
