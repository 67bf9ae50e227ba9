"""The check every batch program passes before it is compiled: its figure against the device.

A program the lab compiles for a batch (the sampler, the log-probs, the optimizer step) is
sized first from the shapes it is about to get (``model.memory``: the planner's figure) and
refused, before XLA is asked, when some device of its mesh does not have that much free
(``core.limits.device_free_bytes``: the allocator's limit less what is in use, or
``$RLCLUSTER_LAB_DEVICE_MEMORY`` on devices without allocator figures). The refusal is a
``TooLargeError`` naming both figures and the knobs that make the batch smaller. Where XLA
refuses all the same (``RESOURCE_EXHAUSTED`` while compiling or running), ``xla_refusal`` says
so in the same words, with the planner's figure beside XLA's.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from rlcluster_lab.core.compile_options import stop_at_first
from rlcluster_lab.core.limits import DEVICE_LIMIT_ENV, TooLargeError, device_free_bytes, fmt_bytes
from rlcluster_lab.model.memory import ProgramBytes, Split

# The knobs that make a batch program smaller, the likeliest first (``core.knobs``: the lab and
# the CLI name each as their own widget or flag).
SMALLER_BATCH = ("prompts_per_step", "group_size", "max_tokens")


def _placed(leaf: Any) -> bool:
    """Whether ``leaf`` lies on devices: an array, or an abstract one (``jax.ShapeDtypeStruct``) with a sharding."""
    return isinstance(leaf, jax.Array) or getattr(leaf, "sharding", None) is not None


def _device_bytes(leaf: Any) -> dict[Any, int]:
    """The bytes ``leaf`` holds (or, abstract, would hold) on each device of this process, each shard once."""
    sharding = leaf.sharding
    if str(getattr(sharding, "memory_kind", None)) in ("pinned_host", "unpinned_host"):
        return {}  # host memory: not the device's
    try:
        each = math.prod(sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        return dict.fromkeys(sharding.device_set, each)
    except Exception:  # noqa: BLE001 - shards of unequal sizes: count them one by one
        return dict(Counter({s.device: s.data.nbytes for s in leaf.addressable_shards}))


def arguments(tree: Any) -> tuple[dict[Any, int], int]:
    """What a program's arguments ``tree`` hold: per device the bytes of its device arrays (already
    in use there; abstract arrays with a sharding count as placed), and the bytes of its host values
    (NumPy, or abstract arrays without a sharding), which the call copies to every device of the program."""
    resident: Counter = Counter()
    host = 0
    for leaf in jax.tree.leaves(tree):
        if _placed(leaf):
            resident.update(_device_bytes(leaf))
        elif isinstance(leaf, (np.ndarray, np.generic, jax.ShapeDtypeStruct)):
            host += math.prod(leaf.shape) * leaf.dtype.itemsize
    return dict(resident), host


def split_of(state: Any) -> Split:
    """How the lab model's ``state`` divides its residual stream, heads, MLP units and vocabulary
    over its devices (read from the last dimension of its embedding's and kernels' shards); rows are
    not divided: a batch comes in whole."""
    ways: dict[str, int] = {}
    targets = {
        "embed/embedding": "embed",
        "attn/q/kernel": "q_heads",
        "attn/k/kernel": "kv_heads",
        "mlp/gate/kernel": "mlp",
        "head/kernel": "vocab",
    }
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        hit = next((v for t, v in targets.items() if f"{t}/" in f"{name}/"), None)
        if hit is not None and _placed(leaf):
            ways[hit] = max(1, leaf.shape[-1] // max(1, leaf.sharding.shard_shape(leaf.shape)[-1]))
    return Split(**ways)


def lora_rank_of(state: Any) -> int:
    """The rank of the adapters in ``state`` (0: none)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if "lora_a" in jax.tree_util.keystr(path):
            return int(leaf.shape[-1])
    return 0


def platform_of(tree: Any) -> str:
    """The platform of the first device array in ``tree`` (the default backend's when it holds none)."""
    for leaf in jax.tree.leaves(tree):
        if _placed(leaf):
            return next(iter(leaf.sharding.device_set)).platform
    return jax.default_backend()


def model_program(
    program: Callable[..., ProgramBytes], config: Any, state: Any, *shape: int, **more: Any
) -> Callable[[int], ProgramBytes]:
    """``program`` (a figure of ``model.memory``) for the lab model whose state is ``state`` and a
    batch of ``shape``, as ``check_program`` asks for it: by the bytes of its arguments."""
    split, lora_rank, platform = split_of(state), lora_rank_of(state), platform_of(state)
    return lambda given: program(config, *shape, given, split=split, platform=platform, lora_rank=lora_rank, **more)


