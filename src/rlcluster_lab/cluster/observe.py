"""A read-only look inside the cluster's operations, at the moment of the work.

From outside, a memory walk sees only the before and the after of an operation (P14). Each
operation calls ``at_work`` just before its work, handing it the states the work reads that the
cluster does not hold (the anchor's device copy, P10); an observer (``observing``) measures there.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rlcluster_lab.core.roles import Role

WorkObserver = Callable[[Role, Mapping[str, Any]], None]
"""``observer(role, working)``: ``working`` names the states the work reads beyond the cluster's own."""

_OBSERVERS: weakref.WeakKeyDictionary[Any, WorkObserver] = weakref.WeakKeyDictionary()


def at_work(state: Any, role: Role, working: Mapping[str, Any] | None = None) -> None:
    """Called by an operation on the cluster's ``state`` just before its work."""
    if (observer := _OBSERVERS.get(state)) is not None:
        observer(role, dict(working or {}))


@contextlib.contextmanager
def observing(cluster: Any, observer: WorkObserver) -> Iterator[None]:
    """Call ``observer`` at every operation's work point on ``cluster`` within the block; a
    ``RuntimeError`` when the cluster already has one (one at a time, so none is lost)."""
    state = cluster.state
    if state in _OBSERVERS:
        raise RuntimeError("this cluster already has a work observer: finish that measurement before starting another")
    _OBSERVERS[state] = observer
    try:
        yield
    finally:
        _OBSERVERS.pop(state, None)
