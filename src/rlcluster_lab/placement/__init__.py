"""Putting models on meshes and moving arrays between shardings: loading a model (P5), memory
kinds (P14), the two reshard strategies (a compiled program, or the exact minimum), the bytes a
compiled program moves, and the events every step emits (the transfer log, L3's evidence, listens)."""

from rlcluster_lab.placement.place import move_model, place_model, put_on_memory_kind

# ``reshard`` names the module here; the function is ``placement.reshard.reshard``.
from rlcluster_lab.placement.reshard import reshard_many, reshard_tree

__all__ = ["move_model", "place_model", "put_on_memory_kind", "reshard_many", "reshard_tree"]
