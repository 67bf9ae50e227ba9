"""The notebooks' shared set-up: which devices it picks, what it says, and when it refuses."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import types

import jax
import nbformat
import pytest

import rlcluster_lab as rl
from rlcluster_lab.lab.notebook import setup as notebook

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))

# The first code cell of every notebook. The lab cannot install itself, so in a kernel without
# it (a fresh Colab runtime) the cell installs it from the source the user names (the lab has
# no address of its own to assume).
SETUP_CELL = """\
# Shared set-up (the same first cell in every notebook). In a kernel without the lab
# (a fresh Colab runtime), first run: %env RLCLUSTER_LAB_SOURCE=<git+https://... URL of
# your copy of the lab, or the folder you uploaded>; this cell then installs it.
try:
    import rlcluster_lab as rl
except ModuleNotFoundError:
    import os
    from importlib import metadata

    source = os.environ.get("RLCLUSTER_LAB_SOURCE")
    if not source:
        raise ModuleNotFoundError(
            "rlcluster_lab is not installed in this kernel: set RLCLUSTER_LAB_SOURCE to the lab's "
            "source (a git+https:// URL, or an uploaded folder) and run this cell again"
        ) from None
    spec = source if "://" in source else "file://" + os.path.abspath(source)
    # The runtime's own JAX stays: pip would replace it with the newest a dependency accepts.
    keep = []
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            keep.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    pins = " ".join(keep)
    %pip install --quiet "rlcluster-lab[lab] @ {spec}" {pins}
    import rlcluster_lab as rl
lab = rl.setup()"""


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
        "print(json.dumps({'n': len(a.devices), 'reachable': a.reachable, 'summary': a.summary()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    assert data["n"] == 4 and data["reachable"] == ["colocated", "reshaped", "split"]
    code = "import rlcluster_lab as rl\nrl.setup(1)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "reachable layouts: colocated, reshaped" in out and "not reachable here: split" in out


def test_a_single_chip_gets_simulated_cpu_devices_beside_it():
    cpus = jax.devices()
    chip = cpus[:1]  # stands in for one accelerator chip: only the colocated layout fits on it
    devices, simulated, notes = notebook.choose_devices(chip, cpus)
    assert devices == cpus and simulated
    assert "can reach only: colocated" in notes[0] and "8 simulated CPU devices beside it" in notes[0]


def test_a_single_chip_without_cpu_devices_keeps_the_chip_and_says_how_to_get_more():
    cpus = jax.devices()
    devices, simulated, notes = notebook.choose_devices(cpus[:1], cpus[:1])
    assert devices == cpus[:1] and not simulated
    assert "restart the runtime" in notes[0]


def test_accelerators_no_layout_over_which_can_hold_the_models_give_way_to_simulated_devices():
    # Six chips form every standard layout by count, but their (3, 2) mesh (and the split's (3, 1)
    # halves) divide no model size's dimensions: every Construct would be refused on them.
    cpus = jax.devices()
    devices, simulated, notes = notebook.choose_devices(cpus[:6], cpus)
    assert devices == cpus and simulated
    assert "6 cpu device(s) can reach only: none" in notes[0] and "8 simulated CPU devices beside them" in notes[0]
    # Simulated devices of such a count: kept (asked for), and said to hold nothing.
    devices, simulated, notes = notebook.choose_devices([], cpus[:6])
    assert devices == cpus[:6] and simulated
    assert notes == [
        "no standard layout over 6 devices can hold the lab's models (each mesh axis must divide their "
        "dimensions): restart the kernel and set up another count, such as setup(8)"
    ]


def test_accelerators_that_reach_every_layout_are_used_as_they_are():
    accel = jax.devices()  # eight devices form every standard layout
    devices, simulated, notes = notebook.choose_devices(accel, [])
    assert devices == accel and not simulated and notes == []
    assert notebook.choose_devices([], accel) == (accel, True, [])


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
    assert first.source == SETUP_CELL


def test_setup_never_restarts_jax():
    x = jax.numpy.ones(3)  # a live array: restarting the backends would orphan it
    before = jax.devices()
    rl.setup(8, quiet=True)
    assert jax.devices() == before and float(x.sum()) == 3.0
    assert not hasattr(notebook, "_cpu_first")


# ---------------------------------------------------------------- a notebook whose extra is missing

TUNIX_NOTEBOOK = pathlib.Path(__file__).parent.parent / "notebooks" / "10_tunix_side_by_side.ipynb"


@pytest.fixture
def shell(monkeypatch):
    """An IPython shell as a kernel runs cells in it (each cell stored in its history)."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.delenv(notebook.NOTEBOOKS_ENV, raising=False)
    instance = InteractiveShell.instance()
    yield instance
    notebook.needs_extra("x", True, "", notebook="")  # take back what a test installed
    InteractiveShell.clear_instance()


