"""The cluster's operations: generate (P9), per-token log-probs (P10), the optimizer step (P12),
rewards and values, and a rehearsal of a whole step.

Each operation runs inside ``RLCluster._working(role, model, operation)``: the role's
mesh and context are entered (and recorded in ``contexts_entered`` under the
operation's name), its model is brought to device (P14) and offloaded again
afterwards, even when the operation raised. Just before its work it calls
``observe.at_work``, where a registered observer may measure (nothing, without one).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.cluster.observe import at_work
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.gathering import host_value, host_values
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.engines import RolloutOutput
from rlcluster_lab.model import is_lora, logps_from_state
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.rules.anchor import p10_require_anchor
from rlcluster_lab.rules.steps import p9_check_prompts
from rlcluster_lab.training.batch import validate_prompts
from rlcluster_lab.training.step import TrainBatch, batch_arrays, mini_batches, train_step

if TYPE_CHECKING:
    from rlcluster_lab.cluster.cluster import RLCluster


def generate(
    c: RLCluster, prompts: Sequence[str], mode: Mode, micro_batch_size: int | None, max_generation_steps: int | None
) -> RolloutOutput:
    """P9: sample completions on the rollout mesh, in micro-batches if asked."""
    c._require_constructed()
    prompts = validate_prompts(prompts)  # a bare string is not a list of prompts
    p9_check_prompts(prompts, micro_batch_size)
    rollout_cfg = c.get_rollout_config(mode)
    if max_generation_steps is not None:
        rollout_cfg = dataclasses.replace(rollout_cfg, max_tokens_to_generate=max_generation_steps)
    engine = c.rollout
    with c._working(Role.ROLLOUT, engine.model(), "generate"):
        at_work(c, Role.ROLLOUT)
        outs = [engine.generate(prompts[rows], rollout_cfg) for rows in mini_batches(len(prompts), micro_batch_size)]
    return _concat_outputs(outs, engine.pad_id())


def per_token_logps(
    c: RLCluster, role: Role, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """Per-token log-probs under REFERENCE, ACTOR (from the anchor, P10) or ROLLOUT (the engine's weights)."""
    c._require_constructed()
    if role is Role.REFERENCE:
        if c._reference is None:
            raise ValueError("this cluster has no reference model; pass reference=... when building it")
        prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "reference")
        with c._working(Role.REFERENCE, c._reference, "reference log-probs"):
            graphdef, state = nnx.split(c._reference)
            at_work(c, Role.REFERENCE)
            return _chunked(c, graphdef, state, prompt_tokens, completion_tokens, micro_batch_size)
    if role is Role.ACTOR:
        prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "actor")
        p10_require_anchor(c._anchor_policy_state is not None)
        with c._working(Role.ACTOR, None, "actor log-probs (anchor)"):
            graphdef, _ = nnx.split(c.actor_model)
            # Brought to device leaf by leaf: with anchor='trainable' the backbone part may be there already.
            anchor = put_on_memory_kind(c.anchor_policy_state, c._device_kind(Role.ACTOR))
            at_work(c, Role.ACTOR, {"anchor (device copy)": anchor})
            return _chunked(c, graphdef, anchor, prompt_tokens, completion_tokens, micro_batch_size)
    if role is Role.ROLLOUT:
        prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "old")
        engine = c.rollout
        with c._working(Role.ROLLOUT, engine.model(), "rollout log-probs"):
            at_work(c, Role.ROLLOUT)
            outs = [
                engine.get_per_token_logps(prompt_tokens[rows], completion_tokens[rows])
                for rows in mini_batches(len(prompt_tokens), micro_batch_size)
            ]
        return jnp.concatenate(outs, axis=0)
    raise ValueError(f"per-token log-probs come from actor, reference or rollout, not {role.value}")


def live_actor_logps(
    c: RLCluster, prompt_tokens: Any, completion_tokens: Any, micro_batch_size: int | None
) -> jax.Array:
    """The actor's log-probs with its *live* weights (what P11 warns against)."""
    prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "actor")
    with c._working(Role.ACTOR, c.actor_model, "live actor log-probs"):
        graphdef, state = nnx.split(c.actor_model)
        at_work(c, Role.ACTOR)
        return _chunked(c, graphdef, state, prompt_tokens, completion_tokens, micro_batch_size)


def _live_logps(c: RLCluster) -> Callable[[Any, Any], jax.Array]:
    """Scoring with the actor's weights as they are now, inside an operation already on device."""

    def live(prompt_tokens: Any, completion_tokens: Any) -> jax.Array:
        prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, "actor")
        graphdef, state = nnx.split(c.actor_model)
        return _chunked(c, graphdef, state, prompt_tokens, completion_tokens, None)

    return live


