"""PNG plots of the report (matplotlib, imported lazily: the package works without it)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .report import Run


def _plt():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - the eval extra installs it
        raise RuntimeError("the report's plots need matplotlib: pip install 'oled-hf[eval]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(runs: list[Run], system: str, value) -> tuple[list[float], list[float]]:
    pts = sorted((r.pct, value(r)) for r in runs if r.system == system)
    return [p for p, _ in pts], [v for _, v in pts]


def tpot_and_utilization(runs: list[Run], systems: Iterable[str], title: str, path: Path) -> Path:
    """(a): TPOT / fused residency and U_slot vs cache size, one line per system."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in systems:
        x, y = _series(runs, s, lambda r: r.result.ratio_to_full)
        if x:
            a.plot(x, y, marker="o", label=s)
            x, y = _series(runs, s, lambda r: r.result.u_slot)
            b.plot(x, y, marker="o", label=s)
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    bound = sorted({(r.pct, r.bound_ratio) for r in runs if r.bound_ratio})
    if bound:
        a.plot([p for p, _ in bound], [b for _, b in bound], color="k", lw=1.2, ls=":", label="physical bound")
    a.set(xlabel="cache size (% of expert bytes)", ylabel="TPOT / fused residency", title=title, yscale="log")
    b.set(xlabel="cache size (% of expert bytes)", ylabel="U_slot (hits per slot per access)", title="utilization")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gap_to_ideal(runs: list[Run], systems: Iterable[str], title: str, path: Path) -> Path:
    """(b): hit rate / Belady MIN (demand/bypass bound) and TPOT / the physical bound vs cache size."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for s in systems:
        x, y = _series([r for r in runs if r.bound_hit_rate], s, lambda r: r.result.hit_rate / r.bound_hit_rate)
        if x:
            ax.plot(x, y, marker="o", label=s)
        x, y = _series([r for r in runs if r.bound_ratio], s, lambda r: r.x_bound)
        if x:
            bx.plot(x, y, marker="o", label=s)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    bx.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set(xlabel="cache size (%)", ylabel="hit rate / Belady MIN", title=title)
    bx.set(xlabel="cache size (%)", ylabel="TPOT / physical bound", title="distance to the physical bound")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars(values: dict[str, dict[str, float]], ylabel: str, title: str, path: Path) -> Path:
    """Grouped bars: ``values[group][series]``."""
    plt = _plt()
    groups = list(values)
    series = list(dict.fromkeys(k for g in values.values() for k in g))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) / 3), 4))
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [values[g].get(s, 0.0) for g in groups], width, label=s)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=7, rotation=20)
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
