"""The application layer on top of the cluster: ``scenario`` (knobs to a built cluster),
``report`` (the one report the CLI, figures and widgets read), ``learner`` (a toy GRPO loop).
"""