def _chunked(
    c: RLCluster,
    graphdef: Any,
    state: Any,
    prompt_tokens: np.ndarray,
    completion_tokens: np.ndarray,
    micro_batch_size: int | None,
) -> jax.Array:
    temperature = c.get_rollout_config(Mode.TRAIN).temperature
    pad = c.rollout.pad_id()
    outs = [
        logps_from_state(graphdef, state, prompt_tokens[rows], completion_tokens[rows], pad, temperature)
        for rows in mini_batches(len(prompt_tokens), micro_batch_size)
    ]
    return jnp.concatenate(outs, axis=0)


def update_actor(c: RLCluster, batch: TrainBatch, on_step: Any) -> list[dict[str, float]]:
    """P12: optimizer steps on the actor, on its mesh, one per mini-batch per iteration; with
    offload the actor and its optimizer state come to device for the step and go back after."""
    c._require_constructed()
    if not isinstance(batch, TrainBatch):
        raise TypeError(f"update_actor takes a TrainBatch, got {type(batch).__name__}")
    tcfg = c.cluster_config.training_config
    actor = c.actor_model
    batch.validate(getattr(getattr(actor, "config", None), "vocab_size", None))  # before anything moves
    check_accumulation(len(batch), tcfg)
    metrics: list[dict[str, float]] = []
    temperature = jnp.float32(c.get_rollout_config(Mode.TRAIN).temperature or 1.0)
    with c._working(Role.ACTOR, actor, "update_actor"), _optimizer_state_on_device(c, Role.ACTOR, "_opt_state"):
        at_work(c, Role.ACTOR)
        for iteration in range(tcfg.num_iterations):
            for rows in mini_batches(len(batch), tcfg.mini_batch_size):
                if on_step is not None:
                    on_step(iteration, rows, _live_logps(c))
                graphdef, trainable, frozen = nnx.split(actor, c._trainable_filter, ...)
                new_trainable, new_opt_state, m = train_step(
                    graphdef,
                    c._tx,
                    trainable,
                    frozen,
                    c._opt_state,
                    batch_arrays(batch.rows(rows)),
                    temperature,
                    pad_id=c.rollout.pad_id(),
                    beta=float(tcfg.beta),
                    epsilon=float(tcfg.epsilon),
                    micro_batch_size=tcfg.train_micro_batch_size,
                )
                # Parameters and optimizer state change together (the step keeps every
                # leaf's sharding); a step that raised changed neither.
                nnx.update(actor, new_trainable)
                c._opt_state = new_opt_state
                metrics.append(_host_metrics(m))
    return metrics


def update_critic(c: RLCluster, batch: Any) -> list[dict[str, float]]:
    """P12 for the critic: clipped value-loss steps on the critic, on its mesh, one per
    mini-batch per iteration, accumulating micro-batches as the actor does; with offload the
    critic and its optimizer state come to device for the steps and go back after."""
    from rlcluster_lab.training.critic import ValueBatch, value_train_step

    c._require_constructed()
    critic = c._critic
    if critic is None:
        raise ValueError("this cluster has no critic model; pass critic=... when building it to train one")
    if not isinstance(batch, ValueBatch):
        raise TypeError(f"update_critic takes a ValueBatch, got {type(batch).__name__}")
    tcfg = c.cluster_config.training_config
    batch.validate(getattr(getattr(critic, "config", None), "vocab_size", None))  # before anything moves
    check_accumulation(len(batch), tcfg)
    metrics: list[dict[str, float]] = []
    with (
        c._working(Role.CRITIC, critic, "update_critic"),
        _optimizer_state_on_device(c, Role.CRITIC, "_critic_opt_state"),
    ):
        at_work(c, Role.CRITIC)
        for _ in range(tcfg.num_iterations):
            for rows in mini_batches(len(batch), tcfg.mini_batch_size):
                graphdef, trainable, frozen = nnx.split(critic, nnx.Param, ...)
                new_trainable, new_opt_state, m = value_train_step(
                    graphdef,
                    c._critic_tx,
                    trainable,
                    frozen,
                    c._critic_opt_state,
                    batch.rows(rows).arrays(),
                    pad_id=c.rollout.pad_id(),
                    clip_range_value=float(tcfg.clip_range_value),
                    micro_batch_size=tcfg.train_micro_batch_size,
                )
                nnx.update(critic, new_trainable)
                c._critic_opt_state = new_opt_state
                metrics.append(_host_metrics(m))
    return metrics


def _host_metrics(m: dict[str, Any]) -> dict[str, float]:
    """A step's metrics as floats; with several processes, read from whichever process
    computed them (``core.gathering``)."""
    keys = list(m)
    return {k: float(v) for k, v in zip(keys, host_values([m[k] for k in keys]))}


@contextlib.contextmanager
def _optimizer_state_on_device(c: RLCluster, role: Role, attr: str) -> Iterator[None]:
    """P14 for an optimizer state (``c.<attr>``): with offload it comes to the role's device
    memory for the steps and goes back to pinned host afterwards, even when a step raised."""
    if not c.cluster_config.offload_to_cpu:
        yield
        return
    setattr(c, attr, put_on_memory_kind(getattr(c, attr), c._device_kind(role)))
    try:
        yield
    finally:
        setattr(c, attr, put_on_memory_kind(getattr(c, attr), "pinned_host"))


