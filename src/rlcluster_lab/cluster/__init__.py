"""The RL cluster's mechanism: construction (one sequence of rule decisions, executed on real
arrays or, by the planner, on paper), the state it keeps, the per-role device context, the
operations and the weight sync, each a function of that state.

The object a learner talks to, ``RLCluster`` (also ``RLEngine``, P15), is ``rl_cluster.RLCluster``:
this mechanism with its instruments (``measure``); ``build_cluster`` builds one from a
``Scenario``'s knobs.
"""
