"""Report figures: no line drawn across unmeasured cache sizes, a legend only where it tells series apart,
and the note saying the times are simulated is on the figure."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oled_hf.sim import plots  # noqa: E402


def test_lines_join_only_neighbouring_measured_sizes():
    fig, ax = plt.subplots()
    plots._plot(ax, [15, 25, 40, 100], [10.0, 7.0, 5.0, 1.2], "oled")
    markers, *solid = ax.get_lines()
    assert markers.get_linestyle() == "None" and list(markers.get_xdata()) == [15, 25, 40, 100]
    assert [list(line.get_xdata()) for line in solid] == [[15, 25, 40]]  # 40% -> 100% is not a line
    plt.close(fig)


def test_bars_have_a_legend_only_for_several_series_and_carry_the_note(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(plots, "_finish", lambda fig, note, path: seen.append(
        (fig.axes[0].get_legend() is not None, note)) or plt.close(fig))
    plots.bars({"oled": {"ms": 1.0}, "lru-full": {"ms": 2.0}}, "ms", "(g)", tmp_path / "g.png", "measured here")
    plots.bars({"15%": {"a": 1.0, "b": 2.0}}, "x", "(c)", tmp_path / "c.png", "simulated")
    assert seen == [(False, "measured here"), (True, "simulated")]


def test_the_note_is_drawn_on_the_saved_figure(tmp_path, monkeypatch):
    texts = []
    real = plots._finish

    def spy(fig, note, path):
        out = real(fig, note, path)
        texts.extend(t.get_text() for t in fig.texts)
        return out

    monkeypatch.setattr(plots, "_finish", spy)
    path = plots.bars({"oled": {"ms": 1.0}}, "ms", "(g)", tmp_path / "g.png", "simulated time: H200")
    assert path.stat().st_size > 0 and texts == ["simulated time: H200"]
