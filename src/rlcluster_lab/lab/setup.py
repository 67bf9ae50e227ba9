"""The set-up every notebook runs first (``setup()``): pick the devices the lab's layouts are built on.

It turns on Colab's widget manager there; asks the CPU backend for ``n_devices`` simulated
devices, which must happen before the JAX backend starts (JAX starts its CPU backend beside
any accelerator, so they exist on a GPU or TPU machine too); builds on GPUs or TPUs that can
form every standard layout, and otherwise (a single chip, where only colocated fits) on the
simulated CPU devices beside it, keeping the chip reachable (``accelerator_devices``). JAX is
never restarted: the accelerator stays its default backend, and the cluster takes its platform
(memory kinds, the transfer guard, default devices, allocator figures) from its own meshes.
It turns on the persistent compilation cache and, with the layouts on simulated CPU devices,
starts the warm start (``lab.warm``: one background process at the lowest CPU priority
compiling the standard programs into that cache once per environment), without waiting for it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rlcluster_lab.core.compile_cache import enable_compilation_cache
from rlcluster_lab.core.devices import DEFAULT_SIMULATED_DEVICES, DeviceSetupError, backend_started, check_device_count
from rlcluster_lab.core.meshes import LAYOUTS, reachable_layouts
from rlcluster_lab.lab.warm import start_warm_up

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

    source = os.environ.get("RLCLUSTER_LAB_SOURCE")
    if not source:
        raise ModuleNotFoundError(
            "rlcluster_lab is not installed in this kernel: set RLCLUSTER_LAB_SOURCE to the lab's "
            "source (a git+https:// URL, or an uploaded folder) and run this cell again"
        ) from None
    spec = source if "://" in source else "file://" + os.path.abspath(source)
    %pip install --quiet "rlcluster-lab[lab] @ {spec}"
    import rlcluster_lab as rl
lab = rl.setup()"""


@dataclasses.dataclass(frozen=True)
class LabDevices:
    """What ``setup()`` found, and the devices the notebooks build layouts on."""

    platform: str  # the backend the layouts run on: "cpu", "gpu" or "tpu"
    devices: tuple[Any, ...]  # the devices layouts are built on (pass as ``devices=``)
    simulated: bool  # the layouts run on simulated CPU devices
    accelerator: str | None  # the real accelerator's platform, if any ("tpu", "gpu")
    accelerator_devices: tuple[Any, ...]  # the real accelerator devices, if any
    colab: bool
    reachable: tuple[str, ...]  # standard layouts the chosen devices can form
    notes: tuple[str, ...] = ()

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def reachable_on_accelerator(self) -> tuple[str, ...]:
        """The layouts the real accelerator alone can form (empty without one)."""
        return tuple(reachable_layouts(list(self.accelerator_devices))) if self.accelerator_devices else ()

    def summary(self) -> str:
        acc = self.accelerator_devices
        where = "simulated CPU" if self.simulated else self.platform
        lines = [
            f"accelerator: {len(acc)} {self.accelerator} device(s) ({_kind(acc)})"
            if self.accelerator
            else "accelerator: none",
            f"layouts are built on: {len(self.devices)} {where} device(s)",
            "reachable layouts: " + ", ".join(self.reachable),
        ]
        unreachable = [lay for lay in LAYOUTS if lay not in self.reachable]
        if unreachable:
            lines.append("not reachable here: " + ", ".join(unreachable))
        if self.colab:
            lines.append("running in Colab")
        lines.extend(self.notes)
        return "\n".join(lines)


def in_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def choose_devices(
    accelerators: Sequence[Any], cpus: Sequence[Any], n_devices: int
) -> tuple[list[Any], bool, list[str]]:
    """Which devices to build layouts on: (devices, simulated, notes).

    Accelerators win when they can form every standard layout; otherwise (a single chip: only
    colocated) the CPU devices beside it, when there are at least two.
    """
    if not accelerators:
        return list(cpus), True, []
    if len(reachable_layouts(list(accelerators))) == len(LAYOUTS):
        return list(accelerators), False, []
    chip = f"{len(accelerators)} {accelerators[0].platform} device(s)"
    on_chip = ", ".join(reachable_layouts(list(accelerators))) or "none"
    if len(cpus) >= 2:
        return (
            list(cpus),
            True,
            [
                f"the {chip} can reach only: {on_chip}; the layouts here run on {len(cpus)} simulated "
                "CPU devices beside it (pass lab.accelerator_devices as devices= to use the chip)"
            ],
        )
    return (
        list(accelerators),
        False,
        [
            f"the {chip} can reach only: {on_chip}, and no simulated CPU devices were set up beside it "
            f"(the backend had already started); restart the runtime and run this cell first for the others"
        ],
    )


