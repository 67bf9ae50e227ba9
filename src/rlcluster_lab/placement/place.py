"""Putting a model onto a mesh and into a memory kind (P5, P14): partition specs from the model's
logical axis names through the role's rules (the model's defaults when none); a leaf without
a spec is replicated."""

from __future__ import annotations

import functools
import gc
import sys
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlcluster_lab.core.compile_options import move_options, run_apart
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.shardings import MEMORY_KINDS, PlacementError, default_memory_kind, target_shardings
from rlcluster_lab.placement.programs import ProgramCache, compile_outside_mesh
from rlcluster_lab.placement.reshard import cast_many, reshard_many
from rlcluster_lab.rules.anchor import p8_repin_in_place


def put_on_memory_kind(tree: Any, memory_kind: str) -> Any:
    """The same tree with every array in ``memory_kind``; leaves already there are kept."""
    if memory_kind not in MEMORY_KINDS:
        raise PlacementError(f"unsupported memory kind {memory_kind!r}; use one of {MEMORY_KINDS}")

    leaves, treedef = jax.tree.flatten(tree)
    moving = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and x.sharding.memory_kind != memory_kind]
    if moving:
        xs = [leaves[i] for i in moving]
        targets = [x.sharding.with_memory_kind(memory_kind) for x in xs]
        if any(x.sharding.memory_kind == "pinned_host" for x in xs) and not device_put_reads_program_pins(
            next(iter(xs[0].sharding.device_set)).platform
        ):
            moved = _compiled_move(xs, targets)
        else:
            # One call for every leaf that moves: JAX dispatches the batch once.
            moved = jax.device_put(xs, targets)
        for i, y in zip(moving, moved):
            leaves[i] = y
    return jax.tree.unflatten(treedef, leaves)


@functools.cache
def device_put_reads_program_pins(platform: str) -> bool:
    """Whether this JAX's ``device_put`` can move an array a compiled program wrote into pinned host
    memory (the anchor's write-over), asked of JAX once per platform: some CPU clients refuse such
    a layout, where a compiled copy reads it. Asked on a thread of its own: the operation's mesh
    must not apply to the question."""
    device = jax.devices(platform)[0]
    one = jax.sharding.SingleDeviceSharding(device)

    def ask() -> None:
        pinned = jax.jit(lambda: jnp.zeros((2,)), out_shardings=one.with_memory_kind("pinned_host"))()
        jax.device_put(pinned, one.with_memory_kind(device.default_memory().kind)).block_until_ready()

    return run_apart(ask) is None


_MOVES = ProgramCache(16)


def _compiled_move(xs: list[jax.Array], targets: list[Any]) -> list[jax.Array]:
    """``xs`` copied to ``targets`` by one compiled program (one per layout, kept), for the arrays
    ``device_put`` cannot read (``device_put_reads_program_pins``)."""
    key = tuple((x.shape, x.dtype, x.sharding, t) for x, t in zip(xs, targets))
    program = _MOVES.get(key)
    if program is None:
        program, _ = compile_outside_mesh(jax.jit(_copies, out_shardings=list(targets)), xs, options=move_options(xs))
        _MOVES.put(key, program)
    return program(xs)


def _copies(xs: list[jax.Array]) -> list[jax.Array]:
    return list(xs)


def pin_anchor(source: Any, old: Any) -> Any:
    """P8: ``source`` copied to pinned host memory as the anchor snapshot, each leaf over the old
    anchor's buffer where ``rules.anchor.p8_repin_in_place`` says so (one compiled program per
    device order, the old buffers donated), else into a new buffer; a pinned leaf is kept. The old
    leaves written over are deleted when this returns."""
    leaves, treedef = jax.tree.flatten(source)
    same_tree = old is not None and jax.tree.structure(old) == treedef
    held = held_elsewhere(old) if same_tree else None  # counted before this function holds any leaf
    if held and any(held):
        # A view of the anchor in a reference cycle (``cluster.sync``) may hold its arrays: collect, then count again.
        gc.collect(1)
        held = held_elsewhere(old)
    olds = jax.tree.leaves(old) if same_tree else []
    groups: dict[tuple[Any, ...], list[int]] = {}  # leaves written over, by devices in mesh order
    new = []
    for i, x in enumerate(leaves):
        pinned = x.sharding.memory_kind == "pinned_host"
        same = bool(olds) and (olds[i].shape, olds[i].dtype, olds[i].sharding) == (x.shape, x.dtype, _pinned(x))
        if p8_repin_in_place(pinned, same, bool(held and held[i])):
            s = x.sharding  # a program's arguments share one mesh order of devices
            order = tuple(s.mesh.devices.flat) if isinstance(s, NamedSharding) else tuple(s.device_set)
            groups.setdefault(order, []).append(i)
        elif not pinned:
            new.append(i)
    programs = []
    for group in groups.values():
        targets, sources = [olds[i] for i in group], [leaves[i] for i in group]
        program = _write_over(targets, sources)
        if program is None:  # a backend that cannot compile it: new buffers, as before (nothing donated yet)
            new.extend(group)
        else:
            programs.append((group, targets, sources, program))
    for i, y in zip(new, put_on_memory_kind([leaves[i] for i in new], "pinned_host")):
        leaves[i] = y
    for group, targets, sources, program in programs:
        for i, y in zip(group, program(targets, sources)):
            leaves[i] = y
    return jax.tree.unflatten(treedef, leaves)


