"""The experiments the notebooks run on live clusters, each one call that returns plain data: the
runs and their tables, one RL step phase by phase, a sync's peak, the planner beside the
measurement, and the chip's own figures with the last ones stored (``data/``)."""
