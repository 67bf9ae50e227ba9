"""The rollout-engine protocol every engine follows, built-in or a user's own: constructed as
``Engine(rollout_actor=..., tokenizer=..., mesh=..., rollout_config=...)``, it samples with the
module ``model()`` returns, scores completions, and takes new weights through
``update_params(params, filter_types)``; a mesh it picks itself is exposed as ``mesh`` (P7)."""

from __future__ import annotations

import abc
import copy
import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict
from jax._src.array import ArrayImpl  # a concrete array's type (not public; see _VariableIndex.set)
from jax.sharding import Mesh, NamedSharding

from rlcluster_lab.core.config import RolloutConfig
from rlcluster_lab.core.limits import TooLargeError
from rlcluster_lab.core.states import model_split
from rlcluster_lab.model import logps_from_state
from rlcluster_lab.model.sampling import check_prompts, prompt_width, sample
from rlcluster_lab.placement import events
from rlcluster_lab.placement.chunks import chunk_leaves
from rlcluster_lab.placement.reshard import Batch, batch


@dataclasses.dataclass(frozen=True)
class RolloutOutput:
    """Completions of one generate call."""

    text: list[str]
    tokens: np.ndarray  # (B, max_new) completion ids, padded with pad_id after EOS
    logprobs: np.ndarray  # (B, max_new) log-probs of the sampled ids (0 at padding)
    left_padded_prompt_tokens: np.ndarray  # (B, P)


