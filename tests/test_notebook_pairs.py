"""Every notebook has a MyST Markdown twin (notebooks/jupytext.toml), and the two agree.

The Markdown file holds the notebook's inputs as text, so a change to a notebook
can be reviewed as a diff. Refresh a pair with ``jupytext --sync notebooks/*.ipynb``.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PAIRS = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def test_every_notebook_and_only_notebooks_have_a_twin():
    twins = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.md"))
    assert [p.stem for p in twins] == [p.stem for p in PAIRS]
    assert PAIRS, "no notebooks found"


@pytest.mark.parametrize("ipynb", PAIRS, ids=lambda p: p.stem)
def test_markdown_twin_has_the_notebooks_cells(ipynb: Path):
    md = ipynb.with_suffix(".md")
    # The notebook as the Markdown format would write it (the same normalization the twin went through).
    expected = jupytext.reads(jupytext.writes(jupytext.read(ipynb), fmt="md:myst"), fmt="md:myst")
    got = jupytext.read(md)
    assert cells(got) == cells(expected), (
        f"{md.name} is out of date: run `jupytext --sync {ipynb.relative_to(NOTEBOOKS.parent)}`"
    )
