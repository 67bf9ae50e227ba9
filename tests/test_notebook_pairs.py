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


# What JupyterLab writes when it opens a notebook with the ipykernel kernel, and the filter
# that keeps the twins free of what differs from one machine or jupytext version to the next.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
TWIN_FILTER = "-kernelspec,-jupytext.text_representation.jupytext_version"


def test_the_kernelspec_stored_is_the_one_jupyterlab_writes():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert {"display_name": spec.display_name, "language": spec.language, "name": "python3"} == KERNELSPEC


@pytest.mark.parametrize("ipynb", PAIRS, ids=lambda p: p.stem)
def test_opening_a_notebook_rewrites_none_of_its_metadata(ipynb: Path):
    # JupyterLab sets the kernelspec from the kernel it starts, and jupytext writes the twin's
    # header on every save: what is stored must be what they write (tests/browser saves each
    # notebook in JupyterLab and compares the files byte for byte).
    metadata = jupytext.read(ipynb).metadata
    assert metadata["kernelspec"] == KERNELSPEC
    assert metadata["jupytext"]["notebook_metadata_filter"] == TWIN_FILTER
    header = ipynb.with_suffix(".md").read_text().split("\n---\n", 1)[0].splitlines()
    assert not any(line.startswith(("kernelspec:", "  jupytext_version:", "    jupytext_version:")) for line in header)
