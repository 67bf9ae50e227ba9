"""The set-up every notebook runs first (``setup()``): pick the devices the lab's layouts are built on.

It asks for ``n_devices`` simulated CPU devices before JAX starts (JAX starts its CPU backend
beside any accelerator too); builds on GPUs or TPUs that can form every standard layout, and
otherwise (a single chip) builds colocated and reshaped on the chip and split on the simulated
CPU devices beside it (``families``, ``devices_for(layout)``). JAX is never restarted: each
cluster takes its platform (memory kinds, transfer guard, allocator figures) from its own meshes.
It turns on the persistent compilation cache, starts the warm start (``lab.notebook.warm``) when the
layouts run on simulated CPU devices, and in Colab turns on the widget manager. Where another
process holds the chip (another notebook's kernel), it builds every layout on the simulated CPU
devices and says which process and what frees it; ``take_chip=True`` hands the chip over
(``lab.notebook.chip_handover``).

``needs_extra()`` and ``needs_processes()`` say once what this runtime lacks, and the cells below
show the outputs stored with the notebook instead of failing one by one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from rlcluster_lab.app.scenario import buildable_layouts
from rlcluster_lab.core.compile_cache import enable_compilation_cache
from rlcluster_lab.core.devices import (
    DEFAULT_SIMULATED_DEVICES,
    DeviceSetupError,
    backend_started,
    check_device_count,
    devices_words,
    open_devices,
)
from rlcluster_lab.core.meshes import LAYOUTS, reachable_layouts
from rlcluster_lab.lab.notebook.chip_handover import HandOver, hand_over, held_sentence
from rlcluster_lab.lab.notebook.warm import start_warm_up


@dataclasses.dataclass(frozen=True)
class LayoutFamily:
    """Standard layouts built on one set of devices (a chip, or the simulated CPU devices)."""

    devices: tuple[Any, ...]
    layouts: tuple[str, ...]

    @property
    def where(self) -> str:
        """The devices in words (``core.devices.devices_words``): "TPU v5 lite chip 0"."""
        return devices_words(self.devices)

    def label(self, layout: str) -> str:
        """How the lab's layout control names ``layout`` built here: "colocated on TPU v5 lite chip 0"."""
        return f"{layout} on {self.where}"


@dataclasses.dataclass(frozen=True)
class LabDevices:
    """What ``setup()`` found, and the devices the notebooks build layouts on."""

    platform: str  # the backend ``devices`` are of: "cpu", "gpu" or "tpu"
    devices: tuple[Any, ...]  # the devices the layouts that need several devices are built on
    simulated: bool  # ``devices`` are simulated CPU devices
    accelerator: str | None  # the real accelerator's platform, if any ("tpu", "gpu")
    accelerator_devices: tuple[Any, ...]  # the real accelerator devices, if any
    colab: bool
    reachable: tuple[str, ...]  # standard layouts over ``devices`` that can hold the models
    notes: tuple[str, ...] = ()
    # Which layouts are built on which devices, each layout in one family; empty: all on ``devices``.
    families: tuple[LayoutFamily, ...] = ()
    # Another process holds the chip: who, and what frees it, in one sentence (``lab.notebook.chip_handover``).
    held: str | None = None

    def layout_families(self) -> tuple[LayoutFamily, ...]:
        """The families, or the one family of every reachable layout on ``devices``."""
        return self.families or (LayoutFamily(self.devices, self.reachable),)

    def devices_for(self, layout: str) -> tuple[Any, ...]:
        """The devices ``layout`` is built on here: on a single chip, colocated and reshaped on the
        chip and split on the simulated CPU devices beside it; elsewhere ``devices``.

        Raises:
            ValueError: no family here holds ``layout`` (says which layouts are reachable).
        """
        for family in self.layout_families():
            if layout in family.layouts:
                return family.devices
        held = ", ".join(layouts_held(self)) or "none"
        raise ValueError(f"no devices here hold the {layout!r} layout; reachable here: {held}")

    def summary(self) -> str:
        acc = self.accelerator_devices
        where = "simulated CPU" if self.simulated else self.platform
        kind = str(getattr(acc[0], "device_kind", acc[0].platform)) if acc else "none"
        said = f"{len(acc)} {self.accelerator} device(s) ({kind})" if self.accelerator else "none"
        lines = [self.held or f"accelerator: {said}"]
        if self.families:
            lines += [f"{', '.join(f.layouts)}: built on {f.where}" for f in self.families]
        else:
            lines += [
                f"layouts are built on: {len(self.devices)} {where} device(s)",
                "reachable layouts: " + (", ".join(self.reachable) or "none"),
            ]
        unreachable = [lay for lay in LAYOUTS if lay not in layouts_held(self)]
        if unreachable:
            lines.append("not reachable here: " + ", ".join(unreachable))
        if self.colab:
            lines.append("running in Colab")
        lines.extend(self.notes)
        return "\n".join(lines)


