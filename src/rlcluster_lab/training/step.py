"""The actor's optimizer step: a GRPO-style clipped objective with a KL term (P12).

The step is a pure jitted function of (trainable state, frozen state, optimizer state, batch);
the cluster feeds it the live actor and writes the new trainable state back. It is transactional
(``jitted_update``): a step that would leave a non-finite value returns its inputs (nothing is
donated) and says why in its ``rejected`` metric. The layers are one stacked array per weight
(``model.transformer``), so that check covers about a dozen leaves (two dozen with LoRA's
adapters), not a few per layer. Compiled steps are shared by every caller with an *equal*
optimizer (``fingerprint.describe``) and dropped once no live optimizer uses them. The step
runs at the platform's default matmul precision: P11 compares no gradient (``core.precision``).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlcluster_lab.core.compile_options import ProgramFamily, options_for, options_key, run
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.gathering import exchange, host_values
from rlcluster_lab.core.precision import traced_at, traced_precision
from rlcluster_lab.core.shardings import HOST_MEMORY_KINDS
from rlcluster_lab.core.states import WhileAlive
from rlcluster_lab.model import forward_logps
from rlcluster_lab.model.fits import SMALLER_BATCH, arguments, check_program, model_program, xla_refusal
from rlcluster_lab.model.logps import check_temperature, model_compiler_options, model_config_of, model_vocab_size
from rlcluster_lab.model.memory import update_program
from rlcluster_lab.model.transformer import ModelConfig
from rlcluster_lab.placement.boxes import shard_boxes
from rlcluster_lab.placement.transfers import shard_data
from rlcluster_lab.training.batch import validate_batch_arrays
from rlcluster_lab.training.fingerprint import describe_transformation

# The ``rejected`` metric of a step: 0 when it was applied, else the first problem found.
REJECTION_REASONS: dict[int, str] = {
    1: "the loss is not finite",
    2: "a gradient is not finite",
    3: "the update would make a parameter non-finite",
    4: "the update would make the optimizer state non-finite",
}


def rejection_reason(metrics: Mapping[str, Any]) -> str | None:
    """Why the step with these metrics kept the old parameters and optimizer state, or None
    when it was applied."""
    code = int(metrics.get("rejected", 0))
    return None if code == 0 else REJECTION_REASONS.get(code, f"rejected (code {code})")


def token_mean(sums: dict[str, jax.Array], tokens: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Summed terms (a dict with ``"loss"``) divided by the token count (at least 1): the loss and its metrics."""
    denom = jnp.maximum(tokens, 1.0)
    return sums["loss"] / denom, {k: v / denom for k, v in sums.items()}


def grpo_sums(
    model: nnx.Module, batch: dict[str, jax.Array], *, pad_id: int, temperature: jax.Array, beta: float, epsilon: float
) -> tuple[dict[str, jax.Array], jax.Array]:
    """The clipped policy-gradient loss plus ``beta`` times a k3 KL estimate, and its metrics,
    summed over real tokens (not divided), and the token count.

    Summed terms add up across micro-batches; dividing the total by the total count
    (``token_mean``) gives the mini-batch's token mean, which is what accumulation needs.
    """
    completion = batch["completion_tokens"]
    mask = (completion != pad_id).astype(jnp.float32)
    logps = forward_logps(model, batch["prompt_tokens"], completion, pad_id, temperature)
    ratio = jnp.exp(logps - batch["old_logps"])
    adv = batch["advantages"][:, None]
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - epsilon, 1 + epsilon) * adv)
    per_token = -surrogate
    kl = jnp.zeros_like(logps)
    if "ref_logps" in batch:
        delta = batch["ref_logps"] - logps
        kl = jnp.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
    sums = {
        "loss": (per_token * mask).sum(),
        "kl": (kl * mask).sum(),
        "clip_fraction": ((jnp.abs(ratio - 1.0) > epsilon) * mask).sum(),
    }
    return sums, mask.sum()


