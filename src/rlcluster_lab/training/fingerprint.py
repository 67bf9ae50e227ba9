"""A hashable description of an optax transformation, so equal optimizers share compiled code.

A fresh ``optax.adam(1e-3)`` is a new pair of closures every time; keyed by identity, every
rebuilt cluster would compile the training step again and keep the old executable. The
description is structural: a function is its code, defaults, closure cells and the globals it
reads; a hyper-parameter its value. What cannot be described by value is described by identity
and returned in ``pins``, kept alive with the description so their ids are never reused.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any

import numpy as np

_SMALL_ARRAY = 4096  # elements: a NumPy array up to this size is described by value


def describe(obj: Any) -> tuple[Any, list[Any]]:
    """(hashable description, objects described by identity) of ``obj``."""
    pins: list[Any] = []
    return _describe(obj, pins, {}), pins


# A transformation's description while its ``update`` lives (the training step describes it at every call).
_BY_UPDATE: weakref.WeakKeyDictionary[Any, tuple[type, tuple[Any, ...], Any, list[Any]]] = weakref.WeakKeyDictionary()


def describe_transformation(tx: Any) -> tuple[Any, list[Any]]:
    """``describe(tx)`` for an optax transformation (a tuple of functions), remembered per object."""
    fields = tuple(tx) if isinstance(tx, tuple) else ()
    if not fields or not all(isinstance(f, types.FunctionType) for f in fields):
        return describe(tx)
    update, refs = fields[-1], tuple(weakref.ref(f) for f in fields)
    hit = _BY_UPDATE.get(update)
    if hit is not None and hit[0] is type(tx) and all(r() is f for r, f in zip(hit[1], fields)):
        return hit[2], hit[3]
    desc, pins = describe(tx)
    _BY_UPDATE[update] = (type(tx), refs, desc, pins)
    return desc, pins


def _describe(obj: Any, pins: list[Any], seen: dict[int, int]) -> Any:
    if obj is None or isinstance(obj, (bool, int, str, bytes)):
        return (type(obj).__name__, obj)
    if isinstance(obj, float):
        return ("float", obj.hex())  # NaN equals NaN here, and -0.0 differs from 0.0
    if isinstance(obj, complex):
        return ("complex", obj.real.hex(), obj.imag.hex())
    if isinstance(obj, np.generic):
        return ("np", obj.dtype.str, obj.tobytes())
    if isinstance(obj, np.dtype):
        return ("dtype", obj.str)
    if isinstance(obj, np.ndarray) and obj.size <= _SMALL_ARRAY and obj.dtype.kind in "biufc":
        return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, types.ModuleType):
        return ("module", obj.__name__)
    key = id(obj)
    if key in seen:  # a cycle (a closure that refers to itself): its position in the walk
        return ("cycle", seen[key])
    seen[key] = len(seen)
    if isinstance(obj, (tuple, list)):
        # A NamedTuple (an optax state or transformation) is told apart by its class.
        kind = type(obj).__name__ if type(obj) in (tuple, list) else _pinned(type(obj), pins)
        return ("seq", kind, *(_describe(x, pins, seen) for x in obj))
    if isinstance(obj, dict):
        return ("dict", *((_describe(k, pins, seen), _describe(v, pins, seen)) for k, v in obj.items()))
    if isinstance(obj, functools.partial):
        return ("partial", *(_describe(x, pins, seen) for x in (obj.func, obj.args, dict(obj.keywords))))
    if isinstance(obj, types.MethodType):
        return ("method", _describe(obj.__func__, pins, seen), _describe(obj.__self__, pins, seen))
    if isinstance(obj, types.FunctionType):
        return _describe_function(obj, pins, seen)
    return _pinned(obj, pins)


def _pinned(obj: Any, pins: list[Any]) -> tuple[str, str, int]:
    pins.append(obj)
    return ("id", type(obj).__qualname__, id(obj))


def _describe_function(fn: types.FunctionType, pins: list[Any], seen: dict[int, int]) -> Any:
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(_describe(cell.cell_contents, pins, seen))
        except ValueError:  # an empty cell
            cells.append(("empty",))
    # The globals the code (and functions defined inside it) reads: a module-level function or
    # class by identity (the same object for every caller), a plain value by value.
    read = {}
    for name in sorted(_global_names(fn.__code__)):
        if name in fn.__globals__:
            value = fn.__globals__[name]
            plain = value is None or isinstance(value, (bool, int, float, complex, str, bytes, types.ModuleType))
            read[name] = _describe(value, pins, seen) if plain else _pinned(value, pins)
    defaults = (_describe(fn.__defaults__, pins, seen), _describe(fn.__kwdefaults__, pins, seen))
    return ("function", fn.__module__, fn.__qualname__, fn.__code__, *defaults, tuple(cells), tuple(read.items()))


def _global_names(code: types.CodeType) -> set[str]:
    nested = (_global_names(const) for const in code.co_consts if isinstance(const, types.CodeType))
    return set(code.co_names).union(*nested)
