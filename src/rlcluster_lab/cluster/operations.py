"""The cluster's operations: generate (P9), per-token log-probs (P10), the optimizer steps
(P12), rewards and values: functions of the cluster's state, called by the ``RLCluster``
method of the same purpose under the state's lock.

Each runs inside ``ClusterState.working`` (the role's context entered and recorded, its model
on device for the work, P14) and calls ``observe.at_work`` just before its work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.cluster.observe import at_work
from rlcluster_lab.cluster.state import OPTIMIZER_FIELD, ClusterState
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.gathering import host_values
from rlcluster_lab.core.options import as_int
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.core.states import model_split
from rlcluster_lab.engines import RolloutOutput
from rlcluster_lab.model import logps_from_state, scoring
from rlcluster_lab.model.lora import trained_params
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.rules.anchor import p10_require_anchor
from rlcluster_lab.rules.steps import p9_check_prompts
from rlcluster_lab.training import critic as critic_training
from rlcluster_lab.training.batch import TrainBatch, batch_arrays, mini_batches, validate_prompts
from rlcluster_lab.training.step import train_step


def generate(
    s: ClusterState, prompts: Sequence[str], mode: Mode, micro_batch_size: int | None, max_generation_steps: int | None
) -> RolloutOutput:
    """P9: sample completions on the rollout mesh, in micro-batches if asked."""
    prompts, rollout_cfg = _checked(s, prompts, mode, micro_batch_size, max_generation_steps)
    engine = s.placed.engine
    with s.working(Role.ROLLOUT, engine.model(), "generate"):
        at_work(s, Role.ROLLOUT)
        outs = [engine.generate(prompts[rows], rollout_cfg) for rows in mini_batches(len(prompts), micro_batch_size)]
    return _concat_outputs(outs, engine.pad_id())


def generated_shape(
    s: ClusterState, prompts: Sequence[str], mode: Mode, micro_batch_size: int | None, max_generation_steps: int | None
) -> tuple[int, int, int]:
    """(batch, prompt width, completion length) of what ``generate`` returns for these arguments, from
    the prompts alone (each micro-batch's width, the widest kept, as ``_concat_outputs`` pads them)."""
    prompts, rollout_cfg = _checked(s, prompts, mode, micro_batch_size, max_generation_steps)
    shapes = [
        s.placed.engine.output_shape(prompts[rows], rollout_cfg)
        for rows in mini_batches(len(prompts), micro_batch_size)
    ]
    return len(prompts), max(w for _, w, _ in shapes), max(c for _, _, c in shapes)


def _checked(
    s: ClusterState, prompts: Sequence[str], mode: Mode, micro_batch_size: int | None, max_generation_steps: int | None
) -> tuple[list[str], Any]:
    """The prompts, checked (P9), and the rollout config ``mode`` samples with."""
    prompts = validate_prompts(prompts)  # a bare string is not a list of prompts
    p9_check_prompts(prompts, micro_batch_size)
    rollout_cfg = s.config.rollout_config_for(mode)
    if max_generation_steps is not None:
        # Checked under its own name: the config it replaces would name its own field.
        steps = as_int(max_generation_steps, "max_generation_steps", low=1)
        rollout_cfg = dataclasses.replace(rollout_cfg, max_tokens_to_generate=steps)
    return prompts, rollout_cfg


def reference_logps(
    s: ClusterState, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """Per-token log-probs under the reference model, on its mesh."""
    if s.placed.reference is None:
        raise ValueError("this cluster has no reference model; pass reference=... when building it")
    batch = check_batch(prompt_tokens, completion_tokens, "reference")
    return _own_weights_logps(s, Role.REFERENCE, "reference log-probs", batch, micro_batch_size)


def anchor_logps(
    s: ClusterState, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """P10: the live actor's graph run over the *anchor* state, on the actor's mesh."""
    prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "actor")
    p10_require_anchor(s.placed.anchor is not None)
    with s.working(Role.ACTOR, None, "actor log-probs (anchor)"):
        graphdef, _ = model_split(s.placed.actor)
        # Brought to device leaf by leaf: with anchor='trainable' the backbone part may be there already.
        anchor = put_on_memory_kind(s.anchor_state(), s.contexts.device_kind(Role.ACTOR))
        at_work(s, Role.ACTOR, {"anchor (device copy)": anchor})
        return _chunked(s, graphdef, anchor, prompt_tokens, completion_tokens, micro_batch_size)


def rollout_logps(
    s: ClusterState, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """Per-token log-probs under the rollout engine's own weights, on the rollout mesh."""
    prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "old")
    engine = s.placed.engine
    with s.working(Role.ROLLOUT, engine.model(), "rollout log-probs"):
        at_work(s, Role.ROLLOUT)
        outs = [
            engine.get_per_token_logps(prompt_tokens[rows], completion_tokens[rows])
            for rows in mini_batches(len(prompt_tokens), micro_batch_size)
        ]
    return jnp.concatenate(outs, axis=0)


def live_actor_logps(
    s: ClusterState, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """The actor's log-probs with its *live* weights (what P11 warns against)."""
    batch = check_batch(prompt_tokens, completion_tokens, "actor")
    return _own_weights_logps(s, Role.ACTOR, "live actor log-probs", batch, micro_batch_size)


def _own_weights_logps(
    s: ClusterState, role: Role, operation: str, batch: tuple[np.ndarray, np.ndarray], micro_batch_size: int | None
) -> jax.Array:
    """Log-probs under ``role``'s model (the reference, or the live actor) with its own weights."""
    model = s.placed.reference if role is Role.REFERENCE else s.placed.actor
    with s.working(role, model, operation):
        graphdef, state = model_split(model)
        at_work(s, role)
        return _chunked(s, graphdef, state, *batch, micro_batch_size)


def _live_logps(s: ClusterState) -> Callable[[Any, Any], jax.Array]:
    """Scoring with the actor's weights as they are now, inside an operation already on device."""

    def live(prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "actor")
        graphdef, state = model_split(s.placed.actor)
        return _chunked(s, graphdef, state, prompt_tokens, completion_tokens, None)

    return live


def _chunked(
    s: ClusterState, graphdef: Any, state: Any, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    outs = [
        logps_from_state(graphdef, state, prompt_tokens[rows], completion_tokens[rows], s.pad_id(), s.temperature)
        for rows in mini_batches(len(prompt_tokens), micro_batch_size)
    ]
    return jnp.concatenate(outs, axis=0)


def update_actor(s: ClusterState, batch: TrainBatch, on_step: Any) -> list[dict[str, float]]:
    """P12: optimizer steps on the actor, on its mesh, one per mini-batch per iteration; with
    offload the actor and its optimizer state come to device for the step and go back after."""
    if not isinstance(batch, TrainBatch):
        raise TypeError(f"update_actor takes a TrainBatch, got {type(batch).__name__}")
    tcfg = s.config.training_config
    temperature = s.temperature or 1.0  # train_step checks it and hands it over as a NumPy scalar

    def step(graphdef: Any, trainable: Any, frozen: Any, opt_state: Any, rows: slice) -> Any:
        return train_step(
            graphdef,
            s.tx,
            trainable,
            frozen,
            opt_state,
            batch_arrays(batch.rows(rows)),
            temperature,
            pad_id=s.pad_id(),
            beta=float(tcfg.beta),
            epsilon=float(tcfg.epsilon),
            micro_batch_size=tcfg.train_micro_batch_size,
        )

    return _steps(s, Role.ACTOR, batch, trained_params(s.placed.lora), step, on_step)


def update_critic(s: ClusterState, batch: Any) -> list[dict[str, float]]:
    """P12 for the critic: clipped value-loss steps on its mesh, one per mini-batch per iteration,
    accumulating micro-batches as the actor does (with offload, on device for the steps only)."""
    if s.placed.critic is None:
        raise ValueError("this cluster has no critic model; pass critic=... when building it to train one")
    if not isinstance(batch, critic_training.ValueBatch):
        raise TypeError(f"update_critic takes a ValueBatch, got {type(batch).__name__}")
    tcfg = s.config.training_config

    def step(graphdef: Any, trainable: Any, frozen: Any, opt_state: Any, rows: slice) -> Any:
        return critic_training.value_train_step(
            graphdef,
            s.critic_tx,
            trainable,
            frozen,
            opt_state,
            batch.rows(rows).arrays(),
            pad_id=s.pad_id(),
            clip_range_value=float(tcfg.clip_range_value),
            micro_batch_size=tcfg.train_micro_batch_size,
        )

    return _steps(s, Role.CRITIC, batch, nnx.Param, step)


def _steps(
    s: ClusterState, role: Role, batch: Any, trainable: Any, step: Callable[..., Any], on_step: Any = None
) -> list[dict[str, float]]:
    """The optimizer steps of ACTOR or CRITIC over ``batch``: one per mini-batch per iteration."""
    tcfg = s.config.training_config
    model = s.placed.actor if role is Role.ACTOR else s.placed.critic
    field = OPTIMIZER_FIELD[role]
    batch.validate(getattr(getattr(model, "config", None), "vocab_size", None))  # before anything moves
    check_accumulation(len(batch), tcfg)
    metrics: list[dict[str, float]] = []
    with s.working(role, model, f"update_{role.value}"), s.optimizer_on_device(role):
        at_work(s, role)
        for iteration in range(tcfg.num_iterations):
            for rows in mini_batches(len(batch), tcfg.mini_batch_size):
                if on_step is not None:
                    on_step(iteration, rows, _live_logps(s))
                graphdef, params, frozen = model_split(model, trainable, ...)
                new_params, new_opt_state, m = step(graphdef, params, frozen, getattr(s.placed, field), rows)
                # Parameters and optimizer state change together (shardings kept); a step that raised changed neither.
                nnx.update(model, new_params)
                setattr(s.placed, field, new_opt_state)
                # As floats; with several processes, read from whichever computed them (core.gathering).
                metrics.append(dict(zip(m, map(float, host_values(list(m.values()))))))
    return metrics


def check_accumulation(batch_size: int, tcfg: Any) -> None:
    """With gradient accumulation the batch is a whole number of mini-batches (as the reference's
    learner requires), else a ``ConfigError`` naming the batch size and ``mini_batch_size``."""
    if tcfg.train_micro_batch_size is not None and batch_size % tcfg.mini_batch_size:
        raise ConfigError(
            f"the training batch has {batch_size} rows, not a multiple of mini_batch_size={tcfg.mini_batch_size}; "
            f"with train_micro_batch_size={tcfg.train_micro_batch_size} every mini-batch must be whole: pass a "
            "batch whose size is a multiple of mini_batch_size"
        )


def score(s: ClusterState, role: Role, prompt_tokens: Any, completion_tokens: Any, *, per_token: bool) -> jax.Array:
    """Rewards (B,) or values (B, C) from the reward model or the critic, on its mesh."""
    model = s.placed.reward if role is Role.REWARD else s.placed.critic
    if model is None:
        raise ValueError(f"this cluster has no {role.value} model; pass {role.value}=... when building it")
    prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, role.value)
    with s.working(role, model, "rewards" if role is Role.REWARD else "values"):
        graphdef, state = model_split(model)
        at_work(s, role)
        return scoring.scores_from_state(
            graphdef, state, prompt_tokens, completion_tokens, s.pad_id(), per_token=per_token
        )


def check_batch(prompt_tokens: Any, completion_tokens: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Two (batch, length) token arrays with the same batch; an empty batch is an error (P10)."""
    for name, tokens in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens)):
        if not hasattr(tokens, "__array__") and not isinstance(tokens, (list, tuple)):
            raise TypeError(f"{name} must be a (batch, length) array of token ids, got {type(tokens).__name__}")
    prompt_tokens = np.asarray(prompt_tokens)
    completion_tokens = np.asarray(completion_tokens)
    if prompt_tokens.ndim != 2 or prompt_tokens.shape[0] == 0:
        raise ValueError(
            f"Cannot compute {what} log probabilities from an empty batch (prompt_tokens shape {prompt_tokens.shape})."
        )
    if completion_tokens.ndim != 2 or completion_tokens.shape[0] != prompt_tokens.shape[0]:
        raise ValueError(
            f"completion_tokens must be (batch, length) with the same batch as prompt_tokens "
            f"{prompt_tokens.shape}; got {completion_tokens.shape}"
        )
    return prompt_tokens, completion_tokens


def _concat_outputs(outs: list[RolloutOutput], pad_id: int) -> RolloutOutput:
    prompts = [o.left_padded_prompt_tokens for o in outs]
    width = max(p.shape[1] for p in prompts)
    prompts = [np.pad(p, ((0, 0), (width - p.shape[1], 0)), constant_values=pad_id) for p in prompts]
    return RolloutOutput(
        text=[t for o in outs for t in o.text],
        tokens=np.concatenate([o.tokens for o in outs], axis=0),
        logprobs=np.concatenate([o.logprobs for o in outs], axis=0),
        left_padded_prompt_tokens=np.concatenate(prompts, axis=0),
    )
