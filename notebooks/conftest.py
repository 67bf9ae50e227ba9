"""nbval runs the notebooks in this folder (``make test``). Notebook 10 compares the lab with
Tunix's own RLCluster and needs the optional [tunix] extra, which ``make test`` installs;
without it, its cells are skipped with the reason and the install command.

The notebooks run under nbval's lax mode unless told otherwise: outputs are compared only in
cells marked ``# NBVAL_CHECK_OUTPUT``. It is turned on here rather than in ``addopts`` so that
``-p no:nbval`` (no notebooks) works, and ``--nbval`` still compares every cell."""

import pytest

from rlcluster_lab.tunix import INSTALL_HINT, available

NEEDS_TUNIX = ("10_tunix_side_by_side.ipynb",)


def pytest_configure(config):
    if config.pluginmanager.has_plugin("nbval") and not config.getoption("nbval"):
        config.option.nbval_lax = True


def pytest_collection_modifyitems(config, items):
    if available():
        return
    skip = pytest.mark.skip(reason=f"this notebook needs Tunix, which is not installed: {INSTALL_HINT}")
    for item in items:
        if item.path.name in NEEDS_TUNIX:
            item.add_marker(skip)