def train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    trainable: Any,
    frozen: Any,
    opt_state: Any,
    batch: dict[str, Any],
    temperature: Any,
    *,
    pad_id: int,
    beta: float,
    epsilon: float,
    micro_batch_size: int | None = None,
    lower: bool = False,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """One optimizer step (P12); the new parameters and optimizer state keep the old ones' shardings.

    With ``micro_batch_size`` smaller than the batch, the gradient is accumulated over
    ``B // micro_batch_size`` micro-batches inside the same program (a scan), so the one
    update equals a step on the whole batch. The outputs are pinned to the inputs'
    shardings: left to itself XLA may hand back a leaf in another layout, and the next step
    would compile again. A step that would leave a non-finite value returns the inputs'
    parameters and optimizer state with ``metrics["rejected"]`` > 0 (``rejection_reason``).
    ``lower``: return the step's program lowered for these arguments instead (``jax.stages.Lowered``;
    arrays or ``jax.ShapeDtypeStruct``s with shardings: nothing is compiled, run or allocated).

    Raises:
        TypeError / ConfigError: a malformed batch (shape, ids outside the vocabulary,
            NaN or inf), a temperature that is not finite and > 0, or a non-finite
            ``beta``/``epsilon``.
    """
    validate_batch_arrays(batch, model_vocab_size(graphdef, trainable, frozen))
    checked = check_temperature(temperature, allow_zero=False)
    if not isinstance(temperature, jax.Array):
        temperature = np.float32(checked)  # no program of its own
    for name, value in (("beta", beta), ("epsilon", epsilon)):
        if not math.isfinite(float(value)) or float(value) < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {value}")
    pad_id, beta, epsilon = int(pad_id), float(beta), float(epsilon)

    def sums_fn(model: nnx.Module, batch: dict[str, jax.Array], temperature: jax.Array) -> Any:
        return grpo_sums(model, batch, pad_id=pad_id, temperature=temperature, beta=beta, epsilon=epsilon)

    args = (trainable, frozen, opt_state, batch, temperature)
    key = ("grpo", pad_id, beta, epsilon)
    return run_update(tx, graphdef, args, micro_batch_size, key, sums_fn, "grpo_train_step", lower=lower)


# The knobs that make a training step smaller: its rows at once first (``core.knobs``).
TRAIN_BATCH = ("train_micro_batch_size", "mini_batch_size", *SMALLER_BATCH)


