"""The lab's own exception for a configuration that cannot work (JAX-free)."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(ValueError):
    """A cluster configuration that cannot work; the message says how to fix it.

    Args:
        message: what was wrong and how to fix it, in the Python API's terms.
        knobs: the knobs (``Scenario`` fields, or the learner's settings) whose change
            fixes it, the likeliest first. The lab and the CLI name each one as the
            widget or the flag that sets it (``core.knobs``), so a refusal there never
            sends the reader to a field they cannot see.
        problem: what was wrong without the API's fix, for the lab and the CLI, which
            name their own knob instead (default: the message).
    """

    def __init__(self, message: str = "", *, knobs: Sequence[str] = (), problem: str | None = None) -> None:
        super().__init__(message)
        self.knobs = tuple(knobs)
        self.problem = problem
