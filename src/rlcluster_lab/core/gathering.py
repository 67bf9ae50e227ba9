"""Reading what lives on other processes: small facts, and host values of global arrays.

Every function here is collective: every process calls it in the same order, and the path a
call takes is decided from global facts only (an array's sharding, the process count), so no
two processes wait on each other. Facts go through the coordination service's key-value store,
array values through device collectives (``jax.experimental.multihost_utils``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import jax
import numpy as np

from rlcluster_lab.core.hosts import processes_of

# A peer that never publishes has failed or taken another path: an error ends the run, not a silent wait.
EXCHANGE_TIMEOUT_S = 120.0

_SEQUENCE = itertools.count()  # the same on every process: calls happen in the same order
_PREFIX = "rlcluster_lab/"
_LAST: list[str] = []  # this process's key of its last exchange, deleted at the next one


def exchange(value: Any, what: str) -> list[Any]:
    """Every process's ``value`` (JSON-ready), indexed by process, on every process; ``what`` names it
    in the key and the error. A ``TimeoutError`` when a process did not publish within
    ``EXCHANGE_TIMEOUT_S`` (it failed, or the processes run different programs)."""
    if jax.process_count() == 1:
        return [value]
    from jax._src import distributed

    client = distributed.global_state.client  # process_count() > 1: the runtime is initialized
    key = f"{_PREFIX}{next(_SEQUENCE)}/{what}"
    mine = f"{key}/{jax.process_index()}"
    client.key_value_set(mine, json.dumps(value))
    out = []
    for p in range(jax.process_count()):
        try:
            out.append(json.loads(client.blocking_key_value_get(f"{key}/{p}", int(EXCHANGE_TIMEOUT_S * 1000))))
        except Exception as exc:  # the runtime raises its own error type for a deadline
            raise TimeoutError(
                f"process {p} did not publish {what!r} within {EXCHANGE_TIMEOUT_S:.0f} s: it failed, or the processes "
                f"are not running the same program ({type(exc).__name__}: {exc})"
            ) from exc
    # Every process published this exchange, so each had read the one before: that key is deleted
    # and the store holds at most two per process however many exchanges a run makes.
    if _LAST:
        client.key_value_delete(_LAST.pop())
    _LAST.append(mine)
    return out


def stored_facts() -> int:
    """How many of the facts ``exchange`` published the coordination service holds now (0 in one process)."""
    if jax.process_count() == 1:
        return 0
    from jax._src import distributed

    return len(distributed.global_state.client.key_value_dir_get(_PREFIX))  # several processes: the runtime is up


def summed(value: int, what: str) -> int:
    """The sum over processes of a per-process count (the count itself in one process)."""
    return int(sum(exchange(int(value), what)))


def any_process(flag: bool, what: str) -> bool:
    """True when ``flag`` is true on some process."""
    return any(exchange(bool(flag), what))


def host_values(values: list[Any]) -> list[np.ndarray]:
    """The whole value of each array on this host, whichever processes own its shards: this
    process's shard when replicated, else a gather; an array on some processes only (the split
    layout's rollout) is replicated among its owners, then broadcast from the first owner."""
    if jax.process_count() == 1:
        return [np.asarray(v) for v in values]
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    out: list[np.ndarray | None] = [None] * len(values)
    later: dict[int, list[int]] = {}  # first owning process -> indices to broadcast from it
    for i, v in enumerate(values):
        if not isinstance(v, jax.Array):
            out[i] = np.asarray(v)
            continue
        owners = processes_of(v.sharding.device_set)
        if len(owners) == jax.process_count():
            out[i] = np.asarray(
                v.addressable_data(0) if v.is_fully_replicated else multihost_utils.process_allgather(v, tiled=True)
            )
            continue
        later.setdefault(owners[0], []).append(i)
    me = jax.process_index()
    for source, idx in sorted(later.items()):
        local = []
        for i in idx:
            v = values[i]
            if not v.is_fully_replicated:
                # Replicated among its own devices first (only its owners compute).
                v = jax.jit(replicate, out_shardings=NamedSharding(v.sharding.mesh, PartitionSpec()))(v)
            local.append(np.asarray(v.addressable_data(0)) if v.addressable_shards else np.zeros(v.shape, v.dtype))
        for i, g in zip(idx, multihost_utils.broadcast_one_to_all(local, is_source=me == source)):
            out[i] = np.asarray(g)
    return out  # type: ignore[return-value]


def replicate(t: Any) -> Any:
    """The identity, compiled onto a replicated sharding to gather a value among its devices."""
    return t


def held_within(a: set[Any], b: set[Any], what: str) -> bool:
    """True when ``a`` is non-empty and within ``b`` on every process that holds any of ``a``
    (buffer identities are per process, so every process holding some answers together)."""
    facts = exchange([bool(a), a <= b], what)
    return any(has for has, _ in facts) and all(ok for has, ok in facts if has)