def check_program(
    figure: Callable[[int], ProgramBytes], args: Any, what: str, knobs: Sequence[str], fix: str
) -> ProgramBytes:
    """Refuse the program ``figure`` sizes before it is compiled over ``args``, when a device of
    its mesh has less free than it would add; returns its figure on its busiest device.

    ``figure(arguments)``: its bytes on a device whose arguments hold ``arguments`` bytes. What
    ``args`` already hold on a device is in use there, so a device must have free what the
    program needs beside it. ``what``: the program and its batch, for the message; ``knobs``: the
    knobs that make it smaller (``core.knobs``), the likeliest first; ``fix``: the same in the
    caller's terms.

    Raises:
        TooLargeError: a device cannot hold it; the message names both figures.
    """
    resident, host = arguments(args)
    devices = sorted(resident, key=lambda d: d.id) or [jax.devices()[0]]
    busiest = max(devices, key=lambda d: resident.get(d, 0))
    for device in devices:
        free = device_free_bytes(device)
        if free is None:
            continue
        planned = figure(resident.get(device, 0) + host)
        need = planned.total - resident.get(device, 0)
        if need > free:
            source = f"${DEVICE_LIMIT_ENV}" if os.environ.get(DEVICE_LIMIT_ENV) else "its allocator's memory_stats()"
            terms = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in _largest_terms(planned.temporaries))
            problem = (
                f"{what} needs about {fmt_bytes(need)} on {device.platform} device {device.id} beside what it "
                f"already holds there (the planner's figure: {fmt_bytes(planned.total)} in all, temporaries "
                f"{fmt_bytes(planned.temporary_bytes)}: {terms}); the device has {fmt_bytes(max(free, 0))} free "
                f"({source}), so the program was not compiled"
            )
            raise TooLargeError(f"{problem}: {fix}", knobs=tuple(knobs), problem=problem + ".")
    if getattr(_CHECK_ONLY, "on", False):
        raise Checked
    return figure(resident.get(busiest, 0) + host)


_CHECK_ONLY = threading.local()


class Checked(Exception):  # noqa: N818 - not an error: the signal that ends a check-only call
    """Raised by ``check_program`` inside ``check_only`` once the program's figure has passed."""


def check_only(operation: Callable[[], Any]) -> None:
    """Call ``operation`` up to the first batch program it checks (``check_program``), on this
    thread, and stop there: nothing is compiled or run, and a program that does not fit is
    refused as the call itself would refuse it. (An operation that checks no program runs whole.)"""
    stop_at_first(_CHECK_ONLY, Checked, operation)


def _largest_terms(terms: Any, top: int = 3) -> list[tuple[str, int]]:
    return sorted(((k, v) for k, v in terms.items() if v), key=lambda kv: -kv[1])[:top]


# XLA's own refusal: "RESOURCE_EXHAUSTED: ... the total memory required for HLO temporaries (33.91G)
# exceeds available HBM (15.75G)" (XLA:TPU), or an allocator's "Out of memory while trying to allocate".
_XLA_FIGURES = re.compile(r"\(([\d.]+)([KMGT]?)i?B?\)\s+exceeds available \w+\s+\(([\d.]+)([KMGT]?)i?B?\)")


def xla_figures(message: str) -> tuple[int, int] | None:
    """The bytes XLA's refusal for memory says a program needs and the device has, or None. XLA
    writes binary units: ``(18.71G)`` is 18.71 GiB, the program's arguments, outputs and
    temporaries together (XLA:TPU's buffer assignment of a refused llama3-8b step adds up to it)."""
    found = _XLA_FIGURES.search(message) if "RESOURCE_EXHAUSTED" in message else None
    if found is None:
        return None
    needed, available = (int(float(found[i]) * 1024 ** " KMGT".index(found[i + 1] or " ")) for i in (1, 3))
    return needed, available


@contextlib.contextmanager
def xla_refusal(planned: ProgramBytes | None, what: str, knobs: Sequence[str], fix: str) -> Iterator[None]:
    """Say XLA's ``RESOURCE_EXHAUSTED`` (while compiling or running the program inside) in the lab's
    words: a ``TooLargeError`` with XLA's figures where its message gives them, the planner's
    beside them, and the knobs that make the batch smaller. Any other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        found = _XLA_FIGURES.search(text)
        xla = (
            f"XLA needs {found.group(1)} {found.group(2) or ''}B of temporaries where the device has "
            f"{found.group(3)} {found.group(4) or ''}B"
            if found
            else f"XLA: {' '.join(text.split())[:200]}"
        )
        planner = f"; the planner's figure was {fmt_bytes(planned.total)}" if planned is not None else ""
        problem = f"XLA refused {what} for the device's memory ({xla}){planner}; nothing of the cluster changed"
        raise TooLargeError(f"{problem}: {fix}", knobs=tuple(knobs), problem=problem + ".") from exc
