"""Installing the lab into a runtime that has its own JAX keeps that JAX.

A Colab or TPU-VM runtime comes with jax, jaxlib and (on a TPU) libtpu that belong together;
pip, asked for the lab, would replace them with the newest a dependency accepts (Flax 0.12.9 and
later need JAX 0.11.1). The notebooks' set-up cell pins the ones it finds. This test runs that
cell's own code in a fresh virtual environment that holds the oldest JAX the lab allows, with
pip's install made a dry run that writes its report, and reads what pip would install.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

REPO = pathlib.Path(__file__).resolve().parents[1]

# In the venv, the cell's ``%pip`` line (IPython's ``run_line_magic``) runs pip as a dry run: its
# ``{name}`` fields expanded from the cell's own variables as IPython expands them, the report
# written to REPORT; then the cell stops (nothing was installed to import).
FAKE_IPYTHON = r"""
import re, shlex, subprocess, sys
class _Shell:
    def run_line_magic(self, magic, line, _stack_depth=1):
        frame = sys._getframe(1)
        line = re.sub(r"\{([^{}]+)\}", lambda m: str(eval(m.group(1), frame.f_globals, frame.f_locals)), line)
        args = shlex.split(line)
        assert magic == "pip" and args[0] == "install", (magic, line)
        subprocess.run([sys.executable, "-m", "pip", *args, "--dry-run", "--report", REPORT], check=True)
        raise SystemExit(0)
get_ipython = _Shell
"""


def oldest_jax() -> str:
    """The lower bound of the lab's jax requirement, as a release (``0.10`` -> ``0.10.0``)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = next(re.fullmatch(r"jax>=([\d.]+)", d).group(1) for d in deps if d.startswith("jax>="))
    return ".".join((bound.split(".") + ["0", "0"])[:3])


def setup_cell_code() -> str:
    cell = next(c for c in nbformat.read(REPO / "notebooks/00_start_here.ipynb", 4).cells if c.cell_type == "code")
    return TransformerManager().transform_cell(cell.source)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.skipif(
    sys.version_info < (3, 12),
    reason="on Python 3.11 no newer Flax than the oldest JAX's exists: pip keeps that JAX either way "
    "(make test-newest runs this test on Python 3.12)",
)
def test_the_setup_cell_keeps_a_runtimes_older_jax(tmp_path):
    old = oldest_jax()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, f"jax=={old}", f"jaxlib=={old}"], check=True)
    report = tmp_path / "report.json"
    code = f"REPORT = {str(report)!r}\n" + FAKE_IPYTHON + setup_cell_code()
    env = {**os.environ, "RLCLUSTER_LAB_SOURCE": str(REPO), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    would_install = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "rlcluster-lab" in would_install
    assert not {"jax", "jaxlib", "libtpu"} & set(would_install), would_install
    held = subprocess.run([python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True)
    assert held.stdout.strip() == old
