"""The RL cluster's mechanism: construction (one sequence of rule decisions, on real arrays or, by
the planner, on paper), the state it keeps, the role contexts, the operations and the weight
sync, each a function of that state; ``rl_cluster.RLCluster`` joins it with its instruments."""
