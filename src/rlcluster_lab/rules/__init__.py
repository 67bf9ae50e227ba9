"""The placement rules of the RL cluster, P1 to P15, as pure functions.

Each function takes plain facts (meshes or their descriptions, whether the actor has LoRA, the
engine's declared properties, the offload flag, ...) and returns a typed ``Decision``. The live
cluster and the what-if planner both execute them; the figures read the branch, never the text.
``catalogue`` puts the declarations in order and renders ``docs/rules.md``.

Modules: ``sharing`` (P1, P2), ``rollout`` (P3, P7), ``reference`` (P4), ``loading`` (P5,
P14), ``validation`` (P6, JAX-free), ``anchor`` (P8, P10, P11), ``steps`` (P9, P12, P13).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlcluster_lab.core.exports import lazy_exports

# The catalogue imports JAX: loaded on first use, so a CLI error ``rules.validation`` finds comes before JAX.
if TYPE_CHECKING:
    from rlcluster_lab.rules.catalogue import LAB_RULES, RULES, find_rule, rules_markdown
    from rlcluster_lab.rules.registry import Rule, rule

__all__ = ["LAB_RULES", "RULES", "Rule", "find_rule", "rule", "rules_markdown"]

# Hidden from type checkers, so that they flag a name that is not imported above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, __file__, __all__)
