"""rlcluster-lab: placement of the models of an RL run, made visible and measured."""
