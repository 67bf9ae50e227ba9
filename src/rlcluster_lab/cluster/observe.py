"""A read-only look inside the cluster's operations, at the moment of the work.

An operation enters its role's context, brings what it computes with to device (P14),
works, and offloads again; from outside, a memory walk only ever sees the before and
the after. ``at_work`` is called by each operation (``cluster.operations``) once
everything it computes with is where the work reads it, just before the work:
``generate`` with the rollout's model on device, the reference's log-probs with the
reference on device, the actor's log-probs with the anchor's device copy made (P10),
``update_actor`` with the actor and its optimizer state on device (P12).

An observer is registered per cluster with ``observing`` (kept beside the cluster's
state, which the operations are handed); it is given the role and the
states the work reads that the cluster does not hold itself (the anchor's device copy),
so a measurement taken there sees every buffer the work uses. Observers must not change
anything: the lab's step measurement (``lab.step_phases``) takes memory walks here.
Without an observer ``at_work`` does nothing.
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
    """Called by an operation just before its work, with everything it reads in place;
    ``state`` is the cluster's state (``RLCluster.state``) the operation was handed."""
    observer = _OBSERVERS.get(state)
    if observer is not None:
        observer(role, dict(working or {}))


@contextlib.contextmanager
def observing(cluster: Any, observer: WorkObserver) -> Iterator[None]:
    """Call ``observer`` at every operation's work point on ``cluster`` within the block.

    Raises:
        RuntimeError: the cluster already has an observer (one at a time, so none is lost).
    """
    state = cluster.state
    if state in _OBSERVERS:
        raise RuntimeError("this cluster already has a work observer: finish that measurement before starting another")
    _OBSERVERS[state] = observer
    try:
        yield
    finally:
        _OBSERVERS.pop(state, None)
