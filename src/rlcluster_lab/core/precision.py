"""Each program at the matrix-product precision it needs and no more: which precision every
program that multiplies matrices is traced at, and why, in one table (``PROGRAMS``).

P11 compares forward passes: the sampler's log-probs, the anchor's, and the live actor's before
its first update (the learner shows the gaps; within 1e-4). The programs that compute them run
at the cluster's ``matmul_precision`` (``"highest"`` by default), which the role's context
enters (``cluster.contexts.role_context``): float32 products stay float32 on GPUs (no TF32)
and TPUs (no bfloat16 passes), as on a CPU, where the precision changes no float32 product.
At the platform's default the large preset's anchor-vs-sampler gap on one TPU v5e chip was
9.8e-3 (measured), a hundred times P11's bound.

Nothing compares the update's gradient, nor the reward model's or the critic's scores: their
programs run at the platform's default (None), whatever the cluster's setting. On one TPU v5e
chip the large preset's train step took 16-18 s to compile at ``"highest"``, where the same
step written in plain JAX compiled in 4.3 s at the default (measured). The step's ratio
``exp(new - old)`` then sets a forward at the default beside the anchor's exact one, so before
the first update it is 1 up to a gap of the order above (1e-2), far inside the clip (``epsilon``,
0.2 by default); nothing the lab shows asks it to be exactly 1.

Programs that multiply no matrices (reshards, the anchor's write-over, the optimizer's first
state, finiteness checks) are traced in the caller's context; the precision changes nothing in
them. The precision is in the key of every compiled program: the lab's own caches
(``ProgramFamily``, the optimizer steps') key on it, and JAX's persistent cache keys on the
program's text, in which every product names its precision.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

PLATFORM_DEFAULT = "platform default"  # the words for None: XLA's choice on the platform


@dataclasses.dataclass(frozen=True)
class ProgramPrecision:
    """Whether P11 compares what a program computes (then it runs at the cluster's
    ``matmul_precision``; else at the platform's default), and why."""

    compared: bool
    why: str


PROGRAMS: Mapping[str, ProgramPrecision] = types.MappingProxyType(
    {
        "sampler": ProgramPrecision(True, "P11 compares the sampler's log-probs with the anchor's"),
        "log-probs": ProgramPrecision(
            True, "P11 compares the anchor's and the live actor's log-probs (the reference's: the same program)"
        ),
        "scores": ProgramPrecision(False, "P11 compares no reward or value"),
        "train step": ProgramPrecision(False, "P11 compares forward passes, not the update's gradient"),
    }
)


def precision_of(program: str, compared: str | None) -> str | None:
    """The precision ``program`` runs at in a cluster whose ``matmul_precision`` is ``compared``
    (None: the platform's default).

    Raises:
        KeyError: a program ``PROGRAMS`` does not name.
    """
    return compared if PROGRAMS[program].compared else None


def traced_precision(program: str | None) -> str | None:
    """The precision ``program`` is traced at here: ``precision_of`` the one the current context
    holds (inside a role's context, the cluster's ``matmul_precision``). None for ``program``:
    a program that multiplies no matrices, traced at the context's."""
    import jax

    current = jax.config.jax_default_matmul_precision
    return current if program is None else precision_of(program, current)


def traced_at(fun: Callable[..., Any], precision: str | None) -> Callable[..., Any]:
    """``fun`` with its products traced at ``precision`` (None: the platform's default), whatever
    the caller's context; same name and signature, for ``jax.jit``'s static arguments and reports."""

    @functools.wraps(fun)
    def traced(*args: Any, **kwargs: Any) -> Any:
        import jax

        with jax.default_matmul_precision(precision):
            return fun(*args, **kwargs)

    return traced