class RolloutEngine(abc.ABC):
    """Base class of rollout engines: subclasses implement ``model()``; sampling, scoring and weight
    updates work on that module. ``owns_weights``: ``update_params`` writes into buffers of the
    engine's own (no aliasing of the trainer's arrays)."""

    owns_weights: bool = False
    # The chunk size of the sync in progress (P13's order, set by the cluster; None: one piece).
    sync_chunk_bytes: int | None = None

    def __init__(
        self,
        rollout_actor: nnx.Module,
        tokenizer: Any,
        *,
        mesh: Mesh | None = None,
        rollout_config: RolloutConfig,
        cache_size: int | None = None,
        reshard: str = "xla",
    ) -> None:
        type(self).check(rollout_actor, rollout_config)
        self.rollout_actor = rollout_actor  # the model the cluster handed over
        self.tokenizer = tokenizer
        self.rollout_config = rollout_config  # the TRAIN config, as given
        # The KV cache size the cluster hands over (the largest over modes), when it hands one.
        self.cache_size = cache_size
        # Not exposed as ``mesh``: an engine that exposes one replaces the rollout mesh (P7).
        self.given_mesh = mesh
        self.reshard = reshard  # how update_params changes layouts: the config's strategy (set by the cluster)
        # One seed offset per generate call, drawn under a lock, so calls from several threads
        # never draw the same one.
        self._draws, self._draw_lock = 0, threading.Lock()

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        """P6: raise ``ConfigError`` if this engine cannot take this model and config (before anything is
        allocated, and in the constructor); returns the facts it looked at, for the decision trace."""
        return {}

    @classmethod
    def settle_mesh(cls, mesh: Mesh, rollout_config: RolloutConfig) -> Mesh:
        """The mesh this engine keeps its weights on when given ``mesh``: ``mesh`` itself, unless
        the engine arranges the devices its own way (the vllm stand-in, P7). A class method, so the
        checks before a build place the rollout's model where the engine will."""
        return mesh

    @abc.abstractmethod
    def model(self) -> nnx.Module:
        """The module this engine samples with."""

    def pad_id(self) -> int:
        return int(self.tokenizer.pad_id)

    def eos_id(self) -> int:
        return int(self.tokenizer.eos_id)

    def generate(self, prompts: list[str], rollout_config: RolloutConfig) -> RolloutOutput:
        """Sample completions of ``prompts`` (a list of strings) with ``rollout_config``'s settings.

        Raises:
            TypeError: ``prompts`` is a bare string (pass ``["hello"]``) or holds a non-string.
            ConfigError: no prompts, a prompt outside the model's vocabulary, or a setting
                ``sample`` refuses (see ``rlcluster_lab.model.sampling.sample``).
        """
        prompts = check_prompts(prompts)  # a refused call draws no seed
        # A fresh seed per call, so repeated calls sample different completions.
        with self._draw_lock:
            draw, self._draws = self._draws, self._draws + 1
        try:
            return self.generate_with_seed(prompts, rollout_config, rollout_config.seed + draw)
        except TooLargeError:  # the batch did not fit the devices: nothing was sampled, the seed is not spent
            with self._draw_lock:
                if self._draws == draw + 1:  # unless another call has drawn since
                    self._draws = draw
            raise

    def generate_with_seed(self, prompts: list[str], rollout_config: RolloutConfig, seed: int) -> RolloutOutput:
        """``generate`` with the sampling seed given (raising as it does): it reads the engine's
        weights and changes nothing of the engine's (the seed ``generate`` draws next is untouched)."""
        prompts = check_prompts(prompts)
        graphdef, state = model_split(self.model())
        out = sample(
            graphdef,
            state,
            self.tokenizer,
            prompts,
            max_new_tokens=rollout_config.max_tokens_to_generate,
            temperature=rollout_config.temperature,
            cache_size=self._cache_size(rollout_config),
            seed=seed,
            eos_id=self.eos_id(),
            pad_id=self.pad_id(),
        )
        return RolloutOutput(
            text=list(out.text),
            tokens=np.asarray(out.tokens),
            logprobs=np.asarray(out.logprobs),
            left_padded_prompt_tokens=np.asarray(out.prompt_tokens),
        )

    def output_shape(self, prompts: list[str], rollout_config: RolloutConfig) -> tuple[int, int, int]:
        """(batch, prompt width, completion length) of what ``generate`` returns for ``prompts``,
        read from the prompts alone (nothing is sampled; refused as ``generate`` refuses them)."""
        prompts = check_prompts(prompts)
        steps = rollout_config.max_tokens_to_generate
        return len(prompts), prompt_width(self.tokenizer, prompts, steps, self._cache_size(rollout_config)), steps

    def _cache_size(self, rollout_config: RolloutConfig) -> int:
        return self.cache_size if self.cache_size is not None else rollout_config.kv_cache_size

    def twin(self, clones: Mapping[int, nnx.Module]) -> RolloutEngine:
        """A copy of this engine that samples with other modules (the lab's rehearsal runs a
        step on it, ``RLCluster.isolated``): each module it holds as an attribute that ``clones``
        maps (by ``id``) replaced by its clone, with a seed counter and caches of its own; the
        rest is shared and only read. An engine that keeps its model other than as an attribute,
        or changes other state of its own when it samples, overrides this."""
        twin = copy.copy(self)
        twin.__dict__.update({k: clones[id(v)] for k, v in vars(self).items() if id(v) in clones})
        twin.__dict__.pop("_variable_index", None)
        twin._draws, twin._draw_lock = 0, threading.Lock()
        return twin

    def get_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Per-token log-probs (B, C) under the engine's weights, ids checked on the host first
        (``TypeError`` for non-integers, ``ConfigError`` for a wrong shape or an id out of range)."""
        graphdef, state = model_split(self.model())
        return logps_from_state(
            graphdef, state, prompt_tokens, completion_tokens, self.pad_id(), self.rollout_config.temperature
        )

    def update_params(self, params: Any, filter_types: tuple[Any, ...] | None = None) -> None:
        """Take new weights, resharded onto this engine's own shardings: with ``filter_types`` (a sync,
        P13) the matching part of its model, in its current shardings and memory kind; without (shared
        roles kept together, P14) the whole state, in the source's memory kind. One reshard per sync or
        per chunk of at most ``sync_chunk_bytes``, each committed before the next (an emitted ``Phase``)."""
        index = self._index(filter_types)
        follow = filter_types is None
        if follow:
            # Keeping shared roles together may hand over part of a tree (a reference
            # has no adapters): only those leaves are replaced.
            src = flat_values(params)
            picked = tuple(j for j, k in enumerate(index.keys) if k in src)
            sources = [src[index.keys[j]] for j in picked]
            del src
        else:
            picked, sources = tuple(range(len(index.keys))), index.read(params)
        held = [index.get(j) for j in picked]
        # The model's shapes are fixed: the shardings and dtypes on both sides say it all.
        key = (self.sync_chunk_bytes, self.owns_weights, self.reshard, follow, picked)
        key += tuple((x.sharding, x.dtype) for x in (*sources, *held))
        plan = index.plan
        if plan is None or plan.key != key:
            plan = index.plan = SyncPlan.build(key, index, picked, sources, follow)
        shared = not self.owns_weights and all(h is x for h, x in zip(held, sources))
        del held  # the arrays being replaced: a chunked handover must not keep later chunks' alive
        if shared:
            # The model holds these very arrays (the actor itself, P3 shared): nothing to hand over,
            # every layout already the rollout's (the phase a route ends its layout changes with).
            for *_, move in plan.parts:
                events.emit(events.Routed(move.route))  # every leaf kept: the route says so
                events.emit(events.Phase("resharded"))
                events.emit(events.Phase("commit"))
            return
        for part, where, move in plan.parts:
            new = move.run([sources[i] for i in part])
            for j, y in zip(where, new):
                index.set(j, y)  # a leaf that is already the new array (a shared model) is left alone
            del new
            # The chunk is committed: the arrays it replaced are dropped (unless someone else holds them).
            events.emit(events.Phase("commit"))

    def assign(self, values: dict[tuple[Any, ...], Any], filter_types: tuple[Any, ...] | None = None) -> None:
        """Set arrays already in this engine's shardings and dtypes (path -> array) into its
        model, without resharding: the cluster restores a failed chunked sync with it."""
        index = self._index(filter_types)
        for j, k in enumerate(index.keys):
            if k in values:
                index.set(j, values[k])

    def held_targets(self, filter_types: tuple[Any, ...] | None = None) -> dict[tuple[Any, ...], Target]:
        """Path -> where each leaf the model holds lives (its sharding and dtype), in path order."""
        index = self._index(filter_types)
        return {k: index.target(j) for j, k in enumerate(index.keys)}

    def held_values(self, filter_types: tuple[Any, ...] | None = None) -> list[Any]:
        """The arrays the engine's model holds now (those matching ``filter_types``), in path order."""
        index = self._index(filter_types)
        return [index.get(j) for j in range(len(index.keys))]

    def _index(self, filter_types: tuple[Any, ...] | None) -> _VariableIndex:
        """The model's Variables matching ``filter_types``, found once per filter: the structure never
        changes after construction, and values are read and set on the Variables themselves."""
        model = self.model()
        cache = self.__dict__.setdefault("_variable_index", {})
        hit = cache.get(filter_types)
        if hit is None or hit.model is not model:
            state = nnx.state(model, *filter_types) if filter_types is not None else nnx.state(model)
            hit = cache[filter_types] = _VariableIndex.of(model, state)
        return hit


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a leaf goes: the sharding and dtype of the array it replaces (never that array,
    so a chunked handover does not keep the old arrays of later chunks alive)."""

    sharding: Any
    dtype: Any


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """A handover worked out once (P13): per chunk, the handed-over leaves it takes, the model's leaves
    it sets and its reshard (``placement.reshard.Batch``). Rebuilt only when ``key`` changes (the
    layouts, the chunk size, the strategy, whether the engine owns its weights)."""

    key: tuple[Any, ...]
    parts: tuple[tuple[tuple[int, ...], tuple[int, ...], Batch], ...]

    @classmethod
    def build(
        cls, key: tuple[Any, ...], index: _VariableIndex, picked: tuple[int, ...], sources: list[Any], follow: bool
    ) -> SyncPlan:
        limit, copy, strategy = key[:3]
        chunks = chunk_leaves([int(x.nbytes) for x in sources], limit) if limit else [range(len(picked))]
        parts = []
        for chunk in chunks:
            xs = [sources[i] for i in chunk]
            where = tuple(picked[i] for i in chunk)
            targets = [index.target(j, xs[n] if follow else None) for n, j in enumerate(where)]
            shapes = [(tuple(x.shape), x.dtype) for x in xs]
            labels = [index.labels[j] for j in where]
            dsts, dtypes = [t.sharding for t in targets], [t.dtype for t in targets]
            move = batch([x.sharding for x in xs], shapes, dsts, copy, labels, dtypes, strategy)
            parts.append((tuple(chunk), where, move))
        return cls(key, tuple(parts))


class _VariableIndex:
    """A model's Variables in path order, each read and set raw where it holds a plain array without
    hooks or typed accessors of its own, else through ``get_value``/``set_value`` (and the handed-over
    tree's the same way, ``read``)."""

    def __init__(self, model: nnx.Module, keys: list[tuple[Any, ...]], variables: list[nnx.Variable]) -> None:
        self.model = model
        self.keys = keys
        self.variables = variables
        self.labels = [leaf_path(k) for k in keys]
        self.raw = [_plain_variable(v) for v in variables]
        self.plan: SyncPlan | None = None  # the last handover's, while its layouts and knobs hold
        # The last handed-over tree's paths, the position of each of ours among them, and per
        # position the source Variable last found plain (read raw while it is the one there).
        self._reading: tuple[tuple[Any, ...], list[int], list[Any]] | None = None

    @classmethod
    def of(cls, model: nnx.Module, state: Any) -> _VariableIndex:
        pairs = sorted(((tuple(k), v) for k, v in nnx.to_flat_state(state)), key=lambda kv: leaf_path(kv[0]))
        return cls(model, [k for k, _ in pairs], [v for _, v in pairs])

    def read(self, params: Any) -> list[Any]:
        """The arrays of ``params`` (a sync's whole tree) in this index's path order; where each path sits
        and which source Variables read raw are kept while the paths and Variables stay (a steady sync
        hands over the actor's own Variables)."""
        paths, leaves = _flat_leaves(params)
        if self._reading is None or self._reading[0] != paths:
            position = {k: p for p, k in enumerate(paths)}
            if position.keys() != (keys := set(self.keys)):
                missing, extra = (
                    sorted(map(leaf_path, a - b))[:5] for a, b in ((keys, position.keys()), (position.keys(), keys))
                )
                raise ValueError(
                    "the new weights do not match the rollout model's parameter tree "
                    f"(missing: {missing}, unexpected: {extra}); sync from a model of the same architecture"
                )
            self._reading = (paths, [position[k] for k in self.keys], [None] * len(paths))
        _, order, plain = self._reading
        out = []
        for p in order:
            v = leaves[p]
            if v is plain[p]:
                out.append(v.get_raw_value())
            elif isinstance(v, nnx.Variable):
                plain[p] = v if _plain_variable(v) else None
                out.append(v.get_raw_value() if plain[p] is v else v.get_value())
            else:
                out.append(v)
        return out

    def get(self, j: int) -> Any:
        v = self.variables[j]
        return v.get_raw_value() if self.raw[j] else v.get_value()

    def set(self, j: int, x: Any) -> None:
        v = self.variables[j]
        if self.raw[j]:
            if v.get_raw_value() is x:
                return
            if type(x) is ArrayImpl:
                # A concrete array (no trace to leak) skips Flax's setter, whose trace-level checks were a
                # sixth of a large sync's handover; a tracer goes through it.
                object.__setattr__(v, "_raw_value", x)
            else:
                v.set_raw_value(x)
        elif v.get_value() is not x:
            v.set_value(x)

    def target(self, j: int, source: Any = None) -> Target:
        """Leaf j's destination: its current sharding and dtype; with ``source``, in the
        memory kind the source is in (P14: shared roles move together)."""
        held = self.get(j)
        sharding = held.sharding
        if source is not None and isinstance(sharding, NamedSharding):
            sharding = sharding.with_memory_kind(source.sharding.memory_kind)
        return Target(sharding, held.dtype)


def _plain_variable(v: nnx.Variable) -> bool:
    """Whether ``v``'s value is its raw array: no get/set hooks, no ``get_value``/``set_value`` of
    its own type's (Flax's way to transform a value), no hijax state."""
    meta, kind = v.get_metadata(), type(v)
    hooked = "on_get_value" in meta or "on_set_value" in meta or meta.get("hijax", False)
    own = kind.get_value is not nnx.Variable.get_value or kind.set_value is not nnx.Variable.set_value
    return not hooked and not own and isinstance(v.get_raw_value(), jax.Array)


def leaf_path(key: tuple[Any, ...]) -> str:
    """A flattened state key as the path the reports show: ``layers/0/attn/q/kernel``."""
    return "/".join(map(str, key))


def flat_values(tree: Any) -> dict[tuple[Any, ...], Any]:
    """Path -> array, from an ``nnx.State`` or a nested dict of arrays."""
    paths, leaves = _flat_leaves(tree)
    return {k: (_read(v) if isinstance(v, nnx.Variable) else v) for k, v in zip(paths, leaves)}


def _flat_leaves(tree: Any) -> tuple[tuple[tuple[Any, ...], ...], list[Any]]:
    """The paths of an ``nnx.State`` or a nested dict of arrays, and their leaves (a State's
    Variables as they are), in the tree's own order."""
    if isinstance(tree, nnx.State):
        flat = nnx.to_flat_state(tree)
        return tuple(map(tuple, flat.paths)), list(flat.leaves)
    pairs = flatten_dict(tree)
    return tuple(pairs), list(pairs.values())


def _read(v: nnx.Variable) -> Any:
    return v.get_raw_value() if _plain_variable(v) else v.get_value()
