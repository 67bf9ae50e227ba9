"""The rollout-engine protocol every engine follows, built-in or a user's own.

An engine is constructed as ``Engine(rollout_actor=..., tokenizer=...,
mesh=..., rollout_config=...)``. It samples with the module ``model()``
returns, scores completions, and takes new weights through
``update_params(params, filter_types)``. An engine that picks its own mesh
exposes it as ``mesh``; the cluster then records that mesh for the rollout
role (P7).
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.traverse_util import flatten_dict
from jax.sharding import Mesh, NamedSharding

from rlcluster_lab.core.config import RolloutConfig
from rlcluster_lab.model import logps_from_state
from rlcluster_lab.model.sampling import check_prompts, sample
from rlcluster_lab.placement.reshard import cast_many, log_cast, reshard_many


@dataclasses.dataclass(frozen=True)
class RolloutOutput:
    """Completions of one generate call."""

    text: list[str]
    tokens: np.ndarray  # (B, max_new) completion ids, padded with pad_id after EOS
    logprobs: np.ndarray  # (B, max_new) log-probs of the sampled ids (0 at padding)
    left_padded_prompt_tokens: np.ndarray  # (B, P)


class RolloutEngine(abc.ABC):
    """Base class of rollout engines.

    Subclasses must implement ``model()``; sampling, scoring and weight
    updates have working defaults that operate on that module.
    ``owns_weights`` says whether ``update_params`` must write into buffers
    of the engine's own (no aliasing of the trainer's arrays).
    """

    owns_weights: bool = False

    def __init__(
        self,
        rollout_actor: nnx.Module,
        tokenizer: Any,
        *,
        mesh: Mesh | None = None,
        rollout_config: RolloutConfig,
        cache_size: int | None = None,
    ) -> None:
        type(self).check(rollout_actor, rollout_config)
        self.rollout_actor = rollout_actor  # the model the cluster handed over
        self.tokenizer = tokenizer
        self.rollout_config = rollout_config  # the TRAIN config, as given
        # The KV cache size the cluster hands over (the largest over modes), when it hands one.
        self.cache_size = cache_size
        # Not exposed as ``mesh``: an engine that exposes one replaces the rollout mesh (P7).
        self.given_mesh = mesh
        # One seed offset per generate call; next() on a count is atomic, so calls from
        # several threads never draw the same one.
        self._draws = itertools.count()

    @classmethod
    def check(cls, rollout_actor: nnx.Module, rollout_config: RolloutConfig) -> dict[str, Any]:
        """P6: raise ``ConfigError`` if this engine cannot take this model and config.

        Returns the facts it looked at, for the decision trace. The cluster
        calls it before allocating anything; the constructor calls it too.
        """
        return {}

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
        return self.generate_with_seed(prompts, rollout_config, rollout_config.seed + next(self._draws))

    def generate_with_seed(self, prompts: list[str], rollout_config: RolloutConfig, seed: int) -> RolloutOutput:
        """``generate`` with the sampling seed given: it reads the engine's weights and changes
        nothing of the engine's (the seed ``generate`` draws next is untouched). The lab's
        rehearsal compiles a step's sampling programs through it.

        Raises:
            As ``generate``.
        """
        prompts = check_prompts(prompts)
        graphdef, state = nnx.split(self.model())
        out = sample(
            graphdef,
            state,
            self.tokenizer,
            prompts,
            max_new_tokens=rollout_config.max_tokens_to_generate,
            temperature=rollout_config.temperature,
            cache_size=self.cache_size if self.cache_size is not None else rollout_config.kv_cache_size,
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

    def get_per_token_logps(self, prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        """Per-token log-probs (B, C) under the engine's weights.

        Raises:
            TypeError: ids that are not integers.
            ConfigError: a batch of the wrong shape or an id outside the model's vocabulary
                (checked on the host by ``logps_from_state``).
        """
        graphdef, state = nnx.split(self.model())
        return logps_from_state(
            graphdef,
            state,
            prompt_tokens,
            completion_tokens,
            self.pad_id(),
            self.rollout_config.temperature,
        )

    def update_params(self, params: Any, filter_types: tuple[Any, ...] | None = None) -> None:
        """Take new weights, resharded onto this engine's own shardings.

        With ``filter_types`` (a weight sync, P13) the destination is the
        matching part of this engine's model, in its current shardings and
        memory kind. Without it (keeping shared roles together, P14) the whole
        state is taken, in the memory kind the source is in.
        """
        variables = self._variables(filter_types)
        dst = {k: v.get_value() for k, v in variables.items()}
        new_values = reshard_flat(
            flat_values(params), dst, copy=self.owns_weights, follow_source_memory=filter_types is None
        )
        for k, x in new_values.items():
            var = variables[k]
            # A leaf that is already the new array (a shared model) is left alone.
            if var.get_value() is not x:
                var.set_value(x)

    def held_values(self, filter_types: tuple[Any, ...] | None = None) -> list[Any]:
        """The arrays the engine's model holds now (those matching ``filter_types``)."""
        return [v.get_value() for v in self._variables(filter_types).values()]

    def _variables(self, filter_types: tuple[Any, ...] | None) -> dict[tuple[Any, ...], nnx.Variable]:
        """Path -> the model's own Variable objects, found once per filter.

        A sync runs often and the model's structure never changes after
        construction, so the graph is walked once; values are read and set
        on the Variables themselves.
        """
        model = self.model()
        cache = self.__dict__.setdefault("_variable_index", {})
        hit = cache.get(filter_types)
        if hit is None or hit[0] is not model:
            state = nnx.state(model, *filter_types) if filter_types is not None else nnx.state(model)
            hit = (model, {tuple(k): v for k, v in nnx.to_flat_state(state)})
            cache[filter_types] = hit
        return hit[1]


