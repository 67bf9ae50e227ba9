"""The lab's rehearsal (lab.rehearsal) compiles a step's programs and touches nothing a call
on the cluster reads: not the engine's seeds, not the weights, the optimizer state, the
anchor, the step count or the record of contexts entered."""

from __future__ import annotations

import threading

import jax
import pytest
from flax import nnx

from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.lab.rehearsal import rehearse_step

pytestmark = pytest.mark.cluster  # every test here builds a cluster and compiles a step

PROMPTS = ["abc", "hello world", "x", "rl"]


@pytest.fixture(scope="module")
def cluster():
    return build_cluster(Scenario(layout="split", max_tokens=4))


def test_a_rehearsal_changes_nothing_a_call_reads(cluster):
    actor = jax.tree.leaves(nnx.state(cluster.actor_model))
    rollout = jax.tree.leaves(nnx.state(cluster.rollout.model()))
    optimizer, anchor = cluster.optimizer_state, cluster.pinned_anchor_state
    contexts, steps = cluster.contexts_entered, cluster.global_steps
    assert rehearse_step(cluster, PROMPTS) is True
    assert all(a is b for a, b in zip(jax.tree.leaves(nnx.state(cluster.actor_model)), actor, strict=True))
    assert all(a is b for a, b in zip(jax.tree.leaves(nnx.state(cluster.rollout.model())), rollout, strict=True))
    assert cluster.optimizer_state is optimizer and cluster.pinned_anchor_state is anchor
    assert cluster.contexts_entered == contexts and cluster.global_steps == steps


def test_generate_calls_during_a_rehearsal_draw_new_seeds(cluster, monkeypatch):
    """Before, the rehearsal saved the engine's call counter and put it back afterwards, so
    generate calls made meanwhile from another thread reused their seeds."""
    engine = cluster.rollout
    sample = engine.generate_with_seed
    seeds: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def recording(prompts, rollout_config, seed):
        if threading.current_thread().name == "rehearsal":
            inside.set()  # the rehearsal is sampling: the user's calls happen now
            release.wait(timeout=120)
        else:
            seeds.append(seed)
        return sample(prompts, rollout_config, seed)

    monkeypatch.setattr(engine, "generate_with_seed", recording)
    rehearsal = threading.Thread(target=rehearse_step, args=(cluster, PROMPTS), name="rehearsal")
    rehearsal.start()
    assert inside.wait(timeout=120)
    texts = [cluster.generate(PROMPTS).text for _ in range(3)]
    release.set()
    rehearsal.join()
    texts += [cluster.generate(PROMPTS).text for _ in range(3)]
    assert len(set(seeds)) == 6
    assert len({tuple(t) for t in texts}) == 6


class Stop(Exception):
    """Ends a learner's step at its first operation."""


def test_the_learner_names_its_next_prompts_without_drawing_them(cluster, monkeypatch):
    learner = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2))
    upcoming = learner.next_prompts()
    assert learner.next_prompts() == upcoming
    sampled: list[list[str]] = []

    def stop(prompts, *args, **kwargs):
        sampled.append(list(prompts))
        raise Stop

    monkeypatch.setattr(cluster, "generate", stop)
    with pytest.raises(Stop):
        learner.step()
    assert sampled == [upcoming]  # the step sampled exactly the prompts the rehearsal was given


def test_an_offloaded_cluster_is_not_rehearsed():
    offloaded = build_cluster(Scenario(layout="colocated", offload=True, max_tokens=4))
    contexts = offloaded.contexts_entered
    assert rehearse_step(offloaded, PROMPTS) is False
    assert offloaded.contexts_entered == contexts
