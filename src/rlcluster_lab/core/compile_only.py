"""XLA:TPU's compile-only client: the devices of a TPU slice to lower and compile programs for on
a machine without one. libtpu holds the compiler; given a topology (``"v5e:2x4"``) it describes
the slice's chips, and a program lowered with shardings over them compiles as it would on the
slice (its memory analysis included), runs nowhere and allocates nothing.

libtpu is no dependency of the lab: ``pip install --target DIR libtpu==<version>`` (about 700
MB; the version ``jax[tpu]`` names for the installed JAX, ``libtpu_wanted``) and pass ``DIR``.
In a process whose JAX started without libtpu (the lab's, on CPU devices) the folder is put on
``sys.path`` and the topology asked for: JAX loads the plugin for it then, beside the backends
already running (tried with JAX 0.10.2 and libtpu 0.0.42.1). libtpu takes its lockfile to
compile too, so one such process runs at a time; another's is named (``core.chip_holder``).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from pathlib import Path
from typing import Any

from rlcluster_lab.core.chip_holder import chip_held
from rlcluster_lab.core.errors import ConfigError

# libtpu reads these when it starts; without them it asks a TPU VM's metadata server, which a
# machine without a chip does not have (a real TPU VM's own settings are kept).
TPU_ENV = {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-1", "TPU_WORKER_HOSTNAMES": "localhost"}


def libtpu_wanted() -> str:
    """The libtpu requirement ``jax[tpu]`` names for the installed JAX (``"libtpu==0.0.42.*"`` for
    JAX 0.10.2), read from JAX's own metadata."""
    for req in importlib.metadata.requires("jax") or []:
        name, _, marker = req.partition(";")
        if name.strip().startswith("libtpu") and re.search(r"extra\s*==\s*['\"]tpu['\"]", marker):
            return name.strip().replace(" ", "")
    return "libtpu"


def compile_only_devices(topology: str, chips_per_host: tuple[int, ...], libtpu: str | None = None) -> list[Any]:
    """The devices of the TPU slice ``topology`` (``"v5e:2x4"``, hosts of ``chips_per_host``
    chips), from libtpu in the folder ``libtpu`` (None: the one this Python imports).

    Raises:
        ConfigError: no libtpu there, or libtpu cannot describe the slice; the message says how
            to install it.
    """
    from jax.experimental import topologies

    install = f"pip install --target DIR '{libtpu_wanted()}' (about 700 MB) and pass that folder (--libtpu DIR)"
    if libtpu is not None:
        folder = Path(libtpu).expanduser().resolve()
        if not (folder / "libtpu").is_dir():
            raise ConfigError(f"no libtpu in {folder}: {install}")
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    for key, value in TPU_ENV.items():
        os.environ.setdefault(key, value)
    try:
        desc = topologies.get_topology_desc(
            topology_name=topology, platform="tpu", chips_per_host_bounds=tuple(chips_per_host)
        )
    except (ImportError, RuntimeError, ValueError, AttributeError) as err:
        held = chip_held("tpu", str(err), said=True)
        if held is not None:  # one libtpu at a time, a compile-only one too: never its lockfile's "rm" advice
            raise ConfigError(f"libtpu is in use by {held.who()}: wait for it to end, or {held.to_free()}") from None
        where = "" if libtpu is None else f" from {libtpu}"
        raise ConfigError(
            f"XLA:TPU's compile-only client could not describe {topology}{where} ({str(err).splitlines()[0]}): "
            f"{install}"
        ) from None
    return list(desc.devices)