def layout_devices(devices: LabDevices | Sequence[Any], layout: str) -> list[Any]:
    """The devices ``layout`` is built on: ``devices.devices_for(layout)`` for what ``setup()``
    returned, else the devices given. The notebooks' experiments take either."""
    return list(devices.devices_for(layout) if isinstance(devices, LabDevices) else devices)


def layouts_held(devices: LabDevices | Sequence[Any]) -> list[str]:
    """The standard layouts the experiments build: every family's of a ``LabDevices``, else those
    the devices given can form (``core.meshes.reachable_layouts``)."""
    if isinstance(devices, LabDevices):
        held = {lay for family in devices.layout_families() for lay in family.layouts}
        return [lay for lay in LAYOUTS if lay in held]
    return reachable_layouts(list(devices))


def choose_devices(accelerators: Sequence[Any], cpus: Sequence[Any]) -> tuple[list[Any], bool, list[str]]:
    """Which devices to build layouts on: (devices, simulated, notes). Accelerators win when every
    standard layout over them can hold the lab's models (``buildable_layouts``); otherwise (a single
    chip, 6 GPUs) the CPU devices beside them, when there are at least two."""
    if not accelerators:
        note = (
            f"no standard layout over {len(cpus)} devices can hold the lab's models (each mesh axis must divide "
            "their dimensions): restart the kernel and set up another count, such as setup(8)"
        )
        return list(cpus), True, [] if buildable_layouts(cpus) else [note]
    on_chip = buildable_layouts(list(accelerators))
    if len(on_chip) == len(LAYOUTS):
        return list(accelerators), False, []
    chip = f"{len(accelerators)} {accelerators[0].platform} device(s)"
    on_chip = ", ".join(on_chip) or "none"
    them = "it" if len(accelerators) == 1 else "them"
    if len(cpus) >= 2:
        others = "the others are built" if on_chip != "none" else "the layouts here run"
        note = (
            f"the {chip} can reach only: {on_chip}; {others} on {len(cpus)} simulated CPU devices beside {them} "
            "(lab.devices_for(layout) gives each layout's)"
        )
        return list(cpus), True, [note]
    note = (
        f"the {chip} can reach only: {on_chip}, and no simulated CPU devices were set up beside it "
        "(the backend had already started); restart the runtime and run this cell first for the others"
    )
    return list(accelerators), False, [note]


def layout_families(accelerators: Sequence[Any], devices: Sequence[Any], simulated: bool) -> tuple[LayoutFamily, ...]:
    """Which standard layouts are built on which devices: with simulated CPU devices beside
    accelerators (a single chip), those the accelerators can hold on them and the rest on the CPU
    devices; otherwise () (every layout on ``devices``)."""
    on_chip = tuple(buildable_layouts(list(accelerators))) if simulated and accelerators else ()
    if not on_chip:
        return ()
    rest = tuple(lay for lay in buildable_layouts(list(devices)) if lay not in on_chip)
    return (LayoutFamily(tuple(accelerators), on_chip),) + ((LayoutFamily(tuple(devices), rest),) if rest else ())


