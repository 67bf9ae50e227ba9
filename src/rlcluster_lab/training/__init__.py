"""Training on cluster operations: the batch and its input contracts, the GRPO-style loss and
transactional optimizer step (P12), and the toy GRPO learner that runs whole RL steps
(generate, reward, log-probs, update, sync)."""

from rlcluster_lab.training.batch import TrainBatch, validate_prompts
from rlcluster_lab.training.step import grpo_loss, init_optimizer_state, rejection_reason, train_step

__all__ = ["TrainBatch", "grpo_loss", "init_optimizer_state", "rejection_reason", "train_step", "validate_prompts"]
