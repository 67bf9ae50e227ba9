"""The training batch and the input contracts of the training operations, checked on the host
before anything reaches a device: a (B, 1) advantage column broadcasts into (B, B, C), and a NaN
advantage or an id past the vocabulary turns every parameter to NaN after one step. Each error
names the argument, what it was, and what was expected."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Self

import numpy as np

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.model.logps import check_token_batch, check_token_ids
from rlcluster_lab.model.sampling import check_prompts

# The operations' prompt check is the sampler's (a bare string refused, at least one prompt).
validate_prompts = check_prompts


class TokenBatch:
    """What ``TrainBatch`` and the critic's ``ValueBatch`` share: ids checked on the host, rows picked."""

    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray

    def _check_ids(self, learner: str) -> tuple[int, ...]:
        """Refuse an empty batch (of ``learner``'s update) or malformed ids, keep the ids as host
        arrays, and return the completions' shape (B, C)."""
        name = type(self).__name__
        if np.shape(self.prompt_tokens)[:1] == (0,):
            raise ConfigError(f"Cannot update the {learner} from an empty batch ({name}.prompt_tokens has no rows).")
        names = (f"{name}.prompt_tokens", f"{name}.completion_tokens")
        prompt, completion = check_token_batch(self.prompt_tokens, self.completion_tokens, None, names=names)
        object.__setattr__(self, "prompt_tokens", prompt)
        object.__setattr__(self, "completion_tokens", completion)
        return completion.shape

    def _set_floats(self, name: str, shape: tuple[int, ...], meaning: str, copy: bool = False) -> None:
        """Keep field ``name`` as a finite float32 host array of exactly ``shape`` (a copy of its own
        if ``copy``); errors name ``<class>.<name>``."""
        owner, value = type(self).__name__, getattr(self, name)
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{owner}.{name} must be a float array {meaning}, got {type(value).__name__}")
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
            raise TypeError(f"{owner}.{name} must hold real numbers {meaning}, got dtype {arr.dtype}")
        if arr.shape != shape:
            hint = ""
            if arr.ndim == len(shape) + 1 and arr.shape[-1] == 1:
                hint = f": a trailing axis of 1 would broadcast into a wrong loss; pass {name}.reshape{shape}"
            raise ConfigError(f"{owner}.{name} has shape {arr.shape}; expected {shape} ({meaning}){hint}")
        arr = arr.astype(np.float32, copy=False)
        finite = np.isfinite(arr)
        if not finite.all():
            where = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ConfigError(
                f"{owner}.{name} holds {arr[where]} at index {where}; every value must be finite: one NaN "
                "or inf here makes every updated parameter NaN"
            )
        object.__setattr__(self, name, arr.copy() if copy else arr)

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def validate(self, vocab_size: int | None) -> Self:
        """Every id below ``vocab_size`` (the rest was checked at construction), else a ``ConfigError``; self."""
        for field in ("prompt_tokens", "completion_tokens"):
            check_token_ids(f"{type(self).__name__}.{field}", getattr(self, field), vocab_size)
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """The fields as host arrays, ids as int32 and values as float32 (None fields left out)."""
        fields = (f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]
        return {
            k: np.asarray(v, np.int32 if k.endswith("_tokens") else np.float32)
            for k in fields
            if (v := getattr(self, k)) is not None
        }

    def rows(self, index: slice | np.ndarray) -> Self:
        pick = lambda x: None if x is None else np.asarray(x)[index]  # noqa: E731
        return type(self)(*(pick(getattr(self, f.name)) for f in dataclasses.fields(self)))  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class TrainBatch(TokenBatch):
    """One batch of sampled completions with what the loss needs, checked at construction: ids >= 0
    (below the vocabulary: ``validate``), values finite, kept as float32 host arrays.

    Raises:
        TypeError: ids that are not integers, or values that are not numbers.
        ConfigError: an empty batch, a wrong shape (the message gives the one expected), a
            negative id, or a NaN/inf value.
    """

    prompt_tokens: np.ndarray  # (B, P) left-padded, B, P >= 1
    completion_tokens: np.ndarray  # (B, C) right-padded, C >= 1
    advantages: np.ndarray  # (B,)
    old_logps: np.ndarray  # (B, C): the anchor's (P11)
    ref_logps: np.ndarray | None = None  # (B, C): the frozen reference's; None: no KL term

    def __post_init__(self) -> None:
        b, c = self._check_ids("actor")
        self._set_floats("advantages", (b,), "one advantage per completion")
        per_token = "one log-prob per completion token, like completion_tokens"
        self._set_floats("old_logps", (b, c), per_token)
        if self.ref_logps is not None:
            self._set_floats("ref_logps", (b, c), per_token)


