"""Putting models on meshes and moving arrays between shardings: loading a model (P5), memory
kinds (P14), the two reshard strategies (a compiled program, or the exact minimum), the bytes a
compiled program moves, and the events every step emits (the transfer log, L3's evidence, listens)."""

from rlcluster_lab.placement.place import place_model

__all__ = ["place_model"]
