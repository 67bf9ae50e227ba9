"""The rules: one pure function per placement rule of the RL cluster, P1 to P14.

Each function takes plain facts (meshes or their descriptions, whether the
actor has LoRA, the engine's declared properties, the offload flag, ...)
and returns a typed ``Decision``: the rule id, the branch taken (a member of
the rule's ``Branch`` enum), the inputs it read and a one-line explanation.
The live cluster and the what-if planner both execute these functions, so
changing a rule changes both; the figures read the branch, never the text.
Each function's docstring states its rule; ``docs/rules.md`` is generated
from them (``python -m rlcluster_lab.rules``; ``rules.catalogue``).

Modules: ``sharing`` (P1, P2), ``rollout`` (P3, P7), ``reference`` (P4),
``loading`` (P5, P14), ``validation`` (P6, JAX-free), ``anchor`` (P8, P10,
P11), ``steps`` (P9, P12, P13).
"""

from typing import Any

__all__ = ["LAB_RULES", "RULES", "RuleEntry", "rules_markdown"]


def __getattr__(name: str) -> Any:
    # The catalogue imports every rule module (and so JAX, through the mesh helpers); it is
    # loaded on first use, so that a CLI error found by ``rules.validation`` (JAX-free) comes
    # back before JAX is imported.
    if name in __all__:
        from rlcluster_lab.rules import catalogue

        return getattr(catalogue, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
