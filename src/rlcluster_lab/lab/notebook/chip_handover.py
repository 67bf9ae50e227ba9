"""A notebook whose chip another process holds: the sentence ``setup()`` says, and the hand-over.

In JupyterLab on a one-chip machine the kernel of the notebook opened first holds the chip, and
JAX cannot open it in the next notebook's kernel. ``setup()`` then builds every layout on the
simulated CPU devices and says, in one sentence, which process holds the chip and what frees it
(``held_sentence``). ``setup(take_chip=True)`` hands the chip over (``hand_over``): it shuts the
holding kernel down through the Jupyter server that runs it (the notebook's Kernel > Shut Down
Kernel), waits for the chip to be free, and lets JAX try the chip again in this kernel.
"""

from __future__ import annotations

import dataclasses
import time

from rlcluster_lab.core import jupyter
from rlcluster_lab.core.chip_holder import ChipHeld, find_holders
from rlcluster_lab.core.devices import reopen_devices

TAKE = "lab = rl.setup(take_chip=True)"
# A kernel shuts down in a second or two; JupyterLab kills one that has not after 5 s.
WAIT_S = 30.0


def held_sentence(held: ChipHeld, cpus: int, *, retried: bool = False) -> str:
    """One sentence: who holds the chip, where the layouts are built instead, and what to do.

    Args:
        held: the chip and its holders.
        cpus: the simulated CPU devices the layouts are built on.
        retried: ``setup(take_chip=True)`` started JAX's backends again in this kernel (after
            they fell back to the CPU): with no holder left, JAX here could not open the chip again.
    """
    chip = held.chip[0].upper() + held.chip[1:]
    instead = f"every layout here is built on {cpus} simulated CPU devices"
    if retried and not held.holders:
        return (
            f"{chip} is free, yet JAX in this kernel could not open it again after its first try, so {instead}: "
            "restart this kernel (Kernel > Restart Kernel) and run this cell again to use the chip."
        )
    if held.holders and all(h.server is not None and h.kernel_id for h in held.holders):
        todo = f"run {TAKE}, which shuts it down through its Jupyter server, or {held.to_free()} and run that"
    else:
        todo = f"{held.to_free()}, then run {TAKE}"
    return f"{chip} is held by {held.who()}, so {instead}; to use the chip here, {todo}."


@dataclasses.dataclass(frozen=True)
class HandOver:
    """What ``hand_over`` did."""

    kernels: tuple[str, ...]  # the kernels it shut down: "the kernel of notebook 00_start_here.ipynb (process 4321)"
    reopened: bool  # JAX's backends in this process were cleared, to try the chip again


def hand_over(wait_s: float = WAIT_S) -> HandOver:
    """Shut down, through their Jupyter servers, the kernels that hold the chip, wait until the chip
    is free, and let JAX try it again in this process where it fell back to the CPU
    (``core.devices.reopen_devices``). A holder no server runs is left as it is (``setup`` names it)."""
    done = []
    for holder in find_holders():
        if holder.server is not None and holder.kernel_id and jupyter.shut_down_kernel(holder.server, holder.kernel_id):
            done.append(holder)
    deadline = time.monotonic() + wait_s
    while done and {h.pid for h in done} & {h.pid for h in find_holders()} and time.monotonic() < deadline:
        time.sleep(0.2)
    kernels = tuple(f"the kernel of notebook {h.notebook or '?'} (process {h.pid})" for h in done)
    return HandOver(kernels, reopen_devices())
