"""The notebooks' shared set-up: which devices it picks, what it says, and when it refuses."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import types

import jax
import nbformat
import pytest

import rlcluster_lab as rl
from rlcluster_lab.lab import setup as notebook

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_setup_uses_the_eight_simulated_cpu_devices_and_says_so(capsys):
    lab = rl.setup(8)
    assert lab.simulated and lab.platform == "cpu" and lab.accelerator is None
    assert list(lab.devices) == jax.devices()
    assert lab.reachable == ("colocated", "reshaped", "split")
    out = capsys.readouterr().out
    assert "8 simulated CPU device(s)" in out and "reachable layouts: colocated, reshaped, split" in out


def test_setup_fails_loudly_when_the_backend_already_started_with_another_count():
    with pytest.raises(rl.DeviceSetupError, match="restart the kernel"):
        rl.setup(4, quiet=True)


@pytest.mark.cluster
def test_setup_in_a_fresh_process_sets_the_count_and_lists_reachable_layouts():
    code = (
        "import json, rlcluster_lab as rl\n"
        "a = rl.setup(4, quiet=True)\n"
        "print(json.dumps({'n': a.device_count, 'reachable': a.reachable, 'summary': a.summary()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    assert data["n"] == 4 and data["reachable"] == ["colocated", "reshaped", "split"]
    code = "import rlcluster_lab as rl\nrl.setup(1)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "reachable layouts: colocated" in out and "not reachable here: reshaped, split" in out


def test_a_single_chip_gets_simulated_cpu_devices_beside_it():
    cpus = jax.devices()
    chip = cpus[:1]  # stands in for one accelerator chip: only the colocated layout fits on it
    devices, simulated, notes = notebook.choose_devices(chip, cpus, 8)
    assert devices == cpus and simulated
    assert "can reach only: colocated" in notes[0] and "8 simulated CPU devices beside it" in notes[0]


def test_a_single_chip_without_cpu_devices_keeps_the_chip_and_says_how_to_get_more():
    cpus = jax.devices()
    devices, simulated, notes = notebook.choose_devices(cpus[:1], cpus[:1], 8)
    assert devices == cpus[:1] and not simulated
    assert "restart the runtime" in notes[0]


def test_accelerators_that_reach_every_layout_are_used_as_they_are():
    accel = jax.devices()  # eight devices form every standard layout
    devices, simulated, notes = notebook.choose_devices(accel, [], 8)
    assert devices == accel and not simulated and notes == []
    assert notebook.choose_devices([], accel, 8) == (accel, True, [])


def test_colab_turns_on_the_widget_manager(monkeypatch):
    calls = []
    output = types.ModuleType("google.colab.output")
    output.enable_custom_widget_manager = lambda: calls.append("on")
    colab = types.ModuleType("google.colab")
    colab.output = output
    google = types.ModuleType("google")
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    lab = rl.setup(8, quiet=True)
    assert lab.colab and calls == ["on"]
    assert "running in Colab" in lab.summary()


def test_setup_makes_a_returned_figure_display_as_png():
    from IPython.core.interactiveshell import InteractiveShell
    from matplotlib.figure import Figure

    shell = InteractiveShell.instance()
    try:
        rl.setup(8, quiet=True)
        fig = Figure()
        fig.add_subplot().plot([0, 1])
        data, _ = shell.display_formatter.format(fig)
        assert data["image/png"][:4] == b"\x89PNG"
    finally:
        InteractiveShell.clear_instance()


def test_progress_prints_outside_a_kernel(capsys):
    tick = notebook.progress(2, "steps")
    tick("a")
    tick()
    assert capsys.readouterr().out.splitlines() == ["steps 1/2: a", "steps 2/2"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_starts_with_the_shared_setup_cell(path):
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source == notebook.SETUP_CELL


def test_setup_never_restarts_jax():
    x = jax.numpy.ones(3)  # a live array: restarting the backends would orphan it
    before = jax.devices()
    rl.setup(8, quiet=True)
    assert jax.devices() == before and float(x.sum()) == 3.0
    assert not hasattr(notebook, "_cpu_first")
