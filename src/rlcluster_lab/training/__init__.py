"""Training on cluster operations: the batch, the GRPO-style loss and optimizer step (P12), and
the toy GRPO learner that runs whole RL steps (generate, reward, log-probs, update, sync)."""

from rlcluster_lab.training.step import TrainBatch, grpo_loss, init_optimizer_state, train_step

__all__ = ["TrainBatch", "grpo_loss", "init_optimizer_state", "train_step"]