def setup(
    n_devices: int = DEFAULT_SIMULATED_DEVICES, *, quiet: bool = False, use: str = "auto", take_chip: bool = False
) -> LabDevices:
    """Set up the devices for the notebooks; returns what was found (and prints it unless ``quiet``).

    Where another process holds the chip, every layout is built on the simulated CPU devices, and
    the summary's first line names that process and what frees the chip.

    Args:
        n_devices: simulated CPU devices to ask for (before JAX starts).
        quiet: do not print the summary.
        use: ``"auto"``; ``"accelerator"`` builds on the accelerator even when
            it cannot form every layout (a single chip: colocated and reshaped only).
        take_chip: first shut down the Jupyter kernels that hold the chip, through the server that
            runs them, and open the chip here (``lab.notebook.chip_handover.hand_over``).

    Returns:
        The devices found and the ones the layouts are built on.

    Raises:
        DeviceSetupError: JAX already started on CPU with another device
            count: restart the kernel and run the set-up cell first.
    """
    n_devices = check_device_count(n_devices, "n_devices")
    if use not in ("auto", "accelerator"):
        raise ValueError(f"use must be 'auto' or 'accelerator', got {use!r}")
    colab = "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ  # a Google Colab runtime
    handed = hand_over() if take_chip else HandOver((), reopened=False)
    if not backend_started():
        # Always ask: beside an accelerator these are what a single chip needs for the other layouts.
        jax.config.update("jax_num_cpu_devices", n_devices)
    # Before the first compilation, or JAX would not look in the cache.
    cache = enable_compilation_cache()
    opened = open_devices(on_held="cpu", retried=handed.reopened)
    accelerators = [d for d in opened.devices if d.platform != "cpu"]
    try:
        cpus = list(jax.devices("cpu"))
    except RuntimeError:
        cpus = []
    if not accelerators and len(cpus) != n_devices:
        raise DeviceSetupError(
            f"JAX already started with {len(cpus)} CPU device(s); this notebook needs {n_devices}. "
            "The count can only be set before the first JAX operation: restart the kernel "
            "(Kernel > Restart) and run the set-up cell first."
        )
    if use == "accelerator" and accelerators:
        devices, simulated, notes = list(accelerators), False, []
        on_chip = buildable_layouts(accelerators)
        if len(on_chip) < len(LAYOUTS):
            notes = [
                f"the layouts that fit on the {len(accelerators)} {accelerators[0].platform} device(s): "
                f"{', '.join(on_chip) or 'none'}"
            ]
    else:
        devices, simulated, notes = choose_devices(accelerators, cpus)
    if simulated and cache is not None:
        # A separate process: the cell never waits, and nothing it compiles holds this kernel's memory.
        notes = [*notes, *filter(None, [start_warm_up(len(cpus))])]
    result = LabDevices(
        platform=devices[0].platform if devices else "cpu",
        devices=tuple(devices),
        simulated=simulated,
        accelerator=accelerators[0].platform if accelerators else None,
        accelerator_devices=tuple(accelerators),
        colab=colab,
        reachable=tuple(buildable_layouts(devices)),
        families=layout_families(accelerators, devices, simulated),
        notes=tuple(notes)
        + tuple(f"shut down {kernel}, which held the chip" for kernel in handed.kernels)
        + ((f"compiled programs are cached in {cache}",) if cache else ())
        + tuple(filter(None, [kernel_note()])),
        held=held_sentence(opened.held, len(cpus), retried=handed.reopened) if opened.held else None,
    )
    if colab:  # ipywidgets 8 needs Colab's custom widget manager turned on
        with contextlib.suppress(ImportError):
            from google.colab import output  # type: ignore[import-not-found]

            output.enable_custom_widget_manager()
    _register_figure_display()
    if not quiet:
        print(result.summary())
    return result


def _register_figure_display() -> None:
    """Show a ``matplotlib.figure.Figure`` returned by a cell as a PNG: the notebooks' figures are
    built without pyplot, so IPython has no display rule for them (``svg.Svg`` displays itself)."""
    shell = _shell()
    if shell is None:
        return
    from matplotlib.figure import Figure

    from rlcluster_lab.lab.figures.mpl import to_png

    shell.display_formatter.formatters["image/png"].for_type(Figure, to_png)


