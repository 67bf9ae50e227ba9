"""The lab's own exception for a configuration that cannot work (JAX-free)."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """A cluster configuration that cannot work; the message says how to fix it.

    Args:
        message: what was wrong and how to fix it, in the Python API's terms.
        knobs: the knobs whose change fixes it, the likeliest first; the lab and the CLI name each
            as the widget or the flag that sets it (``core.knobs``).
        problem: what was wrong without the API's fix, for the lab and the CLI (default: the message).
    """

    def __init__(self, message: str = "", *, knobs: Sequence[str] = (), problem: str | None = None) -> None:
        super().__init__(message)
        self.knobs = tuple(knobs)
        self.problem = problem
