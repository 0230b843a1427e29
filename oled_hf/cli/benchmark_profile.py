"""``oled-moe benchmark --profile``: where a forward's time goes, per section.

The offloaded executor already times its own parts (``runtime.TIMERS``: the planner, the copies into
the cache, the expert GEMMs on cached experts, the misses computed on the host). What it cannot see
is the rest of the layer: attention, the router, the shared expert, the first dense layer, the
output head. Forward hooks on those modules time them from outside, so the model file stays free of
benchmark code and a resident model is profiled the same way. The hooks add two ``perf_counter``
calls per module call (a few microseconds per layer), small beside a forward at real width.

On a CPU-only host with the memory-mapped store, a "copy" is the page-in of an expert from the
shard files plus its copy into the RAM cache, and a miss computed on the host (``cpu``) reads its
weights from the mapped shards, so its time includes the page-ins it causes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# hooked sections, by module class name suffix (the model file's classes: ``OledLLaDA2Attention``, ...)
SECTIONS = ("attention", "routing", "shared_expert", "dense_mlp", "lm_head", "moe_block")
# the executor's timers, as the profile names them
EXECUTOR_SECTIONS = {"policy": "planner", "copy": "copies", "gpu": "experts_cached", "cpu": "experts_host",
                     "cpu_wait": "host_wait", "copy_wait": "copy_wait", "shadow": "shadow_caches"}


@dataclass
class SectionTimes:
    """Seconds per hooked section, summed over every forward since the last :meth:`reset`."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SECTIONS, 0.0))
    _started: dict[int, float] = field(default_factory=dict)
    _handles: list[Any] = field(default_factory=list)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(SECTIONS, 0.0)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def hook(self, module: Any, section: str) -> None:
        key = id(module)

        def pre(_module, _args):
            self._started[key] = time.perf_counter()

        def post(_module, _args, _out):
            self.seconds[section] += time.perf_counter() - self._started.pop(key)

        self._handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


def section_of(name: str, module: Any) -> str | None:
    """The section a module's time belongs to, or None (not hooked: it nests inside a hooked one or is tiny)."""
    kind = type(module).__name__
    if kind.endswith("Attention"):
        return "attention"
    if kind.endswith("SparseMoeBlock"):  # nests routing and the shared expert: only a resident model's experts use it
        return "moe_block"
    if kind.endswith("Gate"):
        return "routing"
    if name.endswith(".shared_experts"):
        return "shared_expert"
    if kind.endswith("MLP") and name.endswith(".mlp"):  # a dense layer's MLP (a MoE block's is SparseMoeBlock)
        return "dense_mlp"
    if name == "lm_head":
        return "lm_head"
    return None


def attach(model: Any) -> SectionTimes:
    """Hook every section of ``model``; the returned timer accumulates until :meth:`SectionTimes.remove`."""
    timer = SectionTimes()
    for name, module in model.named_modules():
        section = section_of(name, module)
        if section is not None:
            timer.hook(module, section)
    return timer


def split(timer: SectionTimes, executor_seconds: dict[str, float], total_s: float, forwards: int) -> dict[str, float]:
    """Milliseconds per forward per section; ``other`` is the total less every timed section.

    ``executor_seconds``: the offloaded runtime's timers summed over layers; empty for a resident
    model, whose routed experts are then ``experts_resident``: the MoE blocks' time less the router
    and the shared expert. ``experts_host`` runs
    on a worker thread beside the device's work; only ``host_wait`` of it is on the critical path,
    so ``experts_host`` is left out of the sum that gives ``other``.
    """
    per = 1e3 / max(forwards, 1)
    out = {k: v * per for k, v in timer.seconds.items()}
    block = out.pop("moe_block")
    if not executor_seconds and block:
        out["experts_resident"] = max(block - out["routing"] - out["shared_expert"], 0.0)
    for key, name in EXECUTOR_SECTIONS.items():
        if key in executor_seconds:
            out[name] = executor_seconds[key] * per
    serial = sum(v for k, v in out.items() if k != "experts_host")
    out["other"] = max(total_s * per - serial, 0.0)
    out["total"] = total_s * per
    return out


def format_split(name: str, profile: dict[str, float]) -> str:
    """One line: ``name: total X ms/forward = attention A + routing B + ...``."""
    parts = " + ".join(f"{k} {v:.2f}" for k, v in profile.items() if k != "total" and v > 0)
    return f"profile {name}: {profile['total']:.2f} ms/forward = {parts}"
