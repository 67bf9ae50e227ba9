"""The lab's own exception for a configuration that cannot work (JAX-free)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A cluster configuration that cannot work; the message says how to fix it."""