def progress(total: int, label: str = "") -> Callable[[Any], None]:
    """A callback to call once per unit of work; shows a bar in a notebook, prints elsewhere. The
    finished bar becomes one line of text, so a saved notebook shows no widget that needs a kernel."""
    state = {"done": 0}
    handle = bar = None
    if _in_kernel():
        with contextlib.suppress(ImportError):
            import ipywidgets as widgets
            from IPython.display import display

            bar = widgets.IntProgress(value=0, min=0, max=max(total, 1), description=label[:20])
            handle = display(bar, display_id=True)

    def tick(info: Any = None) -> None:
        state["done"] += 1
        if bar is not None:
            bar.value = state["done"]
            if state["done"] >= total and handle is not None:
                bar.close()
                handle.update({"text/plain": f"{label}: {total}/{total} done"}, raw=True)
        else:
            print(f"{label} {state['done']}/{total}" + (f": {info}" if info is not None else ""), flush=True)

    return tick


def kernel_note(version: str | None = None) -> str | None:
    """A warning when the kernel may reorder widget messages, else None: ipykernel 7 runs a widget
    message that arrives while another is handled beside it, so a click can be handled before the
    knob change sent just before it (the lab's extra installs 6.x, which keeps them in order).

    Args:
        version: the kernel's version (default: the running ipykernel's, when there is one).
    """
    if version is None:
        if not _in_kernel():
            return None
        import ipykernel

        version = ipykernel.__version__
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < 7:
        return None
    return (
        f"ipykernel {version} may handle a click before the knob change made just before it; "
        "the lab marks such a knob as pending. For clicks in order: pip install 'ipykernel<7' and restart the kernel"
    )


def _in_kernel() -> bool:
    shell = _shell()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


# `make lab` serves working copies and names the tracked notebooks' folder here, so a notebook
# shows the outputs committed with it however its working copy was saved since.
NOTEBOOKS_ENV = "RLCLUSTER_LAB_NOTEBOOKS"
_replay: list[Callable[[list[str]], list[str]]] = []  # the input transformer needs_extra/needs_processes installed
_stored: list[list[dict[str, Any]]] = []  # the stored outputs it shows, by the index in its code


class _MessageOnly:
    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback: the message is all there is to read.
        return str(self).splitlines()


class ExtraMissingError(_MessageOnly, ModuleNotFoundError):
    """A notebook's optional extra is not installed (its message says what to install)."""


class ProcessesUnavailableError(_MessageOnly, RuntimeError):
    """This runtime cannot start a multi-process run's workers (its message says why)."""


def needs_extra(extra: str, available: bool, hint: str, notebook: str) -> bool:
    """Whether this kernel has the optional ``extra`` the notebook's later cells need; without it,
    say so once and have those cells show the outputs stored with the notebook.

    JupyterLab's Run All clears the outputs of every cell as it sends them to the kernel, so a
    cell that stopped the run here would leave the stored results below it empty, and the next
    save would write that. Instead, each code cell below whose source is the stored one shows
    its stored outputs (a run with the extra) without running; a cell edited since runs as written.

    Args:
        extra: the extra's name, as in ``pip install -e ".[extra]"``.
        available: whether it is installed in this kernel.
        hint: how to install it.
        notebook: the notebook's file name, read in the folder ``RLCLUSTER_LAB_NOTEBOOKS``
            names (``make lab`` names the tracked notebooks) or else the kernel's folder.

    Returns:
        ``available``. With the extra, any stored outputs shown before are switched off.

    Raises:
        ExtraMissingError: the extra is missing and the stored notebook cannot be read (a kernel
            that does not see the file, as in Colab): it stops a run there, shown as its message alone.
    """
    return _show_stored_unless(
        available,
        f"This notebook needs the [{extra}] extra, which this kernel's Python ({sys.executable}) does not have",
        "a run with the extra",
        notebook,
        ExtraMissingError,
        advice=f"To run this notebook, {hint}; then restart the kernel and run it again.",
    )