_BATCH_KEYS = ("prompt_tokens", "completion_tokens", "advantages", "old_logps", "ref_logps")


def batch_arrays(batch: TrainBatch) -> dict[str, np.ndarray]:
    """The batch as the training step's inputs: host arrays (int32 ids, float32 values), checked
    against the model (``validate_batch_arrays``) before the jitted program moves them."""
    if not isinstance(batch, TrainBatch):
        raise TypeError(f"batch_arrays takes a TrainBatch, got {type(batch).__name__}")
    return batch.arrays()


def validate_batch_arrays(batch: dict[str, Any], vocab_size: int | None) -> None:
    """The training step's batch dict: known keys, the TrainBatch shapes, ids in the vocabulary and
    finite values (values checked only for NumPy arrays: device arrays pay no transfer); refused as
    ``TrainBatch`` refuses, naming the key."""
    if not isinstance(batch, dict):
        raise TypeError(f"the training step's batch must be a dict of arrays, got {type(batch).__name__}")
    unknown = sorted(set(batch) - set(_BATCH_KEYS))
    missing = [k for k in _BATCH_KEYS[:4] if k not in batch]
    if unknown or missing:
        raise ConfigError(
            f"the training step's batch has keys {sorted(batch)}; expected {list(_BATCH_KEYS[:4])} and optionally "
            f"'ref_logps' (missing: {missing}, unexpected: {unknown}); build it with batch_arrays(TrainBatch(...))"
        )
    shapes = {k: tuple(np.shape(v)) for k, v in batch.items()}
    p_shape, c_shape = shapes["prompt_tokens"], shapes["completion_tokens"]
    if len(p_shape) != 2 or 0 in p_shape:
        raise ConfigError(f"batch['prompt_tokens'] has shape {p_shape}; expected (B, P) with B, P >= 1")
    b = p_shape[0]
    if len(c_shape) != 2 or c_shape[0] != b or c_shape[1] == 0:
        raise ConfigError(f"batch['completion_tokens'] has shape {c_shape}; expected ({b}, C) with C >= 1")
    expected = {"advantages": (b,), "old_logps": c_shape, "ref_logps": c_shape}
    for key, want in expected.items():
        if key in shapes and shapes[key] != want:
            raise ConfigError(f"batch[{key!r}] has shape {shapes[key]}; expected {want}")
    for key in ("prompt_tokens", "completion_tokens"):
        if isinstance(batch[key], np.ndarray):
            check_token_ids(f"batch[{key!r}]", batch[key], vocab_size)
    for key in expected:
        if isinstance(batch.get(key), np.ndarray) and not np.isfinite(batch[key]).all():
            raise ConfigError(f"batch[{key!r}] holds NaN or inf; every value must be finite")


def mini_batches(size: int, mini_batch_size: int | None, *, name: str = "micro_batch_size") -> list[slice]:
    """Row slices of ``size`` rows in chunks of ``mini_batch_size`` (None, or a size above ``size``: one
    chunk). A ``ConfigError`` for an empty batch or a size below 1, a ``TypeError`` for a size that
    is not an int (0 is not "the whole batch": pass None)."""
    if size < 1:
        raise ConfigError("Cannot split an empty batch; pass at least one row.")
    if mini_batch_size is None:
        return [slice(0, size)]
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, numbers.Integral):
        raise TypeError(f"{name} must be a positive int or None, got {type(mini_batch_size).__name__}")
    if mini_batch_size < 1:
        raise ConfigError(
            f"{name} must be a positive int (rows per call) or None (the whole batch at once), got {mini_batch_size}"
        )
    step = min(int(mini_batch_size), size)
    return [slice(i, min(i + step, size)) for i in range(0, size, step)]
