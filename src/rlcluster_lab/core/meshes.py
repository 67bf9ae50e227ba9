"""The lab's standard device layouts, built from the devices in use.

Every mesh is built with explicit ``axis_types`` (Auto on both axes): recent
JAX makes ``jax.make_mesh`` default to Explicit axes, which changes how
matmuls are sharded, and the lab wants the classic behaviour everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from rlcluster_lab.core.model_config import ModelConfig
from rlcluster_lab.core.options import LAYOUTS, default_shape, layout_problem
from rlcluster_lab.core.roles import Role

MESH_AXES: tuple[str, str] = ("fsdp", "tp")
# The reshaped layout's rollout mesh on one device: (1, 1) like the others' but with the axes named
# the other way round, so ``==`` tells the two apart (P1) while every partition spec still finds its axis.
ROLLOUT_AXES_ON_ONE_DEVICE: tuple[str, str] = ("tp", "fsdp")

# Logical name -> mesh axis. Norm scales use None and stay replicated.
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("embed", "fsdp"),
    ("vocab", "tp"),
    ("q_heads", "tp"),
    ("kv_heads", "tp"),
    ("mlp", "tp"),
)


def check_mesh_shape(device_ids: Sequence[int], shape: Sequence[int], axis_names: Sequence[str]) -> None:
    """A mesh's shape holds exactly its devices, has one size per axis name, and uses each device once
    (real meshes and meshes on paper alike); a ``ValueError`` says which does not hold."""
    shape, count = tuple(shape), len(device_ids)
    if math.prod(shape) != count:
        raise ValueError(
            f"mesh shape {shape} holds {math.prod(shape)} devices but {count} were given; "
            f"pick a shape whose product is {count}"
        )
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} and axis names {tuple(axis_names)} differ in length")
    if len(set(device_ids)) != count:
        raise ValueError("a mesh cannot use the same device twice")


def make_mesh(devices: Sequence[jax.Device], shape: tuple[int, ...], axis_names: tuple[str, ...] = MESH_AXES) -> Mesh:
    """A mesh over ``devices`` (in the order given) arranged as ``shape``."""
    devices = list(devices)
    check_mesh_shape([d.id for d in devices], shape, axis_names)
    arr = np.array(devices, dtype=object).reshape(shape)
    return Mesh(arr, axis_names, axis_types=(AxisType.Auto,) * len(axis_names))


def mesh_from_ids(
    device_ids: Sequence[int], shape: tuple[int, ...] | None = None, axis_names: tuple[str, ...] = MESH_AXES
) -> Mesh:
    """A mesh over the devices with these ids; the shape defaults to the standard one."""
    by_id = {d.id: d for d in jax.devices()}
    missing = [i for i in device_ids if i not in by_id]
    if missing:
        raise ValueError(
            f"device id(s) {missing} do not exist; this process has devices "
            f"{sorted(by_id)}. Pick ids from that list (on CPU, more simulated devices "
            "can only be set before JAX starts: rlcluster_lab.ensure_simulated_devices)."
        )
    if not device_ids:
        raise ValueError("a mesh needs at least one device id")
    shape = tuple(shape) if shape is not None else default_shape(len(device_ids))
    return make_mesh([by_id[i] for i in device_ids], shape, axis_names)


def sharded_dims(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Per mesh axis, the sizes of the model's dimensions sharded over it (through
    ``DEFAULT_LOGICAL_AXIS_RULES``): each must be divisible by that axis' size."""
    logical = {
        "embed": config.embed_dim,
        "vocab": config.vocab_size,
        "q_heads": config.q_dim,
        "kv_heads": config.kv_dim,
        "mlp": config.mlp_dim,
    }
    rules = dict(DEFAULT_LOGICAL_AXIS_RULES)
    return {axis: tuple(sorted({size for name, size in logical.items() if rules[name] == axis})) for axis in MESH_AXES}