def needs_processes(notebook: str) -> bool:
    """Whether this runtime can start the worker processes of a multi-process run on this machine
    (``multiprocess.launcher.cannot_launch`` tries a loopback socket and a process); without them,
    one sentence says why and the cells below show the outputs stored with the notebook, as
    ``needs_extra`` does without an extra (a sandbox with no sockets at all, say).

    Raises:
        ProcessesUnavailableError: they cannot start and the stored notebook cannot be read.
    """
    from rlcluster_lab.multiprocess.launcher import cannot_launch

    lacking = cannot_launch()
    return _show_stored_unless(
        lacking is None,
        f"This runtime cannot {lacking}",
        "a run on a machine where they could start",
        notebook,
        ProcessesUnavailableError,
    )


def _show_stored_unless(
    runs_here: bool, missing: str, stored_from: str, notebook: str, error: type[Exception], advice: str = ""
) -> bool:
    """``needs_extra``'s and ``needs_processes``' work: ``runs_here``, or else say ``missing`` once
    and show the stored outputs below (a run ``stored_from``), or raise ``error``."""
    shell = _shell()
    for transform in _replay:
        if shell is not None and transform in shell.input_transformers_cleanup:
            shell.input_transformers_cleanup.remove(transform)
    _replay.clear()
    _stored.clear()
    if runs_here:
        return True
    cells = _stored_below(shell, Path(os.environ.get(NOTEBOOKS_ENV) or os.getcwd()) / notebook)
    if cells is None:
        raise error("\n".join(filter(None, [f"{missing}.", advice])))
    _stored.extend(cells.values())
    code = {source: i for i, source in enumerate(cells)}

    def replay(lines: list[str]) -> list[str]:
        i = code.get("".join(lines).strip())
        return lines if i is None else [f"__import__({__name__!r}, fromlist=['_']).show_stored({i})\n"]

    shell.input_transformers_cleanup.insert(0, replay)
    _replay.append(replay)
    said = (
        f"{missing}, so the cells below do not run: each shows the output stored with the notebook, from {stored_from}."
    )
    print("\n".join(filter(None, [said, advice])))
    return False


def show_stored(index: int) -> Any:
    """Show the stored outputs of the ``index``-th cell ``needs_extra`` or ``needs_processes`` matched:
    its streams and displays now, its result as the cell's value (so it is shown as the cell's result)."""
    from IPython.display import publish_display_data

    result = None
    for out in _stored[index]:
        kind = out.get("output_type")
        if kind == "stream":
            print(_joined(out["text"]), end="", file=sys.stderr if out.get("name") == "stderr" else sys.stdout)
        elif kind == "display_data":
            publish_display_data(_bundle(out), out.get("metadata") or {})
        elif kind == "execute_result":
            result = _StoredResult(_bundle(out), out.get("metadata") or {})
    return result


@dataclasses.dataclass(frozen=True)
class _StoredResult:
    data: dict[str, Any]
    metadata: dict[str, Any]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        return self.data, self.metadata


def _stored_below(shell: Any, path: Path) -> dict[str, list[dict[str, Any]]] | None:
    """Source -> stored outputs of the code cells below the running one in the notebook at
    ``path``; None outside IPython or when the file, or the running cell in it, is not found."""
    if shell is None or not shell.history_manager.input_hist_raw:
        return None
    try:
        cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    sources = [_joined(c["source"]).strip() for c in cells]
    running = shell.history_manager.input_hist_raw[-1].strip()
    if running not in sources:
        return None
    below = sources.index(running) + 1
    return {source: cell.get("outputs", []) for source, cell in zip(sources[below:], cells[below:])}


def _joined(text: str | list[str]) -> str:
    return "".join(text) if isinstance(text, list) else text


def _bundle(output: dict[str, Any]) -> dict[str, Any]:
    # A stored text is split in lines; JSON data is kept as it is.
    return {mime: value if mime.endswith("json") else _joined(value) for mime, value in output["data"].items()}


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()
