"""PNG plots of the report (matplotlib, imported lazily: the package works without it).

Every figure carries ``note`` under its title: the times are simulated (which expert size, which
GPU and link) and the trace's depth, so a figure read alone is not taken for a measurement. Lines
join only neighbouring measured cache sizes (at most ``MAX_GAP`` points apart); a size measured
alone (100%, full residency) is a marker, not the end of a line drawn across sizes nobody ran.
"""

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


MAX_GAP = 30  # percentage points: a wider gap between measured sizes is not drawn as a line


def _plot(ax, x: list[float], y: list[float], label: str) -> None:
    """Markers at every measured size; solid lines only between sizes at most ``MAX_GAP`` apart."""
    line = ax.plot(x, y, marker="o", ls="none", label=label)[0]
    start = 0
    for i in range(1, len(x) + 1):
        if i == len(x) or x[i] - x[i - 1] > MAX_GAP:
            if i - start > 1:
                ax.plot(x[start:i], y[start:i], color=line.get_color())
            start = i


def _finish(fig, note: str, path: Path) -> Path:
    if note:
        fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.05 if note else 0, 1, 1))
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _series(runs: list[Run], system: str, value) -> tuple[list[float], list[float]]:
    pts = sorted((r.pct, value(r)) for r in runs if r.system == system)
    return [p for p, _ in pts], [v for _, v in pts]


def tpot_and_utilization(runs: list[Run], systems: Iterable[str], title: str, path: Path, note: str = "") -> Path:
    """(a): TPOT / fused residency and U_slot vs cache size, one line per system."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for s in systems:
        x, y = _series(runs, s, lambda r: r.result.ratio_to_full)
        if x:
            _plot(a, x, y, s)
            x, y = _series(runs, s, lambda r: r.result.u_slot)
            _plot(b, x, y, s)
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    bound = sorted({(r.pct, r.bound_ratio) for r in runs if r.bound_ratio})
    if bound:
        a.plot([p for p, _ in bound], [b for _, b in bound], color="k", lw=1.2, ls=":", marker="x",
               label="valid LP bound")
    a.set(xlabel="cache size (% of expert bytes)", ylabel="simulated TPOT / fused residency", title=title,
          yscale="log")
    b.set(xlabel="cache size (% of expert bytes)", ylabel="U_slot (hits per slot per access)", title="utilization")
    a.legend(fontsize=7)
    return _finish(fig, note, path)


def gap_to_ideal(runs: list[Run], systems: Iterable[str], title: str, path: Path, note: str = "") -> Path:
    """(b): hit rate / Belady MIN (demand/bypass bound) and TPOT / the valid LP bound vs cache size."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for s in systems:
        x, y = _series([r for r in runs if r.bound_hit_rate], s, lambda r: r.result.hit_rate / r.bound_hit_rate)
        if x:
            _plot(ax, x, y, s)
        x, y = _series([r for r in runs if r.bound_ratio], s, lambda r: r.x_bound)
        if x:
            _plot(bx, x, y, s)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    bx.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set(xlabel="cache size (%)", ylabel="hit rate / Belady MIN", title=title)
    bx.set(xlabel="cache size (%)", ylabel="simulated TPOT / valid LP bound", title="distance to the valid LP bound")
    ax.legend(fontsize=7)
    return _finish(fig, note, path)


def bars(values: dict[str, dict[str, float]], ylabel: str, title: str, path: Path, note: str = "") -> Path:
    """Grouped bars: ``values[group][series]``; a legend only when there is more than one series."""
    plt = _plt()
    groups = list(values)
    series = list(dict.fromkeys(k for g in values.values() for k in g))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) / 3), 4))
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [values[g].get(s, 0.0) for g in groups], width, label=s)
    long_names = max(map(len, groups), default=0) > 8
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=9,
                  rotation=25 if long_names else 0, ha="right" if long_names else "center")
    ax.set(ylabel=ylabel, title=title)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return _finish(fig, note, path)
