"""The shapes of one RL step the planner sizes activations and the KV cache by (L4).

JAX-free, so the CLI can build its flags from the defaults before the backend starts.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS


def _said(field: str) -> str:
    """A field with its ``plan`` flag, as a refusal names it (``core.knobs.describe`` keeps one of the two)."""
    return f"{field} ({KNOBS[field].flag})"


@dataclasses.dataclass(frozen=True)
class Workload:
    """The shapes of one RL step: how many rows are sampled and trained, and how long they are.

    Defaults are the lab's step (4 prompts x group 4, 16 new tokens in a 128-slot cache).

    Args:
        rollout_batch_size: completions sampled at once (rows of the KV cache).
        prompt_length: prompt tokens per row.
        max_tokens: completion tokens per row.
        kv_cache_size: cache slots per row; at least prompt_length + max_tokens.
        micro_batch_size: rows per training micro-batch (None: the whole batch in one piece).
        remat: plan a step that rematerialises every layer (the lab's does not).
    """

    # The defaults are the knobs' (``core.knobs``), which ``plan``'s flags take too.
    rollout_batch_size: int = KNOBS["rollout_batch_size"].default
    prompt_length: int = KNOBS["prompt_length"].default
    max_tokens: int = KNOBS["max_tokens"].default
    kv_cache_size: int = KNOBS["kv_cache_size"].default
    micro_batch_size: int | None = None
    remat: bool = False

    def __post_init__(self) -> None:
        for name in ("rollout_batch_size", "prompt_length", "max_tokens", "kv_cache_size", "micro_batch_size"):
            value, optional = getattr(self, name), name == "micro_batch_size"
            if value is None and optional:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                allowed = "a positive int or None" if optional else "a positive int"
                raise ConfigError(f"{_said(name)} must be {allowed}, got {value!r:.40}", knobs=(name,))
            object.__setattr__(self, name, int(value))  # a NumPy integer becomes a plain one
        if self.prompt_length + self.max_tokens > self.kv_cache_size:
            raise ConfigError(
                f"a row needs {_said('prompt_length')} + {_said('max_tokens')} = "
                f"{self.prompt_length + self.max_tokens} cache slots but {_said('kv_cache_size')} is "
                f"{self.kv_cache_size}: raise it or shorten the rows",
                knobs=("kv_cache_size", "prompt_length", "max_tokens"),
            )

    @classmethod
    def of_scenario(cls, scenario: Any) -> Workload:
        """A scenario's token counts (its cache, its new tokens, the longest prompt beside them),
        over the default rows."""
        return cls(
            prompt_length=scenario.kv_cache_size - scenario.max_tokens,
            max_tokens=scenario.max_tokens,
            kv_cache_size=scenario.kv_cache_size,
        )

    @property
    def sequence_length(self) -> int:
        """Tokens per training row: prompt and completion."""
        return self.prompt_length + self.max_tokens

    @property
    def train_rows(self) -> int:
        """Rows whose activations are alive at once in a training step."""
        micro = self.micro_batch_size
        return self.rollout_batch_size if micro is None else min(micro, self.rollout_batch_size)

    @property
    def accumulates(self) -> bool:
        """Whether a step sums the gradients of several micro-batches."""
        return self.train_rows < self.rollout_batch_size

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "sequence_length": self.sequence_length,
            "train_rows": self.train_rows,
            "accumulates": self.accumulates,
        }
