"""Gradient accumulation (the reference's training micro-batch size).

Before, ``TrainingConfig`` had no ``train_micro_batch_size``: every mini-batch
was one forward/backward pass. Now each mini-batch step sums the gradients of
``mini_batch_size // train_micro_batch_size`` micro-batches, weighted by their
tokens, before one optimizer update, which must equal one step on the whole
mini-batch.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

from rlcluster_lab import ConfigError, Scenario, TrainBatch, TrainingConfig, build_cluster
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.model import init_model
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.training.batch import batch_arrays
from rlcluster_lab.training.step import init_optimizer_state, train_step

TOK = ByteTokenizer()
ONE_DEVICE = Mesh(np.array(jax.devices()[:1]), ("data",))


def batch() -> TrainBatch:
    # Rows with 3, 1, 3 and 2 real tokens: micro-batches hold different token counts, so a
    # mean of micro-batch means would differ from the mini-batch's token mean.
    prompts = TOK.encode_batch_left_padded(["ab", "cde", "f", "gh"], length=4)
    pad = TOK.pad_id
    completion = np.array([[104, 105, 258], [106, pad, pad], [107, 108, 109], [110, 258, pad]], np.int32)
    rng = np.random.default_rng(0)
    old = rng.uniform(-3.0, -1.0, completion.shape).astype(np.float32)
    ref = rng.uniform(-3.0, -1.0, completion.shape).astype(np.float32)
    return TrainBatch(prompts, completion, np.array([1.0, -1.0, 0.5, -0.25], np.float32), old, ref)


def step(tx, micro):
    graphdef, trainable, frozen = nnx.split(init_model("tiny", seed=0), nnx.Param, ...)
    opt_state = init_optimizer_state(tx, trainable, ONE_DEVICE)
    new, opt, m = train_step(
        graphdef,
        tx,
        trainable,
        frozen,
        opt_state,
        batch_arrays(batch()),
        1.0,
        pad_id=TOK.pad_id,
        beta=0.04,
        epsilon=0.2,
        micro_batch_size=micro,
    )
    return trainable, new, opt, {k: float(v) for k, v in m.items()}


def leaves(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("micro", [1, 2])
def test_accumulated_micro_batches_give_the_update_of_one_step_on_the_mini_batch(micro):
    tx = optax.sgd(1.0)  # the update is minus the gradient: compares the gradients themselves
    before, whole, _, m_whole = step(tx, None)
    _, accumulated, _, m_acc = step(tx, micro)
    deltas = [w - b for w, b in zip(leaves(whole), leaves(before))]
    assert max(np.abs(d).max() for d in deltas) > 1e-4  # the step moved something
    for a, w, b in zip(leaves(accumulated), leaves(whole), leaves(before)):
        np.testing.assert_allclose(a - b, w - b, rtol=1e-4, atol=1e-6)
    for key in ("loss", "kl", "clip_fraction", "grad_norm"):
        assert m_acc[key] == pytest.approx(m_whole[key], rel=1e-5, abs=1e-7)
    assert m_acc["rejected"] == 0.0


def test_accumulation_keeps_the_step_transactional():
    # A NaN learning rate makes the accumulated update non-finite: the old state is kept.
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=float("nan"))
    before, new, _, m = step(tx, 2)
    assert m["rejected"] == 3.0
    for a, b in zip(leaves(new), leaves(before)):
        np.testing.assert_array_equal(a, b)


def test_a_micro_batch_that_does_not_divide_the_step_is_refused():
    with pytest.raises(ConfigError, match="train_micro_batch_size=3"):
        step(optax.sgd(1.0), 3)


def test_training_config_derives_accumulation_steps_as_the_reference():
    assert TrainingConfig(mini_batch_size=16, train_micro_batch_size=4).gradient_accumulation_steps == 4
    assert TrainingConfig(mini_batch_size=8, train_micro_batch_size=8).gradient_accumulation_steps == 1
    assert TrainingConfig(mini_batch_size=8).gradient_accumulation_steps is None
    assert TrainingConfig().gradient_accumulation_steps is None


MICRO_POSITIVE = r"train_micro_batch_size \(--micro-batch-size\) must be a positive integer"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"train_micro_batch_size": 4}, r"mini_batch_size \(--mini-batch-size\) must be set when train_micro"),
        (
            {"mini_batch_size": 10, "train_micro_batch_size": 3},
            r"= 10 must be a multiple of train_micro_batch_size \(--micro-batch-size\) = 3",
        ),
        ({"mini_batch_size": 8, "train_micro_batch_size": 0}, MICRO_POSITIVE),
        ({"mini_batch_size": 8, "train_micro_batch_size": 4.5}, MICRO_POSITIVE),
        ({"mini_batch_size": 8, "train_micro_batch_size": True}, MICRO_POSITIVE),
        ({"mini_batch_size": -8, "train_micro_batch_size": 4}, r"mini_batch_size \(--mini-batch-size\) must be >= 1"),
    ],
)
def test_bad_micro_batch_combinations_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainingConfig(**kwargs)


@pytest.mark.cluster
def test_update_actor_accumulates_and_matches_the_unaccumulated_cluster_without_extra_compilations():
    scenario = Scenario(layout="colocated", max_tokens=4)
    whole = build_cluster(scenario, training_config=TrainingConfig(optimizer=optax.sgd(0.5), mini_batch_size=4))
    acc = build_cluster(
        scenario,
        training_config=TrainingConfig(optimizer=optax.sgd(0.5), mini_batch_size=4, train_micro_batch_size=2),
    )
    before = leaves(nnx.state(acc.actor_model, nnx.Param))
    whole.update_actor(batch())
    m = acc.update_actor(batch())
    assert len(m) == 1  # one optimizer update for the mini-batch
    after = leaves(nnx.state(acc.actor_model, nnx.Param))
    for a, w, b in zip(after, leaves(nnx.state(whole.actor_model, nnx.Param)), before):
        np.testing.assert_allclose(a - b, w - b, rtol=1e-4, atol=1e-6)
    with count_compilations() as found:
        acc.update_actor(batch())
    assert [name for name, _, _ in found if "train_step" in name] == []
    # A batch that is not a whole number of mini-batches is refused before anything moves.
    three = batch().rows(slice(0, 3))
    with pytest.raises(ConfigError, match="not a multiple of mini_batch_size=4"):
        acc.update_actor(three)
