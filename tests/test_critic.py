"""Critic training: the clipped value loss, ``update_critic`` with the critic's own optimizer
state (P12 on the critic mesh, offloaded under P14), ``train(role)``, the memory ledger, the
planner, the CLI and the PPO-style learner step.

Before, a cluster given a critic could only score with it: no optimizer state, no update,
no ``train`` primitive, and nothing in the memory report or the plan for its optimizer.
"""

from __future__ import annotations

import contextlib
import io
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlcluster_lab import (
    GRPOLearner,
    LearnerConfig,
    Role,
    Scenario,
    TrainBatch,
    TrainingConfig,
    ValueBatch,
    build_cluster,
)
from rlcluster_lab.app.learner import critic_advantages
from rlcluster_lab.cli.main import main
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.shardings import memory_kinds
from rlcluster_lab.measure import memory_report
from rlcluster_lab.model.scoring import completion_scores, init_score_model
from rlcluster_lab.planner.plan import plan_scenario
from rlcluster_lab.planner.tables import local_topology
from rlcluster_lab.training.critic import ppo_value_sums, value_train_step
from rlcluster_lab.training.step import init_optimizer_state, token_mean

PAD = 256


def tokens():
    prompts = np.array([[PAD, 97, 98], [99, 100, 101], [PAD, PAD, 102], [103, 104, 105]], np.int32)
    completion = np.array([[104, 105, 258], [106, PAD, PAD], [107, 108, 109], [110, 258, PAD]], np.int32)
    return prompts, completion


def value_batch(values) -> ValueBatch:
    prompts, completion = tokens()
    returns = np.where(completion != PAD, np.array([1.0, -1.0, 0.5, 0.0])[:, None], 0.0)
    return ValueBatch(prompts, completion, returns, np.asarray(values))


@pytest.fixture(scope="module")
def cluster():
    return build_cluster(Scenario(layout="split", with_critic=True, max_tokens=4))


def critic_params(c):
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(c.critic_model, nnx.Param))]


# ------------------------------------------------------------------ the loss


def test_value_loss_is_half_the_masked_mean_of_the_pessimistic_clipped_error():
    model = init_score_model("tiny", seed=3)
    prompts, completion = tokens()
    v = np.asarray(completion_scores(model, jnp.asarray(prompts), jnp.asarray(completion), PAD))
    mask = completion != PAD
    # Rows 0-1: the return is the prediction, the old value 1 below it, so clipping moves the
    # prediction away from the return (the clipped branch is larger); rows 2-3: clipping
    # changes nothing and the unclipped error counts.
    first = np.arange(4)[:, None] < 2
    returns = np.where(first, v, v + 1.0).astype(np.float32)
    old = np.where(first, v - 1.0, v).astype(np.float32)
    arrays = ValueBatch(prompts, completion, returns, old).arrays()
    loss, m = token_mean(*ppo_value_sums(model, arrays, pad_id=PAD, clip_range_value=0.2))

    unclipped = (v - returns) ** 2
    clipped = (np.clip(v, old - 0.2, old + 0.2) - returns) ** 2
    expected = 0.5 * np.maximum(unclipped, clipped)[mask].mean()
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    assert float(m["vf_clipfrac"]) == pytest.approx((clipped > unclipped)[mask].mean(), abs=1e-6)
    assert 0.0 < float(m["vf_clipfrac"]) < 1.0  # both branches are exercised
    assert float(m["vpred_mean"]) == pytest.approx(v[mask].mean(), rel=1e-4, abs=1e-6)
    assert float(m["return_mean"]) == pytest.approx(returns[mask].mean(), rel=1e-4, abs=1e-6)


def test_value_step_accumulates_micro_batches_to_the_same_update():
    graphdef, trainable, frozen = nnx.split(init_score_model("tiny", seed=1), nnx.Param, ...)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    tx = optax.sgd(1.0)
    arrays = value_batch(np.zeros((4, 3), np.float32)).arrays()
    out = {}
    for micro in (None, 2):
        opt = init_optimizer_state(tx, trainable, mesh)
        out[micro] = value_train_step(
            graphdef, tx, trainable, frozen, opt, arrays, pad_id=PAD, clip_range_value=0.2, micro_batch_size=micro
        )
    before = [np.asarray(x) for x in jax.tree.leaves(trainable)]
    for a, w, b in zip(jax.tree.leaves(out[2][0]), jax.tree.leaves(out[None][0]), before):
        np.testing.assert_allclose(np.asarray(a) - b, np.asarray(w) - b, rtol=1e-4, atol=1e-6)
    assert float(out[2][2]["loss"]) == pytest.approx(float(out[None][2]["loss"]), rel=1e-5)


# ------------------------------------------------------------------ the cluster


@pytest.mark.cluster
def test_update_critic_trains_the_critic_with_its_own_optimizer_on_its_mesh(cluster):
    c = cluster
    state = c.critic_optimizer_state
    assert state is not None and c.optimizer_state is not None
    critic_devices = set(c.role_to_mesh[Role.CRITIC].devices.flat)
    assert {d for x in jax.tree.leaves(state) for d in x.sharding.device_set} <= critic_devices
    assert [d.outcome for d in c.trace.by_rule("P12")][-1].startswith("critic optimizer")
    prompts, completion = tokens()
    values = np.asarray(c.get_values(prompts, completion))
    batch = value_batch(values)
    actor_before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(c.actor_model, nnx.Param))]
    before = critic_params(c)
    first = c.update_critic(batch)
    with count_compilations() as found:
        second = c.train(Role.CRITIC, batch)
    assert [name for name, _, _ in found if "value_train_step" in name] == []  # compiled once
    assert len(first) == len(second) == 1 and first[0]["rejected"] == 0.0
    assert second[0]["loss"] < first[0]["loss"]
    assert any(not np.array_equal(a, b) for a, b in zip(critic_params(c), before))
    # The actor and its optimizer are untouched by the critic's update.
    after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(c.actor_model, nnx.Param))]
    assert all(np.array_equal(a, b) for a, b in zip(after, actor_before))
    assert c.critic_optimizer_state is not state