def setup(
    n_devices: int = DEFAULT_SIMULATED_DEVICES, *, quiet: bool = False, use: str = "auto", warm: bool = True
) -> LabDevices:
    """Set up the devices for the notebooks; returns what was found (and prints it unless ``quiet``).

    Args:
        n_devices: simulated CPU devices to ask for (before JAX starts).
        quiet: do not print the summary.
        use: ``"auto"``; ``"accelerator"`` builds on the accelerator even when
            it cannot form every layout (a single chip: colocated only).
        warm: start the warm start in the background (``lab.warm``) when the layouts run
            on simulated CPU devices and this environment's cache is not warm yet.

    Returns:
        The devices found and the ones the layouts are built on.

    Raises:
        DeviceSetupError: JAX already started on CPU with another device
            count: restart the kernel and run the set-up cell first.
    """
    n_devices = check_device_count(n_devices, "n_devices")
    if use not in ("auto", "accelerator"):
        raise ValueError(f"use must be 'auto' or 'accelerator', got {use!r}")
    colab = in_colab()
    if not backend_started():
        # Always ask: beside an accelerator these are what a single chip needs for the other layouts.
        jax.config.update("jax_num_cpu_devices", n_devices)
    # Before the first compilation, or JAX would not look in the cache.
    cache = enable_compilation_cache()
    accelerators = [d for d in jax.devices() if d.platform != "cpu"]
    cpus = _cpu_devices()
    if not accelerators and len(cpus) != n_devices:
        raise DeviceSetupError(
            f"JAX already started with {len(cpus)} CPU device(s); this notebook needs {n_devices}. "
            "The count can only be set before the first JAX operation: restart the kernel "
            "(Kernel > Restart) and run the set-up cell first."
        )
    if use == "accelerator" and accelerators:
        devices, simulated, notes = list(accelerators), False, []
        if len(reachable_layouts(accelerators)) < len(LAYOUTS):
            notes = [
                f"only {', '.join(reachable_layouts(accelerators))} fits on the "
                f"{len(accelerators)} {accelerators[0].platform} device(s)"
            ]
    else:
        devices, simulated, notes = choose_devices(accelerators, cpus, n_devices)
    platform = devices[0].platform if devices else "cpu"
    if warm and simulated and cache is not None:
        # A separate process: the cell never waits, and nothing it compiles holds this kernel's memory.
        notes = [*notes, *filter(None, [start_warm_up(len(cpus))])]
    result = LabDevices(
        platform=platform,
        devices=tuple(devices),
        simulated=simulated,
        accelerator=accelerators[0].platform if accelerators else None,
        accelerator_devices=tuple(accelerators),
        colab=colab,
        reachable=tuple(reachable_layouts(devices)),
        notes=tuple(notes) + ((f"compiled programs are cached in {cache}",) if cache else ()),
    )
    if colab:
        _enable_colab_widgets()
    _register_figure_display()
    if not quiet:
        print(result.summary())
    return result


def _cpu_devices() -> list[Any]:
    try:
        return list(jax.devices("cpu"))
    except RuntimeError:
        return []


def _kind(devices: Sequence[Any]) -> str:
    return str(getattr(devices[0], "device_kind", devices[0].platform)) if devices else "none"


def _enable_colab_widgets() -> None:
    """ipywidgets 8 needs Colab's custom widget manager turned on."""
    try:
        from google.colab import output  # type: ignore[import-not-found]
    except ImportError:
        return
    output.enable_custom_widget_manager()


def _register_figure_display() -> None:
    """Show a ``matplotlib.figure.Figure`` returned by a cell as a PNG: the notebooks' figures are
    built without pyplot, so IPython has no display rule for them (``svg.Svg`` displays itself)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib.figure import Figure

    from rlcluster_lab.lab.mpl import to_png

    shell.display_formatter.formatters["image/png"].for_type(Figure, lambda fig: to_png(fig))


def progress(total: int, label: str = "") -> Callable[[Any], None]:
    """A callback to call once per unit of work; shows a bar in a notebook, prints elsewhere.

    When the last unit is done the bar is replaced by one line of text, so a saved notebook
    shows no widget that needs a live kernel.
    """
    state = {"done": 0}
    handle = bar = None
    if _in_kernel():
        try:
            import ipywidgets as widgets
            from IPython.display import display

            bar = widgets.IntProgress(value=0, min=0, max=max(total, 1), description=label[:20])
            handle = display(bar, display_id=True)
        except ImportError:
            bar = None

    def tick(info: Any = None) -> None:
        state["done"] += 1
        text = f"{label} {state['done']}/{total}" + (f": {info}" if info is not None else "")
        if bar is not None:
            bar.value = state["done"]
            if state["done"] >= total and handle is not None:
                bar.close()
                handle.update({"text/plain": f"{label}: {total}/{total} done"}, raw=True)
        else:
            print(text, flush=True)

    return tick


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