def fitting_shapes(count: int, config: ModelConfig) -> list[tuple[int, int]]:
    """The (fsdp, tp) arrangements of ``count`` devices whose axis sizes divide every model dimension
    sharded over them, the standard shape first; empty when none does (3 devices, a 64-wide model)."""
    dims = sharded_dims(config)
    shapes = [default_shape(count)] if count else []
    shapes += [(a, count // a) for a in range(1, count + 1) if count % a == 0 and (a, count // a) not in shapes]
    return [(a, b) for a, b in shapes if all(d % a == 0 for d in dims["fsdp"]) and all(d % b == 0 for d in dims["tp"])]


def device_list(devices: Any, name: str = "devices") -> list[jax.Device]:
    """``devices`` as a list of distinct JAX devices (None: ``jax.devices()``); a ``TypeError`` naming
    ``name`` for anything but a list of devices, a ``ValueError`` for an empty list or a repeat."""
    if devices is None:
        return jax.devices()
    fix = "pass JAX devices (e.g. jax.devices()[:4], or rl.setup().devices in a notebook)"
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, np.ndarray)):
        got = f"{type(devices).__name__} {devices!r:.40}"
        raise TypeError(f"{name} must be a list of JAX devices (a Sequence), got {got}; {fix}")
    out = list(devices)
    foreign = [d for d in out if not isinstance(d, jax.Device)]
    if foreign:
        raise TypeError(f"{name} must hold JAX devices, got {type(foreign[0]).__name__} {foreign[0]!r:.40}; {fix}")
    if not out:
        raise ValueError(f"{name} is empty: a layout needs at least one device; {fix}")
    if len({d.id for d in out}) < len(out):
        ids = [d.id for d in out]
        raise ValueError(f"{name} lists a device twice ({ids}); each device can hold one place in a mesh")
    return out


def layout_meshes(
    layout: str, devices: Sequence[Any] | None = None, *, make: Callable[..., Any] = make_mesh
) -> dict[Role, Mesh]:
    """Meshes for every role in one of the standard layouts.

    - ``colocated``: every role on one mesh over all devices.
    - ``reshaped``: every role on all devices in the standard shape, except the rollout, on the same
      devices as an (N, 1) mesh: same chips, another mesh (P1). On one device the rollout's mesh
      names the axes the other way round (``ROLLOUT_AXES_ON_ONE_DEVICE``).
    - ``split``: actor, reference, reward and critic on the first half of the devices, the rollout
      on the second half.

    ``make(devices, shape)`` builds each mesh (the planner's builds them on paper: one definition).
    """
    devices = device_list(devices) if make is make_mesh else list(devices if devices is not None else jax.devices())
    n = len(devices)
    problem = layout_problem(layout, n)
    if problem:
        raise ValueError(problem)
    main = make(devices, default_shape(n))
    if layout == "colocated":
        return {role: main for role in Role}
    if layout == "reshaped":
        second = make(devices, (1, 1), ROLLOUT_AXES_ON_ONE_DEVICE) if n == 1 else make(devices, (n, 1))
        return {**{role: main for role in Role}, Role.ROLLOUT: second}
    half = n // 2
    first = make(devices[:half], default_shape(half))
    second = make(devices[half:], default_shape(half))
    return {**{role: first for role in Role}, Role.ROLLOUT: second}


def reachable_layouts(devices: Sequence[jax.Device] | None = None) -> list[str]:
    """The standard layouts the given devices can form."""
    count = len(devices) if devices is not None else len(jax.devices())
    return [layout for layout in LAYOUTS if layout_problem(layout, count) is None]


def describe_mesh(mesh: Any) -> dict[str, Any]:
    """A JSON-ready description: axis names, shape per axis, device ids in mesh order."""
    if mesh is None:
        return {"axis_names": [], "shape": {}, "device_ids": []}
    return {
        "axis_names": list(mesh.axis_names),
        "shape": {str(k): int(v) for k, v in dict(mesh.shape).items()},
        "device_ids": [int(d.id) for d in np.asarray(mesh.devices).flatten()],
    }


def describe_meshes(role_to_mesh: Mapping[Role, Any]) -> dict[str, dict[str, Any]]:
    return {role.value: describe_mesh(mesh) for role, mesh in role_to_mesh.items()}