def run_update(
    tx: optax.GradientTransformation,
    graphdef: nnx.GraphDef,
    args: tuple[Any, Any, Any, dict[str, Any], Any],
    micro_batch_size: int | None,
    key: tuple[Any, ...],
    sums_fn: Any,
    name: str,
    *,
    lower: bool = False,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """Run ``jitted_update``'s program on ``args`` (trainable, frozen, opt_state, batch, extra),
    compiled once per optimizer description, loss ``key``, layouts, micro-batch count, compiler
    options and precision (the train step's: ``core.precision``); ``lower``: lowered, not run."""
    trainable, frozen, opt_state, batch, _ = args
    keep = (_sharding_key(trainable), _sharding_key(opt_state))
    rows, width = batch["prompt_tokens"].shape
    pieces = accumulation_steps(rows, micro_batch_size)
    options = model_compiler_options(graphdef, trainable, frozen)
    precision = traced_precision("train step")
    full = (graphdef, *key, keep, pieces, options_key(options), precision)

    def build() -> Any:
        return jitted_update(graphdef, keep, pieces, sums_fn, name, options, precision)

    if lower:
        return _STEPS.call(tx, full, build, *args, lower=True)
    length = batch["completion_tokens"].shape[1]
    what = f"a training step over {rows:,} completions of {width} + {length} tokens"
    what += f" in {pieces} micro-batches" if pieces > 1 else ""
    fix = "train on fewer rows at once (mini_batch_size, train_micro_batch_size)"
    figure = update_figure(graphdef, args, pieces, value_head=key[0] == "value")
    planned = None if figure is None else check_program(figure, args[:4], what, TRAIN_BATCH, fix)
    with xla_refusal(planned, what, TRAIN_BATCH, fix):
        return _STEPS.call(tx, full, build, *args)


def update_figure(graphdef: nnx.GraphDef, args: tuple[Any, ...], pieces: int, *, value_head: bool = False) -> Any:
    """The planner's figure for ``run_update``'s program over ``args`` (trainable, frozen, opt_state,
    batch, ...) in ``pieces`` micro-batches, as ``model.fits.check_program`` asks for it (None for a
    model that is not the lab's own)."""
    trainable, frozen, opt_state, batch = args[:4]
    config = model_config_of(graphdef, trainable, frozen)
    if not isinstance(config, ModelConfig):
        return None
    sizes = [max(arguments(tree)[0].values(), default=0) for tree in (trainable, opt_state)]
    (rows, width), length = batch["prompt_tokens"].shape, batch["completion_tokens"].shape[1]
    return model_program(
        update_program,
        config,
        (trainable, frozen),
        rows // pieces,
        width,
        length,
        trainable=sizes[0],
        optimizer=sizes[1],
        leaves=len(jax.tree.leaves((trainable, opt_state))) + 5,  # and the five metrics
        accumulating=pieces > 1,
        value_head=value_head,
    )


def accumulation_steps(batch_size: int, micro_batch_size: int | None) -> int:
    """How many micro-batches one step over ``batch_size`` rows accumulates (1: none).

    Raises:
        ConfigError: the batch is not a whole number of micro-batches.
    """
    if micro_batch_size is None or micro_batch_size >= batch_size:
        return 1
    if batch_size % micro_batch_size:
        raise ConfigError(
            f"a training step over {batch_size} rows cannot be split into micro-batches of train_micro_batch_size="
            f"{micro_batch_size}; make the batch (or mini_batch_size) a multiple of train_micro_batch_size"
        )
    return batch_size // micro_batch_size


def _sharding_key(tree: Any) -> tuple[Any, tuple[Any, ...]]:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(x.sharding for x in leaves)


@dataclasses.dataclass(slots=True, eq=False)
class _Entry:
    """One compiled program, what its key pins, and weak references to the optimizers using it."""

    program: Any
    pins: list[Any]
    users: list[weakref.ref] = dataclasses.field(default_factory=list)


class _Programs:
    """Compiled programs keyed by a description of what they compute.

    The key describes the optimizer by value (``describe_transformation``), so a rebuilt cluster
    with an equal optimizer finds the program compiled before. An entry holds weak references to
    the ``update`` functions of the optimizers that used it; when the last is collected the
    entry becomes idle, and only the ``idle_limit`` most recently idle are kept (at most
    ``limit`` entries in all, least recently used dropped first). The program reads the caller's
    optimizer from ``current_tx`` while jit traces it, so it never keeps its users alive.
    """

    def __init__(self, limit: int, idle_limit: int) -> None:
        self.limit = limit
        self.idle_limit = idle_limit
        self._entries: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()
        self._idle: collections.OrderedDict[Any, None] = collections.OrderedDict()
        # Re-entrant: a weak reference's callback may run (garbage collection) while the lock is held.
        self._lock = threading.RLock()
        self._local = threading.local()

    def current_tx(self) -> optax.GradientTransformation:
        return self._local.tx

    def call(
        self, tx: optax.GradientTransformation, key: tuple[Any, ...], build: Any, *args: Any, lower: bool = False
    ) -> Any:
        """``build()``'s program for (``tx``, ``key``), compiled once per description, run on ``args``
        (``lower``: lowered for them, traced with ``tx`` as a run would be)."""
        desc, pins = describe_transformation(tx)
        full = (desc, *key)
        user = getattr(tx, "update", None)
        with self._lock:
            entry = self._entries.get(full)
            if entry is None:
                entry = _Entry(build(), pins)
                self._entries[full] = entry
                while len(self._entries) > self.limit:
                    old, _ = self._entries.popitem(last=False)
                    self._idle.pop(old, None)
            self._entries.move_to_end(full)
            self._idle.pop(full, None)
            entry.users = [r for r in entry.users if r() is not None]
            if user is not None and not any(r() is user for r in entry.users):
                try:
                    entry.users.append(weakref.ref(user, lambda _r, full=full: self._user_gone(full)))
                except TypeError:  # not weakly referable: the entry is released only when evicted
                    pass
        outer = getattr(self._local, "tx", None)
        self._local.tx = tx
        try:
            return entry.program.lower(*args) if lower else run(entry.program, *args)
        finally:
            self._local.tx = outer

    def _user_gone(self, full: Any) -> None:
        with self._lock:
            entry = self._entries.get(full)
            if entry is None or any(r() is not None for r in entry.users):
                return
            self._idle[full] = None
            self._idle.move_to_end(full)
            self._trim_idle(self.idle_limit)

    def _trim_idle(self, keep: int) -> int:
        released = 0
        while len(self._idle) > keep:
            old, _ = self._idle.popitem(last=False)
            if self._entries.pop(old, None) is not None:
                released += 1
        return released

    def release_unused(self) -> int:
        """Release every idle program now; returns how many."""
        with self._lock:
            return self._trim_idle(0)

    def __len__(self) -> int:
        return len(self._entries)


# A few live configurations at a time, and the two most recently dropped: each compiled step
# holds tens of MB of host memory.
_STEPS = _Programs(limit=8, idle_limit=2)
_INITS = _Programs(limit=8, idle_limit=2)


def leaf_finite(x: jax.Array) -> jax.Array:
    """True when every element of ``x`` is finite (a scalar).

    Written with ``lax`` primitives: ``jnp.isfinite`` and ``jnp.all`` are jitted functions, each
    a nested call to trace for every leaf checked.
    """
    return jax.lax.reduce_and(jax.lax.is_finite(x), tuple(range(x.ndim)))


def _all_finite(tree: Any) -> jax.Array:
    flags = [leaf_finite(x) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.bool_(True)


def finite_flags(arrays: list[jax.Array], *, in_place: bool | None = None) -> list[bool]:
    """For each array, whether every element is finite.

    Where an array's shards lie in host memory (XLA:CPU devices, or an accelerator's pinned
    host memory: an offloaded model), NumPy reads each shard's buffer on the host, one replica
    of each block: nothing is compiled, and a cold sync or optimizer step does not wait for XLA
    to build a reduction (nor asks an accelerator to compute on host memory, which XLA:GPU
    refuses for a program's output). With several processes each reads the shards it holds and
    a leaf is finite where every process found it so (``core.gathering.exchange``: every block
    lies on some process). An array found finite this way is remembered while it lives (its
    values never change): a LoRA actor's frozen backbone is read at its first sync, not at
    every one. The others (in an accelerator's memory) go through one compiled reduction where
    they live, a flag per leaf coming back on every process alike (``core.gathering``).

    Args:
        arrays: floating-point arrays.
        in_place: force the NumPy path (True) or the compiled one (False) for every array; None
            chooses per array as above.
    """
    readable = [_host_readable(x) if in_place is None else in_place for x in arrays]
    on_host = [i for i, r in enumerate(readable) if r]
    compiled = [i for i, r in enumerate(readable) if not r]
    flags = [False] * len(arrays)
    if on_host:
        # Which leaves are read on the host is a global fact: every process exchanges here (one
        # process: its own flags, nothing exchanged).
        everyone = exchange([_finite_in_place(arrays[i]) for i in on_host], "finite flags")
        for k, i in enumerate(on_host):
            flags[i] = all(process_flags[k] for process_flags in everyone)
    if compiled:
        leaves = [arrays[i] for i in compiled]
        (found,) = host_values([_FINITE_EACH.jitted(options_for(leaves))(leaves)])
        for i, f in zip(compiled, np.asarray(found)):
            flags[i] = bool(f)
    return flags


def _finite_in_place(x: jax.Array) -> bool:
    if _FINITE.get(x) and not x.is_deleted():
        return True
    finite = all(bool(np.isfinite(np.asarray(data)).all()) for data in _one_replica_each(x))
    if finite:  # a non-finite array is read again, each time it is asked about
        _FINITE.put(x, True)
    return finite


_FINITE = WhileAlive()  # array -> True: found finite while it lives


def _one_replica_each(x: jax.Array) -> list[jax.Array]:
    """The data of one shard of each distinct block of ``x``: the first in shard order (the
    blocks read from its layout, remembered per layout; a shard's ``replica_id`` computes the
    whole map anew)."""
    first: dict[Any, jax.Array] = {}
    for (_, data), (_, box) in zip(shard_data(x), shard_boxes(x)):
        first.setdefault(box, data)
    return list(first.values())


def _host_readable(x: jax.Array) -> bool:
    # Global facts only (the platform, the memory kind): with several processes every one of
    # them takes the same path for each leaf, as core.gathering requires.
    return str(x.sharding.memory_kind) in HOST_MEMORY_KINDS or all(d.platform == "cpu" for d in x.sharding.device_set)


def _finite_each(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([leaf_finite(x) for x in leaves])


_FINITE_EACH = ProgramFamily(_finite_each)


def jitted_update(
    graphdef: nnx.GraphDef,
    keep: tuple[Any, Any],
    pieces: int,
    sums_fn: Any,
    name: str,
    options: Mapping[str, Any] | None = None,
    precision: str | None = None,
) -> Any:
    """The optimizer step of any token-mean loss, jitted with pinned shardings.

    ``sums_fn(model, batch, extra)`` returns the loss and its metrics summed over real
    tokens (a dict with ``"loss"``) and the token count; the step divides by the count,
    accumulating over ``pieces`` micro-batches first. The program runs ``(trainable,
    frozen, opt_state, batch, extra)`` and returns the new trainable state, the new optimizer
    state and the metrics; it is transactional: ``rejected`` names the first non-finite value
    found (``REJECTION_REASONS``: the loss, a gradient, a new parameter, the new optimizer
    state), and then the inputs' parameters and optimizer state are returned unchanged.
    ``options``: XLA compiler options (None: defaults). ``precision``: the matmul precision its
    products are traced at, whatever the caller's context (None: the platform's default, the
    train step's in ``core.precision.PROGRAMS``).
    """
    (p_def, p_shardings), (o_def, o_shardings) = keep
    mesh = next((s.mesh for s in p_shardings if isinstance(s, NamedSharding)), None)
    metrics = NamedSharding(mesh, PartitionSpec()) if mesh is not None else None

    def step(
        trainable: Any, frozen: Any, opt_state: Any, batch: dict[str, jax.Array], extra: Any
    ) -> tuple[Any, Any, dict[str, jax.Array]]:
        def loss_fn(params: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
            return token_mean(*sums_fn(nnx.merge(graphdef, params, frozen), batch, extra))

        if pieces == 1:
            grads, m = jax.grad(loss_fn, has_aux=True)(trainable)
        else:
            grads, m = _accumulated_grads(graphdef, trainable, frozen, batch, extra, pieces, sums_fn)
        updates, new_opt_state = _STEPS.current_tx().update(grads, opt_state, trainable)
        new_trainable = optax.apply_updates(trainable, updates)
        grad_norm = optax.tree.norm(grads)
        # The first problem found, 0 if none (REJECTION_REASONS); with any, the old state stays.
        bad = [~jnp.isfinite(m["loss"]), ~_all_finite(grads), ~_all_finite(new_trainable), ~_all_finite(new_opt_state)]
        code = jnp.select(bad, [jnp.int32(c) for c in (1, 2, 3, 4)], jnp.int32(0))
        kept = jax.lax.cond(code == 0, lambda: (new_trainable, new_opt_state), lambda: (trainable, opt_state))
        m["grad_norm"] = grad_norm
        m["rejected"] = code.astype(jnp.float32)
        return (*kept, m)

    step.__name__ = step.__qualname__ = name  # the program's name in compilation reports
    out = (jax.tree.unflatten(p_def, p_shardings), jax.tree.unflatten(o_def, o_shardings), metrics)
    return jax.jit(traced_at(step, precision), out_shardings=out, compiler_options=dict(options) if options else None)


def _accumulated_grads(
    graphdef: nnx.GraphDef,
    trainable: Any,
    frozen: Any,
    batch: dict[str, jax.Array],
    extra: Any,
    pieces: int,
    sums_fn: Any,
) -> tuple[Any, dict[str, jax.Array]]:
    """The gradient of the batch's token-mean loss, summed micro-batch by micro-batch.

    Each micro-batch contributes the gradient of its *summed* loss; the total is divided once by
    the batch's token count (as the reference's accumulator does for token-weighted losses), so
    the result is the whole batch's gradient up to float rounding, whatever the tokens per
    micro-batch. A scan over every micro-batch, from sums of zeros, keeps one micro-batch's
    activations alive at a time and one copy of the model's program in the step.
    """
    split = {k: v.reshape(pieces, v.shape[0] // pieces, *v.shape[1:]) for k, v in batch.items()}

    def summed(params: Any, micro: dict[str, jax.Array]) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]:
        sums, tokens = sums_fn(nnx.merge(graphdef, params, frozen), micro, extra)
        return sums["loss"], (sums, tokens)

    def add(carry: Any, micro: dict[str, jax.Array]) -> tuple[Any, None]:
        grads, sums, tokens = carry
        g, (s, t) = jax.grad(summed, has_aux=True)(trainable, micro)
        grads = jax.tree.map(lambda a, b: a + b.astype(a.dtype), grads, g)
        sums = {k: sums[k] + s[k].astype(jnp.float32) for k in sums}
        return (grads, sums, tokens + t), None

    # The sums start at zero, in float32 whatever the parameters' dtype; their keys are read
    # from the loss's shapes (nothing computed).
    _, (shapes, _) = jax.eval_shape(summed, trainable, {k: v[0] for k, v in split.items()})
    start = (
        jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable),
        {k: jnp.zeros(v.shape, jnp.float32) for k in shapes for v in [shapes[k]]},
        jnp.zeros((), jnp.float32),
    )
    (grads, sums, tokens), _ = jax.lax.scan(add, start, split)
    denom = jnp.maximum(tokens, 1.0)
    grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, trainable)
    return grads, {k: v / denom for k, v in sums.items()}


def init_optimizer_state(tx: optax.GradientTransformation, params: Any, mesh: Any) -> Any:
    """``tx.init(params)`` in one compiled program, each leaf placed where it belongs.

    A leaf of the optimizer state that mirrors a parameter (Adam's moments) takes that
    parameter's sharding; any other leaf (a step count) is replicated on ``mesh``. Eager
    ``tx.init`` would compile a program per parameter shape instead. On CPU devices in one
    process, where a device's memory is the host's, a state whose every leaf is a constant
    (Adam's, SGD's: zeros and a zero count, read from the traced ``tx.init``) is written from
    the host in one transfer and nothing is compiled.
    """
    jaxpr, _, shardings = optimizer_layout(tx, params, mesh)
    flat, treedef = jax.tree.flatten(shardings)
    # Where every parameter lies in this process's host memory (the finiteness check's test).
    filled = constant_outputs(jaxpr) if all(_host_readable(x) for x in jax.tree.leaves(params)) else None
    if filled is not None:
        return jax.tree.unflatten(treedef, jax.device_put(filled, flat))
    options = options_for(params)
    key = (_sharding_key(params), treedef, tuple(flat), options_key(options))

    def init_optimizer_state(p: Any) -> Any:
        return _INITS.current_tx().init(p)

    def build() -> Any:
        return jax.jit(
            init_optimizer_state, out_shardings=shardings, compiler_options=dict(options) if options else None
        )

    return _INITS.call(tx, key, build, params)


def optimizer_layout(tx: optax.GradientTransformation, params: Any, mesh: Any) -> tuple[Any, Any, Any]:
    """``tx.init(params)`` traced (arrays or ``jax.ShapeDtypeStruct``s), the state's shapes, and
    the sharding of each of its leaves (``init_optimizer_state``'s rule)."""
    jaxpr, abstract = jax.make_jaxpr(tx.init, return_shape=True)(params)
    by_path = {_path_key(kp): x for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    replicated = NamedSharding(mesh, PartitionSpec())

    def pick(kp: Any, leaf: Any) -> Any:
        key = _path_key(kp)
        for start in range(len(key)):
            hit = by_path.get(key[start:])
            if hit is not None and hit.shape == leaf.shape:
                return hit.sharding
        return replicated

    return jaxpr, abstract, jax.tree_util.tree_map_with_path(pick, abstract)


def abstract_optimizer_state(tx: optax.GradientTransformation, params: Any, mesh: Any) -> Any:
    """The optimizer state ``init_optimizer_state`` would make, as ``jax.ShapeDtypeStruct``s with
    their shardings: nothing computed or allocated."""
    _, abstract, shardings = optimizer_layout(tx, params, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


# Operations that make an array of one value from one value: a constant goes through them.
_FILLS = frozenset({"broadcast_in_dim", "reshard", "convert_element_type"})


def constant_outputs(closed: Any) -> list[np.ndarray] | None:
    """The outputs of a traced function as host arrays when each is a constant (a literal, or a
    literal broadcast, resharded or cast to its shape and type), in output order; None when any
    is computed or weakly typed (a host array is strongly typed, the program's output would not be)."""
    produced = {id(v): eqn for eqn in closed.jaxpr.eqns for v in eqn.outvars}
    out = []
    for v in closed.jaxpr.outvars:
        if getattr(v.aval, "weak_type", False):
            return None
        source = v
        while not isinstance(source, jax.extend.core.Literal):
            eqn = produced.get(id(source))
            if eqn is None or eqn.primitive.name not in _FILLS or len(eqn.invars) != 1:
                return None
            source = eqn.invars[0]
        fill = np.asarray(source.val, dtype=v.aval.dtype)
        # All-zero bytes (Adam's moments): zeroed pages from the allocator, not a fill written through.
        zero = fill.tobytes() == bytes(fill.nbytes)
        out.append(np.zeros(v.aval.shape, fill.dtype) if zero else np.full(v.aval.shape, fill, dtype=fill.dtype))
    return out


def _path_key(path: Any) -> tuple[str, ...]:
    return tuple(str(k) for k in path)
