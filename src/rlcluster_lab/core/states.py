"""A model's state (``nnx.state``) without walking its graph again while its Variables stay.

``nnx.state`` walks a module's whole graph: about 1 ms for the tiny model on a quiet core, and a
construction read each model's state about ten times, a sync twice. The Variables a walk finds
are remembered per module (while it lives). Before they are used again, the module is read as
a pytree down to its Variables (a tenth of the walk's time): the very same Variable objects in
the same order must come back, else the graph is walked anew. New values in the same Variables
(a training step, a sync) keep the walk; a Variable added, removed or replaced does not.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
from flax import nnx

Pairs = list[tuple[tuple[Any, ...], Any]]  # (path, Variable) in the order nnx.state gives them

_WALKED: dict[int, tuple[weakref.ref, Pairs]] = {}  # id(module) -> (the module, its walk)


def model_state(model: nnx.Module, *filters: Any) -> Any:
    """``nnx.state(model, *filters)``: the model's own Variables under their paths (one State,
    or one per filter when given several), from the last walk while its Variables stay."""
    key = id(model)
    hit = _WALKED.get(key)
    pairs = hit[1] if hit is not None and hit[0]() is model and _same_variables(model, hit[1]) else None
    if pairs is None:
        pairs = list(nnx.to_flat_state(nnx.state(model)))
        _WALKED[key] = (weakref.ref(model, lambda ref: _forget(key, ref)), pairs)
    state = nnx.State.from_flat_path(pairs)
    return state.filter(*filters) if filters else state


def _same_variables(model: nnx.Module, pairs: Pairs) -> bool:
    """The module still holds exactly these Variables, in this order (a module that holds one
    Variable in two places reads it twice as a pytree, never matches, and is always walked)."""
    found = jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return len(found) == len(pairs) and all(a is b for a, (_, b) in zip(found, pairs))


def _forget(key: int, ref: weakref.ref) -> None:
    """A remembered module is gone: its walk goes (unless a newer module took its id)."""
    if _WALKED.get(key, (None,))[0] is ref:
        _WALKED.pop(key, None)
