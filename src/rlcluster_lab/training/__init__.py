"""Training on cluster operations: the batch and its input contracts, the GRPO-style loss, the
critic's clipped value loss and their transactional optimizer steps (P12), and the toy GRPO
learner that runs whole RL steps (generate, reward, log-probs, update, sync)."""

from rlcluster_lab.training.batch import TrainBatch, validate_prompts
from rlcluster_lab.training.critic import ValueBatch, ppo_value_loss, value_train_step
from rlcluster_lab.training.step import grpo_loss, init_optimizer_state, rejection_reason, train_step

__all__ = [
    "TrainBatch",
    "ValueBatch",
    "grpo_loss",
    "init_optimizer_state",
    "ppo_value_loss",
    "rejection_reason",
    "train_step",
    "validate_prompts",
    "value_train_step",
]