def _run(shell, source):
    """Run a cell: (what it printed, its result's mime bundle or None); fails on an error in it."""
    from IPython.utils.capture import capture_output

    with capture_output() as out:
        result = shell.run_cell(source, store_history=True)
    assert result.error_before_exec is None and result.error_in_exec is None, out.stdout + out.stderr
    value = result.result
    return out.stdout, (value._repr_mimebundle_()[0] if hasattr(value, "_repr_mimebundle_") else value)


def test_notebook_10_without_tunix_says_so_once_and_every_later_cell_shows_its_stored_outputs(shell, monkeypatch):
    # As a kernel with only the [lab] extra runs it: Tunix cannot be imported (None in sys.modules).
    monkeypatch.setitem(sys.modules, "tunix", None)
    monkeypatch.chdir(TUNIX_NOTEBOOK.parent)
    code = [c for c in nbformat.read(TUNIX_NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    check = next(i for i, c in enumerate(code) if "needs_extra(" in c.source)
    assert check == 1, "the check is not the cell after the set-up"
    said, _ = _run(shell, code[check].source)
    assert "needs the [tunix] extra" in said and 'pip install -e ".[tunix]"' in said
    assert "stored with the notebook" in said and "restart the kernel" in said
    shown = 0
    for cell in code[check + 1 :]:
        printed, result = _run(shell, cell.source)  # none raises, though each needs Tunix
        streams = "".join(o.text for o in cell.outputs if o.output_type == "stream")
        results = [dict(o.data) for o in cell.outputs if o.output_type == "execute_result"]
        assert (result is not None) == bool(results), cell.source
        if results:
            assert result == results[0]
            shown += "image/svg+xml" in result
        else:
            assert printed == streams, cell.source
    assert shown == 5, "the five stored figures were not shown"


MULTIPLE_HOSTS_NOTEBOOK = pathlib.Path(__file__).parent.parent / "notebooks" / "09_multiple_hosts.ipynb"


def test_notebook_09_without_sockets_says_why_in_one_sentence_and_every_later_cell_shows_its_stored_outputs(
    shell, monkeypatch
):
    """A runtime with no sockets at all (a stand-in: creating one fails with errno 97): the launch
    stopped with a bare OSError. Now one sentence says why, and no cell below starts a process."""
    import errno
    import socket

    from rlcluster_lab.multiprocess import launcher

    def refused(*args, **kwargs):
        raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))

    def no_launch(*args, **kwargs):
        raise AssertionError("a cell started a process")

    monkeypatch.setattr(socket, "socket", refused)
    monkeypatch.setattr(launcher.subprocess, "Popen", no_launch)
    monkeypatch.chdir(MULTIPLE_HOSTS_NOTEBOOK.parent)
    code = [c for c in nbformat.read(MULTIPLE_HOSTS_NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    check = next(i for i, c in enumerate(code) if "needs_processes(" in c.source)
    assert check == 1, "the check is not the cell after the set-up"
    said, _ = _run(shell, code[check].source)
    assert said.count("\n") == 1 and said.count(". ") == 0, said  # one sentence, one line
    assert said.startswith("This runtime cannot open a loopback TCP socket ([Errno 97] ")
    assert "the cells below do not run: each shows the output stored with the notebook" in said
    ran = 0
    for cell in code[check + 1 :]:
        printed, result = _run(shell, cell.source)  # none raises, though each needs the processes
        streams = "".join(o.text for o in cell.outputs if o.output_type == "stream")
        results = [dict(o.data) for o in cell.outputs if o.output_type == "execute_result"]
        assert (result is not None) == bool(results), cell.source
        assert printed == streams, cell.source
        ran += bool(streams)
    assert ran >= 4, "the stored tables were not shown"


def test_without_its_extra_an_edited_cell_runs_as_written_and_the_check_itself_runs_again(shell, tmp_path):
    check = 'needs_extra("demo", have, "pip install demo", notebook="n.ipynb")'
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from rlcluster_lab.lab.notebook.setup import needs_extra"),
        nbformat.v4.new_code_cell(check),
        nbformat.v4.new_code_cell('print("ran")', outputs=[nbformat.v4.new_output("stream", text="stored\n")]),
    ]
    nbformat.write(nb, tmp_path / "n.ipynb")
    shell.user_ns["have"] = False
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        _run(shell, nb.cells[0].source)
        assert "needs the [demo] extra" in _run(shell, check)[0]
        assert _run(shell, 'print("ran")')[0] == "stored\n"
        assert _run(shell, 'print("ran", "edited")')[0] == "ran edited\n"
        assert "needs the [demo] extra" in _run(shell, check)[0], "the check cell was replaced by its stored output"
        assert _run(shell, 'print("ran")')[0] == "stored\n"
        shell.user_ns["have"] = True  # installed since
        assert _run(shell, check)[1] is True
        assert _run(shell, 'print("ran")')[0] == "ran\n"


def test_without_its_extra_and_without_the_stored_notebook_the_check_stops_with_its_message_alone(shell, tmp_path):
    from IPython.utils.capture import capture_output

    shell.run_cell("from rlcluster_lab.lab.notebook.setup import needs_extra", store_history=True)
    with pytest.MonkeyPatch.context() as mp, capture_output() as out:
        mp.chdir(tmp_path)  # no n.ipynb here: a kernel that does not see the notebook's file (Colab)
        result = shell.run_cell('needs_extra("demo", False, "pip install demo", notebook="n.ipynb")', True)
    assert isinstance(result.error_in_exec, notebook.ExtraMissingError)
    assert "Traceback" not in out.stdout and "File " not in out.stdout
    assert "needs the [demo] extra" in out.stdout and "To run this notebook, pip install demo;" in out.stdout


# ---------------------------------------------------------------- the working copies `make lab` serves


def test_working_copies_are_made_refreshed_and_an_edited_one_is_kept_as_a_backup(tmp_path):
    from rlcluster_lab.lab.notebook.copies import sync_copies

    tracked, work = tmp_path / "notebooks", tmp_path / "work"
    tracked.mkdir()
    files = {"a.ipynb": "a1", "a.md": "a1 text", "b.ipynb": "b1", "b.md": "b1 text", "jupytext.toml": "pair"}
    for name, text in files.items():
        (tracked / name).write_text(text)

    def texts(folder):
        return {p.name: p.read_text() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}

    said = sync_copies(tracked, work)
    assert texts(work) == files and said == [f"copied from {tracked}: a, b, jupytext"]
    assert sync_copies(tracked, work) == []

    (work / "a.ipynb").write_text("a1 run and saved")  # the user's run: the copy is theirs
    assert sync_copies(tracked, work) == [] and (work / "a.ipynb").read_text() == "a1 run and saved"

    (tracked / "b.ipynb").write_text("b2")  # a pull changes b, which the user never touched
    assert sync_copies(tracked, work) == [f"refreshed from {tracked} (changed there since copied): b"]
    assert (work / "b.ipynb").read_text() == "b2"

    (tracked / "a.ipynb").write_text("a2")  # ... and a, which the user changed
    (tracked / "a.md").write_text("a2 text")
    said = sync_copies(tracked, work)
    assert said == [
        f"changed in {tracked} and here too, so your copies are kept as: {work}/a.backup-1.ipynb, {work}/a.backup-1.md"
    ]
    assert (work / "a.backup-1.ipynb").read_text() == "a1 run and saved"
    assert (work / "a.backup-1.md").read_text() == "a1 text"
    assert (work / "a.ipynb").read_text() == "a2" and (work / "a.md").read_text() == "a2 text"

    (work / "a.ipynb").write_text("a2 edited")
    (tracked / "a.ipynb").write_text("a3")
    assert "a.backup-2.ipynb" in sync_copies(tracked, work)[0]
    assert (work / "a.backup-1.ipynb").read_text() == "a1 run and saved", "an older backup was overwritten"
    assert (work / "a.backup-2.ipynb").read_text() == "a2 edited" and (work / "a.ipynb").read_text() == "a3"

    (work / "b.ipynb").unlink()  # deleting a copy brings the tracked one back
    (work / "b.md").unlink()
    assert sync_copies(tracked, work) == [f"copied from {tracked}: b"] and (work / "b.ipynb").read_text() == "b2"
    assert texts(tracked) == {**files, "a.ipynb": "a3", "a.md": "a2 text", "b.ipynb": "b2"}, "a tracked file changed"


@pytest.mark.parametrize(
    ("version", "warned"),
    [("6.29.5", False), ("6.31.0", False), ("7.0.0", True), ("7.4.0", True), ("10.1", True), ("dev", False)],
)
def test_a_kernel_that_may_reorder_widget_messages_is_named_with_the_fix(version: str, warned: bool) -> None:
    note = notebook.kernel_note(version)
    assert (note is not None) == warned
    if warned:
        assert version in note and "pip install 'ipykernel<7'" in note


def test_outside_a_kernel_no_kernel_note_is_made() -> None:
    assert notebook.kernel_note() is None
