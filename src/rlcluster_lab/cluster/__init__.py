"""The RL cluster: construction (one sequence of rule decisions, executed on real arrays or, by
the planner, on paper), the per-role device context, the operations, and the weight sync.

``RLCluster`` (also ``RLEngine``, P15) is the object a learner talks to; ``build_cluster``
builds one from a ``Scenario``'s knobs.
"""

from rlcluster_lab.cluster.cluster import AvoidableCopyWarning, NotConstructedError, RLCluster, RLEngine

__all__ = ["AvoidableCopyWarning", "NotConstructedError", "RLCluster", "RLEngine"]
