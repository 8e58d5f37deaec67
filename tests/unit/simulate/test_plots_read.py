"""Plots people read: a legend naming each line, and axes that say their units."""

from __future__ import annotations

import pytest

from tests.unit.simulate.test_placement import SLICE, simulate

pytestmark = pytest.mark.unit


def test_the_placement_timeline_has_a_legend_and_units():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from calque.simulate.placement_report import timeline_figure

    fig = timeline_figure(simulate(str(SLICE), "g7e.2xlarge=2", "mps:2", timeline=True, compare=False))
    try:
        ax, ax2 = fig.axes
        legend = ax.get_legend()
        assert legend is not None
        assert [t.get_text() for t in legend.get_texts()] == ["busy share of the GPUs", "jobs waiting"]
        assert "(days)" in ax.get_xlabel()
        assert "(0 to 1)" in ax.get_ylabel()
        assert "(count)" in ax2.get_ylabel()
    finally:
        plt.close(fig)


def test_the_pool_plot_has_a_legend_and_units(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from calque.simulate import pool

    kept = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: kept.append(fig))
    monkeypatch.setattr(plt, "close", lambda fig=None: None)

    class Result:
        timeline = [(0.0, 3, 0), (60.0, 1, 1), (120.0, 0, 1)]
        policy = "scaler"
        paid_per_busy = 1.5

        def wait_percentile(self, p):
            return 42.0

    pool.plot(Result(), tmp_path / "p.png")  # type: ignore[arg-type]
    (ax,) = kept[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["backlog (visible + in flight)", "workers"]
    assert "(minutes)" in ax.get_xlabel()
    assert "(count)" in ax.get_ylabel()
