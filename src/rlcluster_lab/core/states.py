"""A model's state (``nnx.state``) without walking its graph again while its Variables stay.

The Variables a walk finds are remembered per module while it lives (``WhileAlive``). Before
they are used again the module is read as a pytree down to its Variables (a tenth of a walk):
the very same Variables in the same order must come back, else the graph is walked anew. New
values (a training step, a sync) keep the walk. ``model_split`` keeps the graphdef beside it.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
from flax import nnx


class WhileAlive:
    """Values remembered per object, by identity, while the object lives (never by an address
    or an id alone, which a later object may take)."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, obj: Any) -> Any:
        """The value remembered for ``obj``, or None."""
        hit = self._entries.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    def put(self, obj: Any, value: Any) -> None:
        key = id(obj)

        def forget(ref: weakref.ref) -> None:  # obj is gone: its entry goes, unless a newer object took its id
            if self._entries.get(key, (None,))[0] is ref:
                self._entries.pop(key, None)

        self._entries[key] = (weakref.ref(obj, forget), value)


_WALKED = WhileAlive()  # module -> the (path, Variable) pairs of its last walk


def model_state(model: nnx.Module, *filters: Any) -> Any:
    """``nnx.state(model, *filters)``: the model's own Variables under their paths (one State,
    or one per filter when given several), from the last walk while its Variables stay."""
    pairs = _WALKED.get(model)
    if pairs is None or not _same_variables(model, pairs):
        pairs = list(nnx.to_flat_state(nnx.state(model)))
        _WALKED.put(model, pairs)
    state = nnx.State.from_flat_path(pairs)
    return state.filter(*filters) if filters else state


_SPLITS = WhileAlive()  # module -> (the walk its graphdef was read with, the graphdef)


def model_split(model: nnx.Module, *filters: Any) -> tuple[Any, ...]:
    """``nnx.split(model, *filters)``, the graphdef kept while the module holds the same Variables, so
    the same graphdef object comes back call after call."""
    state = model_state(model)
    pairs = _WALKED.get(model)
    hit = _SPLITS.get(model)
    if hit is None or hit[0] is not pairs:
        hit = (pairs, nnx.graphdef(model))
        _SPLITS.put(model, hit)
    if not filters:
        return hit[1], state
    states = nnx.split_state(state, *filters)
    return (hit[1], *(states if isinstance(states, tuple) else (states,)))


def _same_variables(model: nnx.Module, pairs: list[tuple[tuple[Any, ...], Any]]) -> bool:
    """The module still holds exactly these Variables in this order (one held in two places reads
    twice, never matches, and is always walked)."""
    found = jax.tree.leaves(model, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return len(found) == len(pairs) and all(a is b for a, (_, b) in zip(found, pairs))