def leaf_path(key: tuple[Any, ...]) -> str:
    """A flattened state key as the path the reports show: ``layers/0/attn/q/kernel``."""
    return "/".join(map(str, key))


def flat_values(tree: Any) -> dict[tuple[Any, ...], Any]:
    """Path tuple -> array, from an ``nnx.State`` or a nested dict of arrays."""
    if isinstance(tree, nnx.State):
        return {tuple(k): (v.get_value() if isinstance(v, nnx.Variable) else v) for k, v in nnx.to_flat_state(tree)}
    return flatten_dict(tree)


def reshard_flat(
    src_flat: dict[tuple[Any, ...], Any],
    dst_flat: dict[tuple[Any, ...], Any],
    *,
    copy: bool,
    follow_source_memory: bool = False,
) -> dict[tuple[Any, ...], Any]:
    """``src_flat``'s values (path -> array) placed with ``dst_flat``'s shardings and cast to its dtypes.

    Leaves already in their destination sharding are reused unless ``copy``
    asks for new buffers. Only device-to-device copies happen: no host
    round-trip, so it runs under a transfer guard.
    """
    if follow_source_memory:
        # Keeping shared roles together may hand over part of a tree (a
        # reference has no adapters): only those leaves are replaced.
        dst_flat = {k: v for k, v in dst_flat.items() if k in src_flat}
    if src_flat.keys() != dst_flat.keys():
        missing = sorted(map(str, set(dst_flat) - set(src_flat)))[:5]
        extra = sorted(map(str, set(src_flat) - set(dst_flat)))[:5]
        raise ValueError(
            "the new weights do not match the rollout model's parameter tree "
            f"(missing: {missing}, unexpected: {extra}); sync from a model of the same architecture"
        )
    keys = list(dst_flat)
    shardings = []
    for k in keys:
        s = dst_flat[k].sharding
        if follow_source_memory and isinstance(s, NamedSharding):
            s = s.with_memory_kind(src_flat[k].sharding.memory_kind)
        shardings.append(s)
    # One batch for the whole tree; each leaf's copies are logged under its path (L3).
    moved = reshard_many([src_flat[k] for k in keys], shardings, copy=copy, labels=[leaf_path(k) for k in keys])
    # Cast on the destination devices, after the move (bytes move in the source dtype).
    cast = cast_many(moved, [dst_flat[k].dtype for k in keys])
    out = {}
    for k, x, y in zip(keys, moved, cast):
        out[k] = y
        if y is not x:
            log_cast(src_flat[k], x, y, leaf_path(k))
    return out
