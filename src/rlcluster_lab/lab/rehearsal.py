"""The lab's rehearsal: compile every program one training step will run, before it runs.

The widget rehearses on a background thread after each Construct, so that the Training step
pressed next runs programs instead of compiling them: the step's programs (sampling, the
anchor's, the reference's and the live actor's log-probs, rewards, values, the optimizer steps,
the sync's check and reshard) run on the cluster's own arrays, in each role's context, and
their results are thrown away. It writes nothing a call on the cluster reads: it samples with
its own seed (``generate_with_seed``), keeps no state it computes, enters the role contexts
without recording them, reaches no work observer and takes no lock, so the cluster's
operations on other threads neither wait for it nor see it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlcluster_lab.app.learner import GRPOLearner
from rlcluster_lab.cluster import RLCluster
from rlcluster_lab.cluster.contexts import role_context
from rlcluster_lab.cluster.sync import sync_filter, sync_guard
from rlcluster_lab.cluster.validate import check_finite_leaves
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.gathering import host_value
from rlcluster_lab.core.roles import Mode, Role
from rlcluster_lab.core.shardings import default_memory_kind
from rlcluster_lab.core.waits import waiting
from rlcluster_lab.engines.base import flat_values, reshard_flat
from rlcluster_lab.model import logps_from_state
from rlcluster_lab.model.scoring import scores_from_state
from rlcluster_lab.placement.place import put_on_memory_kind
from rlcluster_lab.placement.reshard import reshard_strategy
from rlcluster_lab.training.batch import TrainBatch, validate_prompts
from rlcluster_lab.training.critic import ValueBatch, value_train_step
from rlcluster_lab.training.step import batch_arrays, mini_batches, train_step


class BackgroundCompile:
    """The rehearsal of the next training step on a thread of its own, one at a time.

    ``start`` begins one after each Construct; a Training step ``join``s it first. While it
    runs, ``programs`` lists what it has compiled so far, so a wait for it can say what it
    waits for.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._compiled: list[tuple[str, float, bool]] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def programs(self) -> list[str]:
        """The programs the running (or last) rehearsal has built so far, by name."""
        return [name for name, _, _ in list(self._compiled)]

    def start(self, learner: GRPOLearner) -> None:
        """Rehearse ``learner``'s next step in the background (after any rehearsal still running:
        two would only compete for the cores)."""
        previous = self._thread
        compiled: list[tuple[str, float, bool]] = []

        def work() -> None:
            if previous is not None:
                previous.join()
            self._compiled = compiled
            try:
                with count_compilations() as found:
                    self._compiled = found
                    rehearse_next_step(learner)
            except Exception as exc:  # noqa: BLE001 - the real step will show the real error
                self.error = f"{type(exc).__name__}: {exc}"

        self.error = None
        # Not a daemon: the interpreter waits for it at exit. A daemon thread stopped inside an
        # XLA compilation aborts the whole process ("terminate called ... exception not rethrown").
        self._thread = threading.Thread(target=work, name="rlcluster-lab-rehearsal", daemon=False)
        self._thread.start()

    def join(self) -> float:
        """Wait until no rehearsal runs; returns the seconds waited."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return time.perf_counter() - start


def rehearse_next_step(learner: GRPOLearner) -> bool:
    """``rehearse_step`` on the prompts the learner's next step will use (not drawn: the step
    that follows picks the very same ones). Returns whether the rehearsal ran."""
    return rehearse_step(
        learner.cluster, learner.next_prompts(), reward_model=learner.use_reward_model, critic=learner.config.critic
    )


def rehearse_step(
    cluster: RLCluster, prompts: Sequence[str], *, reward_model: bool = False, critic: bool = False
) -> bool:
    """Run every program one RL step on ``prompts`` uses, on the cluster's arrays, changing nothing.

    ``reward_model``: the step scores with the cluster's reward model; ``critic``: the
    step is PPO-style (the critic's values and its update). With ``offload_to_cpu``
    nothing is done: the programs would need the roles moved between memory kinds,
    which is state the operations read. Returns whether the rehearsal ran.

    The rehearsal is a wait of its own (``core.waits``, kind ``REHEARSAL``): a click
    that waits for it can show what is being compiled, for how long, and how long the
    last rehearsal took.
    """
    config = cluster.cluster_config
    if config.offload_to_cpu:
        return False
    with waiting("compiling the training step's programs (in the background)", kind=REHEARSAL):
        return _rehearse(cluster, prompts, reward_model=reward_model, critic=critic)


REHEARSAL = "rehearsal"


def _rehearse(cluster: RLCluster, prompts: Sequence[str], *, reward_model: bool, critic: bool) -> bool:
    config = cluster.cluster_config
    state = cluster.state
    meshes = cluster.role_to_mesh
    engine = cluster.rollout
    pad = engine.pad_id()
    temperature = cluster.get_rollout_config(Mode.TRAIN).temperature
    actor = cluster.actor_model
    graphdef = nnx.split(actor)[0]

    def logps(model_graph: nnx.GraphDef, weights: nnx.State, p: np.ndarray, c: np.ndarray) -> np.ndarray:
        return host_value(logps_from_state(model_graph, weights, p, c, pad, temperature))

    rollout_cfg = cluster.get_rollout_config(Mode.TRAIN)
    with role_context(config, meshes[Role.ROLLOUT], Role.ROLLOUT):
        out = engine.generate_with_seed(validate_prompts(prompts), rollout_cfg, rollout_cfg.seed)
    p, comp = out.left_padded_prompt_tokens, out.tokens
    with role_context(config, meshes[Role.ACTOR], Role.ACTOR) as mesh:
        anchor = logps(graphdef, put_on_memory_kind(cluster.anchor_policy_state, default_memory_kind(mesh)), p, comp)
    ref = None
    if cluster.reference_model is not None:
        with role_context(config, meshes[Role.REFERENCE], Role.REFERENCE):
            reference = nnx.split(cluster.reference_model)
            ref = logps(reference[0], reference[1], p, comp)
    if reward_model and cluster.reward_model is not None:
        with role_context(config, meshes[Role.REWARD], Role.REWARD):
            scores_from_state(*nnx.split(cluster.reward_model), p, comp, pad, per_token=False)
    if critic and cluster.critic_model is not None:
        _rehearse_critic(cluster, p, comp, pad)
    batch = TrainBatch(p, comp, np.zeros(len(p), np.float32), anchor, ref)
    tcfg = config.training_config
    # Made outside the actor's context, as ``update_actor`` makes it: a scalar made inside
    # would carry the mesh in its type, and the step would be another program.
    step_temperature = jnp.float32(temperature or 1.0)
    with role_context(config, meshes[Role.ACTOR], Role.ACTOR):
        for rows in _one_per_size(len(batch), tcfg.mini_batch_size):
            logps(graphdef, nnx.state(actor), p, comp)  # what the learner's P11 probe runs (the whole batch)
            graph, trainable, frozen = nnx.split(actor, state.trainable, ...)
            train_step(
                graph,
                state.tx,
                trainable,
                frozen,
                cluster.optimizer_state,
                batch_arrays(batch.rows(rows)),
                step_temperature,
                pad_id=pad,
                beta=float(tcfg.beta),
                epsilon=float(tcfg.epsilon),
                micro_batch_size=tcfg.train_micro_batch_size,
            )
    # The sync: its check of the actor's leaves, then its reshard into new buffers that are
    # dropped (P13: under the sync's guard).
    check_finite_leaves(actor, "actor")
    filter_types = sync_filter(state.placed.lora)
    with sync_guard(cluster.platform), reshard_strategy(config.reshard):
        params = flat_values(nnx.state(actor, *filter_types))
        held = flat_values(nnx.state(engine.model(), *filter_types))
        reshard_flat(params, held, copy=engine.owns_weights)
    return True


def _rehearse_critic(cluster: RLCluster, p: np.ndarray, comp: np.ndarray, pad: int) -> None:
    """The critic's values and its value-loss step, results dropped."""
    config = cluster.cluster_config
    tcfg = config.training_config
    model = cluster.critic_model
    with role_context(config, cluster.role_to_mesh[Role.CRITIC], Role.CRITIC):
        values = host_value(scores_from_state(*nnx.split(model), p, comp, pad, per_token=True))
        batch = ValueBatch(p, comp, np.zeros_like(values), values)
        for rows in _one_per_size(len(batch), tcfg.mini_batch_size):
            graph, trainable, frozen = nnx.split(model, nnx.Param, ...)
            value_train_step(
                graph,
                cluster.state.critic_tx,
                trainable,
                frozen,
                cluster.critic_optimizer_state,
                batch.rows(rows).arrays(),
                pad_id=pad,
                clip_range_value=float(tcfg.clip_range_value),
                micro_batch_size=tcfg.train_micro_batch_size,
            )


def _one_per_size(batch_size: int, mini_batch_size: int | None) -> list[slice]:
    """One mini-batch of each size the step will take (a program per shape)."""
    sizes: dict[int, slice] = {}
    for rows in mini_batches(batch_size, mini_batch_size):
        sizes.setdefault(rows.stop - rows.start, rows)
    return list(sizes.values())
