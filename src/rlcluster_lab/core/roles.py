"""The roles a model can play in an RL run, and the rollout modes."""

from __future__ import annotations

import enum


class Role(enum.Enum):
    """What a model is used for. The value is the lower-case name used in reports."""

    ACTOR = "actor"  # the trained policy
    ROLLOUT = "rollout"  # the sampler
    REFERENCE = "reference"  # frozen KL anchor
    REWARD = "reward"  # reward model
    CRITIC = "critic"  # value model

    @classmethod
    def parse(cls, value: Role | str) -> Role:
        if isinstance(value, Role):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"unknown role {value!r}; known roles: {', '.join(r.value for r in cls)}") from None


class Mode(enum.Enum):
    """Which rollout configuration a call uses."""

    TRAIN = "train"
    EVAL = "eval"
