"""``python -m rlcluster_lab``: the placement report, the what-if plan and the toy learner as
text or JSON. The parser imports no JAX, so a bad flag is refused before JAX starts."""

from rlcluster_lab.cli.main import main

__all__ = ["main"]
