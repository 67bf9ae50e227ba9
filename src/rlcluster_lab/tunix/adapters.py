"""What Tunix 0.1.7 asks of the models and tokenizer it is handed, met for the lab's own: a KV-cache
``config`` for the vanilla engine (``check_model``), partition specs on the mesh's own axes
(``lab_axis_rules``, P5), and ``bos_id()``, ``eos_id()``, ``pad_id()`` (``TunixTokenizer``).
Tunix's sampler calls a model with arguments the lab's does not take, so the comparison stays
with construction and the weight sync."""

from __future__ import annotations

from typing import Any

from flax import nnx

from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.meshes import DEFAULT_LOGICAL_AXIS_RULES
from rlcluster_lab.core.roles import Role
from rlcluster_lab.model.tokenizer import ByteTokenizer

# What Tunix's vanilla engine reads from ``model.config`` to size its KV cache.
CONFIG_FIELDS = ("num_layers", "num_kv_heads", "head_dim")


class TunixTokenizer:
    """The lab's byte tokenizer with the methods Tunix's tokenizer adapter looks for."""

    def __init__(self) -> None:
        self.inner = ByteTokenizer()

    def encode(self, text: str, **_: Any) -> list[int]:
        return self.inner.encode(text)

    def decode(self, ids: Any, **_: Any) -> str:
        return self.inner.decode(ids)

    def bos_id(self) -> int:
        return int(self.inner.bos_id)

    def eos_id(self) -> int:
        return int(self.inner.eos_id)

    def pad_id(self) -> int:
        return int(self.inner.pad_id)


def lab_axis_rules() -> Any:
    """A context in which the lab's logical partition names resolve to mesh axes while Tunix reads specs (P5)."""
    return nnx.logical_axis_rules(list(DEFAULT_LOGICAL_AXIS_RULES))


def check_model(model: Any, role: str, engine: str) -> None:
    """Refuse (``ConfigError``) a model Tunix's construction would not take: not an ``nnx.Module``, or
    (vanilla engine) no ``config`` with ``CONFIG_FIELDS``."""
    if not isinstance(model, nnx.Module):
        raise ConfigError(
            f"Tunix 0.1.7 takes the {role} as an nnx.Module (loading from a path is not supported there), "
            f"got {type(model).__name__}; load the model first and pass the module"
        )
    if engine == "vanilla" and role == "actor":
        missing = [f for f in CONFIG_FIELDS if not hasattr(getattr(model, "config", None), f)]
        if missing:
            raise ConfigError(
                f"Tunix's vanilla engine sizes its KV cache from model.config.{{{', '.join(CONFIG_FIELDS)}}}; "
                f"the actor ({type(model).__name__}) lacks {', '.join(missing)}. Give the model a config "
                "object with those fields"
            )


def lab_role(tunix_role: Any) -> Role:
    """The lab's ``Role`` for one of Tunix's (both enums use the same lower-case values)."""
    return Role(tunix_role.value)
