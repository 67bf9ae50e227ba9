"""The application layer: what a user asks for, end to end, on top of the cluster.

``scenario`` turns the lab's knobs into a built cluster (validated and checked against
memory first), ``report`` gathers every decision and measurement of a cluster into the
one report the CLI, the figures and the widgets read, and ``learner`` runs a toy GRPO
loop over the cluster's operations.
"""
