"""Rollout engines: the protocol, the vanilla sampler, and placement stand-ins for vLLM and SGLang-JAX."""

from rlcluster_lab.core import options
from rlcluster_lab.engines.base import RolloutEngine, RolloutOutput
from rlcluster_lab.engines.own_copy import OwnCopyEngine, SglangJaxStyleEngine, VllmStyleEngine
from rlcluster_lab.engines.vanilla import VanillaEngine

__all__ = [
    "OwnCopyEngine",
    "RolloutEngine",
    "RolloutOutput",
    "SglangJaxStyleEngine",
    "VanillaEngine",
    "VllmStyleEngine",
]

# The built-in engines by the names ClusterConfig.rollout_engine accepts. The names are spelled once,
# in ``core.options.ENGINES`` (JAX-free, for the CLI); the classes follow in the same order.
ENGINES: dict[str, type[RolloutEngine]] = dict(
    zip(options.ENGINES, (VanillaEngine, VllmStyleEngine, SglangJaxStyleEngine), strict=True)
)