@pytest.mark.cluster
def test_train_dispatches_by_role_and_refuses_the_others(cluster):
    c = cluster
    prompts, completion = tokens()
    zeros = np.zeros(completion.shape, np.float32)
    batch = TrainBatch(prompts, completion, np.array([1.0, -1.0, 0.5, -0.5], np.float32), zeros - 1.0)
    assert len(c.train(Role.ACTOR, batch)) == 1
    assert len(c.train("critic", value_batch(zeros))) == 1
    for role in (Role.REFERENCE, Role.ROLLOUT, "bogus"):
        with pytest.raises(ValueError, match="Unsupported role for train"):
            c.train(role, batch)
    with pytest.raises(TypeError, match="update_critic takes a ValueBatch"):
        c.train(Role.CRITIC, batch)


@pytest.mark.cluster
def test_update_critic_without_a_critic_is_a_clear_error():
    c = build_cluster(Scenario(layout="colocated", max_tokens=4))
    assert c.critic_optimizer_state is None
    assert "critic_optimizer" not in memory_report(c).to_json()["by_role"]
    with pytest.raises(ValueError, match="no critic model"):
        c.update_critic(value_batch(np.zeros((4, 3), np.float32)))


@pytest.mark.cluster
def test_offload_keeps_the_critic_optimizer_state_in_pinned_host_between_updates():
    c = build_cluster(Scenario(layout="colocated", with_critic=True, offload=True, max_tokens=4))
    assert memory_kinds(c.critic_optimizer_state) == ["pinned_host"]
    c.update_critic(value_batch(np.zeros((4, 3), np.float32)))
    assert memory_kinds(c.critic_optimizer_state) == ["pinned_host"]
    assert memory_kinds(nnx.state(c.critic_model)) == ["pinned_host"]


@pytest.mark.cluster
def test_memory_ledger_and_plan_count_the_critic_optimizer_alike(cluster):
    measured = memory_report(cluster).to_json()["by_role"]["critic_optimizer"]
    planned = plan_scenario(Scenario(layout="split", with_critic=True), local_topology()).memory["by_role"]
    assert measured["bytes"] > 0
    assert planned["critic_optimizer"]["bytes"] == measured["bytes"]
    assert planned["critic_optimizer"]["by_kind"] == measured["by_kind"]


def test_training_config_critic_optimizer_and_clip_range():
    assert TrainingConfig().clip_range_value == 0.2
    sgd = optax.sgd(0.1)
    assert TrainingConfig(critic_optimizer=sgd).critic_tx() is sgd
    with pytest.raises(ValueError, match="clip_range_value"):
        TrainingConfig(clip_range_value=0.0)
    with pytest.raises(ValueError, match="critic_learning_rate"):
        TrainingConfig(critic_learning_rate=float("nan"))


# ------------------------------------------------------------------ CLI and learner


def _cli(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


@pytest.mark.cluster
def test_cli_report_and_plan_show_the_critic_optimizer():
    rc, out = _cli(["report", "--critic", "--json"])
    assert rc == 0
    data = json.loads(out)
    assert data["memory"]["by_role"]["critic_optimizer"]["bytes"] > 0
    assert "critic trainable parameters" in [d["test"] for d in data["decisions"]]
    rc, out = _cli(["plan", "--critic", "--json"])
    assert rc == 0
    assert json.loads(out)["memory"]["by_role"]["critic_optimizer"]["bytes"] > 0
    rc, text = _cli(["report", "--critic"])
    assert rc == 0 and "critic_optimizer" in text


def test_critic_advantages_use_the_reward_as_every_tokens_return():
    rewards = np.array([1.0, 0.0, 0.5], np.float32)
    values = np.array([[0.2, 0.4, 9.0], [0.0, 0.0, 0.0], [1.0, 9.0, 9.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], bool)
    advantages, returns = critic_advantages(rewards, values, mask)
    np.testing.assert_array_equal(returns, np.where(mask, rewards[:, None], 0.0))
    raw = rewards - np.array([0.3, 0.0, 1.0])  # padding's values are not in the baseline
    np.testing.assert_allclose(advantages, (raw - raw.mean()) / raw.std(), rtol=1e-5)


@pytest.mark.cluster
def test_learner_runs_ppo_style_steps_with_the_critic():
    c = build_cluster(Scenario(layout="colocated", with_critic=True, max_tokens=4))
    before = critic_params(c)
    result = GRPOLearner(c, LearnerConfig(steps=1, prompts_per_step=2, group_size=2, critic=True)).run()
    assert all(s.value_loss is not None and np.isfinite(s.value_loss) for s in result.steps)
    assert any(not np.array_equal(a, b) for a, b in zip(critic_params(c), before))
    with pytest.raises(ValueError, match="critic=True"):
        GRPOLearner(build_cluster(Scenario(max_tokens=4)), LearnerConfig(critic=True))
