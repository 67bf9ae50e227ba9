"""The set-up every notebook runs first: pick the devices the lab's layouts are built on.

``setup()`` is the one call a notebook's first cell makes. It

- on Colab, turns on the widget manager ipywidgets needs there (the package
  itself is installed by the cell's first lines, see ``SETUP_CELL``);
- with GPUs or TPUs, uses them as they are;
- with a single accelerator chip (Colab's TPU runtime, a one-GPU machine),
  where only the colocated layout fits on the chip, restarts JAX's backends
  with the CPU backend first and the chip second: ``jax.devices()`` is then
  the simulated CPU devices, on which every layout is built, and the chip
  stays reachable as ``jax.devices("tpu")`` (``LabDevices.accelerator_devices``);
- otherwise asks the CPU backend for ``n_devices`` simulated devices, which
  must happen before the JAX backend starts, and fails loudly when it is too
  late (restart the kernel);
- prints what it found and which layouts the chosen devices can reach.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax

from rlcluster_lab.compile_cache import enable_compilation_cache
from rlcluster_lab.devices import DEFAULT_SIMULATED_DEVICES, DeviceSetupError, backend_started
from rlcluster_lab.meshes import LAYOUTS, reachable_layouts

# The first code cell of every notebook. The lab cannot install itself, so in a
# kernel without it (a fresh Colab runtime) the cell installs it from the source
# the user names; the lab has no address of its own to assume.
LAB_SOURCE_ENV = "RLCLUSTER_LAB_SOURCE"
SETUP_CELL = '''\
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
lab = rl.setup()'''


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
        lines = []
        if self.accelerator:
            lines.append(f"accelerator: {len(self.accelerator_devices)} {self.accelerator} device(s) "
                         f"({_kind(self.accelerator_devices)})")
        else:
            lines.append("accelerator: none")
        where = f"{len(self.devices)} simulated CPU device(s)" if self.simulated else (
            f"{len(self.devices)} {self.platform} device(s)")
        lines.append(f"layouts are built on: {where}")
        lines.append("reachable layouts: " + ", ".join(self.reachable))
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

    Accelerators win when they can form every standard layout. A single chip
    can only form the colocated one, so then the CPU devices beside it are
    used, when there are at least two; the chip stays available through
    ``LabDevices.accelerator_devices``.
    """
    if not accelerators:
        return list(cpus), True, []
    if len(reachable_layouts(list(accelerators))) == len(LAYOUTS):
        return list(accelerators), False, []
    chip = f"{len(accelerators)} {accelerators[0].platform} device(s)"
    on_chip = ", ".join(reachable_layouts(list(accelerators))) or "none"
    if len(cpus) >= 2:
        return list(cpus), True, [
            f"the {chip} can reach only: {on_chip}; the layouts here run on {len(cpus)} simulated "
            "CPU devices beside it (pass lab.accelerator_devices as devices= to use the chip)"
        ]
    return list(accelerators), False, [
        f"the {chip} can reach only: {on_chip}, and no simulated CPU devices were set up beside it "
        f"(the backend had already started); restart the runtime and run this cell first for the others"
    ]


def setup(n_devices: int = DEFAULT_SIMULATED_DEVICES, *, quiet: bool = False, use: str = "auto") -> LabDevices:
    """Set up the devices for the notebooks; returns what was found (and prints it unless ``quiet``).

    ``use="accelerator"`` keeps a single chip as the default device even
    though only the colocated layout fits on it.

    Raises ``DeviceSetupError`` when JAX already started on CPU with another
    device count: restart the kernel and run the set-up cell first.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be at least 1, got {n_devices}")
    if use not in ("auto", "accelerator"):
        raise ValueError(f"use must be 'auto' or 'accelerator', got {use!r}")
    colab = in_colab()
    if not backend_started():
        # Always ask: on CPU these are the lab's devices; beside an accelerator
        # they are the simulated devices a single chip needs for the other layouts.
        jax.config.update("jax_num_cpu_devices", n_devices)
    # Programs compiled in an earlier session are read back from disk (before the
    # first compilation, or JAX would not look there).
    cache = enable_compilation_cache()
    platform = _accelerator_platform()
    notes: list[str] = []
    if platform and use == "auto" and jax.default_backend() != "cpu":
        if len(reachable_layouts(jax.devices(platform))) < len(LAYOUTS) and not _cpu_first(platform):
            notes.append("arrays already exist in this process, so JAX could not be restarted with the "
                         "CPU devices first; restart the runtime and run this cell first")
    accelerators = list(jax.devices(platform)) if platform else []
    cpus = _cpu_devices()
    if not accelerators and len(cpus) != n_devices:
        raise DeviceSetupError(
            f"JAX already started with {len(cpus)} CPU device(s); this notebook needs {n_devices}. "
            "The count can only be set before the first JAX operation: restart the kernel "
            "(Kernel > Restart) and run the set-up cell first."
        )
    if jax.default_backend() == "cpu":
        devices, simulated, more = choose_devices(accelerators, cpus, n_devices)
    else:
        # The accelerator is the default backend (it reaches every layout, the caller
        # asked for it, or the restart was refused): build on it.
        devices, simulated, more = list(accelerators), False, []
        if len(reachable_layouts(accelerators)) < len(LAYOUTS):
            more = [f"only {', '.join(reachable_layouts(accelerators))} fits on the "
                    f"{len(accelerators)} {platform} device(s)"]
    notes = more + notes
    result = LabDevices(
        platform="cpu" if simulated else platform,
        devices=tuple(devices),
        simulated=simulated,
        accelerator=platform if accelerators else None,
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


def _cpu_first(platform: str) -> bool:
    """Restart JAX's backends with the CPU backend first and ``platform`` second.

    Only possible while no array exists (a fresh kernel running its first
    cell); returns False, changing nothing, otherwise.
    """
    if jax.live_arrays():
        return False
    from jax.extend.backend import clear_backends

    clear_backends()
    jax.config.update("jax_platforms", f"cpu,{platform}")
    try:
        jax.devices()
    except RuntimeError as exc:
        raise DeviceSetupError(
            f"JAX could not restart with the CPU devices beside the {platform} chip ({exc}). Restart the "
            "runtime and call rl.setup(use='accelerator') to use the chip alone (colocated layout only)."
        ) from exc
    return True


def _accelerator_platform() -> str | None:
    """The GPU or TPU platform in use, if any, whether it is the default backend or not.

    After ``_cpu_first`` the CPU is the default and the chip is the second
    platform in ``jax_platforms``; without that setting JAX makes an
    accelerator the default whenever there is one.
    """
    if jax.default_backend() != "cpu":
        return jax.default_backend()
    listed = [p.strip() for p in (jax.config.jax_platforms or "").split(",") if p.strip()]
    return next((p for p in listed if p != "cpu"), None)


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
    """Show a ``matplotlib.figure.Figure`` returned by a cell as a PNG.

    The figures in ``viz`` are built without pyplot, so IPython has no display
    rule for them until one is registered.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib.figure import Figure

    from rlcluster_lab.viz import to_png

    shell.display_formatter.formatters["image/png"].for_type(Figure, lambda fig: to_png(fig))


# --------------------------------------------------------------------------- progress for long cells


def progress(total: int, label: str = "") -> Callable[[Any], None]:
    """A callback to call once per unit of work; shows a bar in a notebook, prints elsewhere.

    The bar is a core ipywidgets ``IntProgress``. When the last unit is done
    the bar is replaced by one line of text, so a saved notebook shows the
    text and no widget that needs a live kernel.
    """
    state = {"done": 0}
    handle = None
    bar = None
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
