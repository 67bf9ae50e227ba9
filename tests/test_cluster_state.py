"""The cluster owns its state: its operations run one at a time, and the generic primitives
follow the named shorthands, as in the reference."""

from __future__ import annotations

import threading
import warnings

import jax
import numpy as np
import pytest
from flax import nnx

from rlcluster_lab import (
    AvoidableCopyWarning,
    ClusterConfig,
    RLCluster,
    Role,
    RolloutConfig,
    TrainBatch,
    init_model,
    layout_meshes,
    place_model,
)
from rlcluster_lab.model.tokenizer import ByteTokenizer
from rlcluster_lab.training.critic import ValueBatch

pytestmark = pytest.mark.cluster  # every test here builds a cluster

PROMPTS = ["abc", "hello world", "x", "rl"]


def fresh(cls: type[RLCluster] = RLCluster) -> RLCluster:
    """A small colocated cluster; two calls build equal ones (same seeds, same config)."""
    r2m = layout_meshes("colocated")
    reference = place_model(init_model("tiny", seed=0), r2m[Role.ACTOR])
    actor = place_model(reference, r2m[Role.ACTOR], copy=True)
    cfg = ClusterConfig(role_to_mesh=r2m, rollout_config=RolloutConfig(max_tokens_to_generate=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AvoidableCopyWarning)
        return cls(actor=actor, reference=reference, cluster_config=cfg)


def values(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def a_batch() -> TrainBatch:
    """Four rows of fixed tokens (no sampling: nothing to compile but the step)."""
    prompts = ByteTokenizer().encode_batch_left_padded(["ab", "cde", "f", "gh"], length=4)
    completion = np.array([[104, 105, 258], [106, 258, 256], [107, 108, 109], [110, 258, 256]], np.int32)
    old = np.full(completion.shape, -1.0, np.float32)
    return TrainBatch(prompts, completion, np.array([1.0, -1.0, 0.5, -0.5], np.float32), old)


def test_two_threads_stepping_one_cluster_at_once_take_two_steps():
    """Before, both steps started from the same parameters and one was lost: the result
    equalled a single step. Now the second call waits for the first, so the result equals
    two sequential steps, parameters and optimizer state alike."""
    sequential = fresh()
    batch = a_batch()
    sequential.update_actor(batch)
    sequential.update_actor(batch)

    c = fresh()
    first_inside, second_inside = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold(*_):
        # Inside the first step: give the second call the chance to start its own step
        # meanwhile. Serialized, it cannot, and this wait only ends at its bound; the result
        # below does not depend on how long it was.
        first_inside.set()
        second_inside.wait(timeout=2.0)

    def step(on_step) -> None:
        try:
            c.update_actor(batch, on_step=on_step)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    first = threading.Thread(target=step, args=(hold,))
    first.start()
    assert first_inside.wait(timeout=120)
    second = threading.Thread(target=step, args=(lambda *_: second_inside.set(),))
    second.start()
    first.join()
    second.join()
    assert errors == []
    for mine, theirs in (
        (nnx.state(c.actor_model), nnx.state(sequential.actor_model)),
        (c.optimizer_state, sequential.optimizer_state),
    ):
        assert all(np.array_equal(a, b) for a, b in zip(values(mine), values(theirs), strict=True))


class Marked(RLCluster):
    """Overrides every named shorthand with one that says which it was and what it got."""

    def get_ref_per_token_logps(self, prompt_tokens, completion_tokens, micro_batch_size=None):
        return ("ref", micro_batch_size)

    def get_actor_per_token_logps(self, prompt_tokens, completion_tokens, micro_batch_size=None):
        return ("actor", micro_batch_size)

    def get_old_per_token_logps(self, prompt_tokens, completion_tokens, micro_batch_size=None):
        return ("old", micro_batch_size)

    def update_actor(self, batch, on_step=None):
        return [{"update_actor": float(on_step is not None)}]

    def update_critic(self, batch):
        return [{"update_critic": 1.0}]


@pytest.fixture(scope="module")
def marked() -> Marked:
    return fresh(Marked)


def test_per_token_logps_returns_the_shorthand_a_subclass_overrides(marked):
    tokens = np.ones((2, 3), np.int32)
    assert marked.per_token_logps(Role.REFERENCE, tokens, tokens, 2) == ("ref", 2)
    assert marked.per_token_logps("actor", tokens, tokens) == ("actor", None)
    assert marked.per_token_logps(Role.ROLLOUT, tokens, tokens, 1) == ("old", 1)
    with pytest.raises(ValueError, match="actor, reference or rollout"):
        marked.per_token_logps(Role.REWARD, tokens, tokens)


def test_train_returns_the_update_a_subclass_overrides(marked):
    tokens = np.ones((2, 3), np.int32)
    zeros = np.zeros((2, 3), np.float32)
    batch = TrainBatch(tokens, tokens, np.zeros(2, np.float32), zeros)
    assert marked.train(Role.ACTOR, batch, on_step=print) == [{"update_actor": 1.0}]
    assert marked.train("critic", ValueBatch(tokens, tokens, zeros, zeros)) == [{"update_critic": 1.0}]
    with pytest.raises(ValueError, match="Unsupported role for train: reference"):
        marked.train("reference", batch)
