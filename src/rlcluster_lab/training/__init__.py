"""Training on cluster operations: the batch and its input contracts, the GRPO-style loss, the
critic's clipped value loss and their transactional optimizer steps (P12), and the toy GRPO
learner that runs whole RL steps (generate, reward, log-probs, update, sync)."""

from rlcluster_lab.training.batch import TrainBatch
from rlcluster_lab.training.critic import ValueBatch

__all__ = ["TrainBatch", "ValueBatch"]
