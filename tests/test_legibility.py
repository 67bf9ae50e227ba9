"""The legibility checks themselves (tests/legibility.py) find what they are meant to find, in a
matplotlib figure and in an SVG one, so a figure test that passes them can fail."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from legibility import mpl_problems, svg_problems  # noqa: E402

from rlcluster_lab.lab.figures.mpl import MIN_PT, new_figure  # noqa: E402


def test_the_matplotlib_check_finds_small_text_clipped_labels_and_a_legend_over_bars():
    fig = new_figure(12.0, 3.0, layout=None)  # capped at the widest a notebook shows unshrunk
    assert fig.get_figwidth() == 10.0
    ax = fig.add_subplot()
    ax.bar([0, 1], [5, 5], gid="bar:x")
    ax.text(0.5, 2, "tiny", fontsize=MIN_PT - 1)
    ax.text(0.9, 2, "a label that runs far beyond the right-hand edge of the figure", fontsize=MIN_PT)
    ax.legend(handles=[ax.patches[0]], labels=["over the bars"], loc="center")
    found = " | ".join(mpl_problems(fig))
    assert "'tiny' at 8.0 pt" in found
    assert "runs past the figure's edge" in found
    assert "legend over bar:x" in found


def test_the_svg_check_finds_small_text_text_past_the_edge_and_a_label_wider_than_its_box():
    small = '<svg xmlns="http://www.w3.org/2000/svg" width="100" height="40" viewBox="0 0 100 40">'
    small += '<rect id="box" x="0" y="0" width="30" height="30" fill="red"/>'
    small += '<text x="15" y="20" font-size="11" text-anchor="middle">far too long a label</text></svg>'
    assert svg_problems(small) == [
        "'far too long a label' at 8.2 pt on screen",
        "'far too long a label' runs past the panel's edge",
        "'far too long a label' is wider than its box box",
    ]
