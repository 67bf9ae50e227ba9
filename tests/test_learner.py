"""The toy GRPO learner: it learns, and it shows P11 numerically."""

from __future__ import annotations

import numpy as np
import pytest

from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, TrainingConfig, build_cluster
from rlcluster_lab.app.learner import RewardWords, group_advantages, lowercase_reward, rewards


def test_lowercase_reward_counts_letters():
    np.testing.assert_allclose(lowercase_reward(["p"] * 3, ["abc", "aB1!", ""]), [1.0, 0.25, 0.0])


def test_group_advantages_are_normalised_within_groups():
    adv = group_advantages(np.array([0.0, 1.0, 5.0, 5.0], np.float32), 2)
    np.testing.assert_allclose(adv, [-1.0, 1.0, 0.0, 0.0], atol=1e-5)
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(np.zeros(4, np.float32), 3)


@pytest.mark.cluster
def test_a_learner_whose_batch_is_no_whole_number_of_mini_batches_is_refused_before_any_step():
    from rlcluster_lab import ConfigError

    training = TrainingConfig(mini_batch_size=4, train_micro_batch_size=2)
    cluster = build_cluster(Scenario(layout="colocated", max_tokens=4), training_config=training)
    with pytest.raises(
        ConfigError, match=r"6 completions .* not a multiple of mini_batch_size \(--mini-batch-size\) = 4"
    ) as info:
        GRPOLearner(cluster, LearnerConfig(prompts_per_step=3, group_size=2))
    assert info.value.knobs == ("prompts_per_step", "group_size", "mini_batch_size")
    assert cluster.global_steps == 0
    GRPOLearner(cluster, LearnerConfig(prompts_per_step=2, group_size=2))  # 4 completions: one mini-batch


def test_learner_rejects_groups_of_one():
    with pytest.raises(ValueError, match="group_size"):
        LearnerConfig(group_size=1)


@pytest.fixture(scope="module")
def run():
    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=8),
        training_config=TrainingConfig(learning_rate=3e-3, mini_batch_size=8),
    )
    learner = GRPOLearner(cluster, LearnerConfig(steps=20, prompts_per_step=4, group_size=4, seed=0))
    return cluster, learner.run()


@pytest.mark.cluster
def test_learner_raises_the_toy_reward(run):
    _, result = run
    first, last = np.mean(result.rewards[:5]), np.mean(result.rewards[-5:])
    assert last > first + 0.2, result.rewards


@pytest.mark.cluster
def test_learner_steps_and_syncs_through_the_cluster(run):
    cluster, result = run
    assert cluster.global_steps == 20
    assert all(s.optimizer_steps == 2 for s in result.steps)  # batch 16, mini-batch 8


@pytest.mark.cluster
def test_p11_learner_shows_live_weights_drift_from_the_anchor(run):
    _, result = run
    first = [p.live_vs_anchor for p in result.p11 if p.steps_taken_before == 0]
    later = [p.live_vs_anchor for p in result.p11 if p.steps_taken_before > 0]
    assert len(later) == 20
    assert max(first) < 1e-4
    assert min(later) > 1e-3
    assert max(p.anchor_vs_sampler for p in result.p11) < 1e-4


@pytest.mark.cluster
def test_learner_can_take_rewards_from_the_reward_model():
    import jax.numpy as jnp

    cluster = build_cluster(Scenario(layout="split", max_tokens=4, with_reward=True))
    head = cluster.reward_model.score_head
    # A reward model that scores every sequence 0.75: the learner must report exactly that.
    head.kernel.set_value(jnp.zeros_like(head.kernel.get_value()))
    head.bias.set_value(jnp.full_like(head.bias.get_value(), 0.75))
    learner = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2), use_reward_model=True)
    result = learner.run()
    assert result.steps[0].mean_reward == pytest.approx(0.75, abs=1e-6)
    assert cluster.global_steps == 1


@pytest.mark.cluster
def test_learner_rejects_two_reward_sources():
    cluster = build_cluster(Scenario(layout="colocated", max_tokens=4, with_reward=True))
    with pytest.raises(ValueError, match="not both"):
        GRPOLearner(cluster, reward_fn=lowercase_reward, use_reward_model=True)


@pytest.mark.cluster
def test_a_diverged_run_stops_before_a_step_scores_or_applies_anything():
    import jax
    from flax import nnx

    from rlcluster_lab import ConfigError

    cluster = build_cluster(
        Scenario(layout="colocated", max_tokens=4), training_config=TrainingConfig(learning_rate=1e9, mini_batch_size=8)
    )
    learner = GRPOLearner(cluster, LearnerConfig(prompts_per_step=4, group_size=4))
    # The first update takes the weights to about 1e9, still finite; the second's loss is NaN: rejected.
    first = learner.step()
    assert first.rejected is not None and first.rejected_steps >= 1 and cluster.global_steps == 1
    weights = [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model))]
    with pytest.raises(ConfigError, match="the run has diverged") as info:
        learner.step()
    assert info.value.knobs == ("learning_rate",) and "step 0 already said" in str(info.value)
    assert cluster.global_steps == 1 and len(learner.history) == 1
    assert all(map(np.array_equal, (np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_model))), weights))


def _plain(prompts, completions):
    """Length of each completion.

    More lines that are not said."""
    return np.asarray([len(c) for c in completions], np.float32)


class _Scorer:
    def __call__(self, prompts, completions):
        return np.zeros(len(completions), np.float32)


@rewards("how many vowels each completion has", "the actor writes more vowels")
def _declared(prompts, completions):
    return np.asarray([sum(ch in "aeiou" for ch in c) for c in completions], np.float32)


@pytest.mark.parametrize(
    "reward_fn, rewarded, rising",
    [
        (lowercase_reward, "lowercase ASCII letters a-z", "learning the toy task"),
        (_declared, "how many vowels each completion has", "the actor writes more vowels"),
        (_plain, "what _plain returns for each completion: Length of each completion", "higher under _plain"),
        (_Scorer(), "what _Scorer returns for each completion", "higher under _Scorer"),
        (lambda p, c: np.zeros(len(c)), "what <lambda> returns for each completion", "higher under <lambda>"),
    ],
)
def test_a_reward_function_says_what_it_rewards_and_what_a_rising_curve_means(reward_fn, rewarded, rising):
    words = RewardWords.of(reward_fn)
    assert rewarded in words.rewarded and rising in words.rising
    assert "More lines" not in words.rewarded  # the docstring's first line only