def _pinned(x: jax.Array) -> Any:
    return x.sharding.with_memory_kind("pinned_host")


_WRITE_OVER = ProgramCache(8)


def _write_over(olds: list[jax.Array], news: list[jax.Array]) -> Any:
    """The compiled program that writes ``news`` over ``olds`` (donated, pinned host), one per
    layout; None where the backend refused to compile it (remembered: not tried at every sync)."""
    key = tuple((x.shape, x.dtype, x.sharding, y.sharding) for x, y in zip(olds, news))
    hit = _WRITE_OVER.get(key)
    if hit is None:
        jitted = jax.jit(write_anchor_over, donate_argnums=0, out_shardings=[x.sharding for x in olds])
        try:
            hit, _ = compile_outside_mesh(jitted, olds, news, options=move_options(news))
        except Exception:  # noqa: BLE001 - e.g. an XLA that will not compute in host memory (XLA:GPU has refused to)
            hit = False
        _WRITE_OVER.put(key, hit)
    return hit or None


def write_anchor_over(old: list[jax.Array], new: list[jax.Array]) -> list[jax.Array]:
    """``new`` written over ``old`` (donated): ``.at[...].set`` makes XLA write the result into the
    donated input's buffer, where a bare copy of ``new`` would come back in a buffer of its own."""
    return [o.at[...].set(n) for o, n in zip(old, new)]


def held_elsewhere(tree: Any) -> list[bool]:
    """For each leaf of ``tree``, whether anything besides ``tree`` refers to it: CPython's reference
    counts, against the same structure holding fresh objects."""
    leaves, treedef = jax.tree.flatten(tree)
    fresh = [object() for _ in leaves]
    probe = jax.tree.unflatten(treedef, fresh)
    alone = [sys.getrefcount(x) for x in fresh]  # counted the same way as below: a zip's tuple would add one
    del probe
    counts = [sys.getrefcount(x) for x in leaves]
    return [n > m for n, m in zip(counts, alone)]


def place_model(
    model: nnx.Module,
    mesh: Mesh,
    rules: Iterable[tuple[str, Any]] | None = None,
    *,
    memory_kind: str | None = None,
    dtype: Any = None,
    role: str = "model",
    copy: bool = False,
    strategy: str = "xla",
) -> nnx.Module:
    """A new module whose every leaf is sharded on ``mesh`` per its partition specs (``model`` untouched),
    leaves already there kept unless ``copy``; layouts change by ``strategy`` (the config's ``reshard``)."""
    graphdef, state = nnx.split(model)
    kind = memory_kind or default_memory_kind(mesh)
    shardings = target_shardings(
        state, mesh, rules if rules is not None else DEFAULT_LOGICAL_AXIS_RULES, kind, role=role
    )
    values = nnx.to_pure_dict(state)
    if dtype is not None:
        leaves, treedef = jax.tree.flatten(values)
        # Cast in device memory (never on pinned host buffers); the reshard below puts the result in its kind.
        leaves = [
            x
            if x.dtype == jnp.dtype(dtype) or x.sharding.memory_kind == default_memory_kind(x)
            else jax.device_put(x, x.sharding.with_memory_kind(default_memory_kind(x)))
            for x in leaves
        ]
        values = jax.tree.unflatten(treedef, cast_many(leaves, [dtype] * len(leaves)))
    leaves, treedef = jax.tree.flatten(values)
    dsts = treedef.flatten_up_to(shardings)
    kinds = treedef.flatten_up_to(nnx.to_pure_dict(state, type))
    moved: list[Any] = [None] * len(leaves)
    # One reshard per kind of weight (base weights, LoRA adapters): a sync hands over one kind
    # (P13), so the programs compiled here for an engine's own copy are those its first sync runs.
    for kind in dict.fromkeys(kinds):
        picked = [i for i, k in enumerate(kinds) if k is kind]
        ys = reshard_many([leaves[i] for i in picked], [dsts[i] for i in picked], copy=copy, strategy=strategy)
        for i, y in zip(picked, ys):
            moved[i] = y
    nnx.replace_by_pure_dict(state, jax.tree.unflatten(treedef, moved))
    return nnx.merge(graphdef, state)