def check_accumulation(batch_size: int, tcfg: Any) -> None:
    """With gradient accumulation, the batch is a whole number of mini-batches (as the
    reference's learner requires), so every update accumulates the same micro-batch count.

    Raises:
        ConfigError: naming the batch size and ``mini_batch_size``.
    """
    if tcfg.train_micro_batch_size is None:
        return
    if batch_size % tcfg.mini_batch_size:
        raise ConfigError(
            f"the training batch has {batch_size} rows, not a multiple of mini_batch_size={tcfg.mini_batch_size}; "
            f"with train_micro_batch_size={tcfg.train_micro_batch_size} every mini-batch must be whole: pass a "
            "batch whose size is a multiple of mini_batch_size"
        )


def score(c: RLCluster, role: Role, prompt_tokens: Any, completion_tokens: Any, *, per_token: bool) -> jax.Array:
    """Rewards (B,) or values (B, C) from the reward model or the critic, on its mesh."""
    from rlcluster_lab.model.scoring import scores_from_state

    c._require_constructed()
    model = c._reward if role is Role.REWARD else c._critic
    if model is None:
        raise ValueError(f"this cluster has no {role.value} model; pass {role.value}=... when building it")
    prompt_tokens, completion_tokens = check_batch(prompt_tokens, completion_tokens, role.value)
    with c._working(role, model, "rewards" if role is Role.REWARD else "values"):
        graphdef, state = nnx.split(model)
        at_work(c, role)
        return scores_from_state(
            graphdef, state, prompt_tokens, completion_tokens, c.rollout.pad_id(), per_token=per_token
        )


def rehearse_step(c: RLCluster, prompts: Sequence[str], reward_model: bool) -> bool:
    """Run every program one RL step uses, on these prompts' shapes, changing no state.

    Generate, the anchor's, the reference's and the live actor's log-probs,
    the optimizer step (its result thrown away) and the sync's reshard (into
    new buffers that are dropped): each is compiled, or read from the
    persistent cache, so the real step that follows compiles nothing.
    Weights, the optimizer state, the anchor, the step counter and the
    engine's sampling seed are left as they were. With ``offload_to_cpu``
    nothing is done (the operations would move roles between memory kinds);
    returns whether the rehearsal ran.
    """
    from rlcluster_lab.cluster.sync import rehearse_sync

    c._require_constructed()
    if c.cluster_config.offload_to_cpu:
        return False
    engine = c.rollout
    calls = getattr(engine, "_calls", None)
    try:
        out = c.generate(validate_prompts(prompts))
    finally:
        if calls is not None:
            engine._calls = calls  # the sampling seed the real step will use
    p, comp = out.left_padded_prompt_tokens, out.tokens
    anchor = host_value(c.get_actor_per_token_logps(p, comp))
    ref = host_value(c.get_ref_per_token_logps(p, comp)) if c._reference is not None else None
    if reward_model and c._reward is not None:
        c.get_rewards(p, comp)
    batch = TrainBatch(p, comp, np.zeros(len(p), np.float32), anchor, ref)
    tcfg = c.cluster_config.training_config
    temperature = jnp.float32(c.get_rollout_config(Mode.TRAIN).temperature or 1.0)
    actor = c.actor_model
    with c._role_context(Role.ACTOR, "rehearse: optimizer step"):
        sizes: dict[int, slice] = {}
        for rows in mini_batches(len(batch), tcfg.mini_batch_size):
            sizes.setdefault(rows.stop - rows.start, rows)
        for rows in sizes.values():
            _live_logps(c)(p[rows], comp[rows])
            graphdef, trainable, frozen = nnx.split(actor, c._trainable_filter, ...)
            train_step(
                graphdef,
                c._tx,
                trainable,
                frozen,
                c._opt_state,
                batch_arrays(batch.rows(rows)),
                temperature,
                pad_id=engine.pad_id(),
                beta=float(tcfg.beta),
                epsilon=float(tcfg.epsilon),
                micro_batch_size=tcfg.train_micro_batch_size,
            )
    rehearse_sync(c, is_lora(actor))
    return True


def check_batch(prompt_tokens: Any, completion_tokens: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Two (batch, length) token arrays with the same batch; an empty batch is an error (P10)."""
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
    width = max(o.left_padded_prompt_tokens.shape[1] for o in outs)
    prompts = [
        np.pad(
            o.left_padded_prompt_tokens,
            ((0, 0), (width - o.left_padded_prompt_tokens.shape[1], 0)),
            constant_values=pad_id,
        )
        for o in outs
    ]
    return RolloutOutput(
        text=[t for o in outs for t in o.text],
        tokens=np.concatenate([o.tokens for o in outs], axis=0),
        logprobs=np.concatenate([o.logprobs for o in outs], axis=0),
        left_padded_prompt_tokens=np.concatenate(prompts, axis=0),
    )
