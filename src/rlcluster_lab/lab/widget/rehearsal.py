"""The lab's rehearsal: the learner's next training step, run once before it is asked for.

The widget rehearses on a background thread after each Construct, so that the Training step
pressed next runs programs instead of compiling them. The rehearsal is the learner's own step
(``GRPOLearner.step``: sampling, rewards, values, the anchor's, the reference's and the live
actor's log-probs, the optimizer steps, the sync), taken by a twin of the learner on a twin of
its cluster (``GRPOLearner.on``, ``RLCluster.isolated``): the same programs on the same arrays,
so it cannot drift from the step it warms. It writes nothing a call on the cluster reads: the
twin has its own models, engine (and seed counter), optimizer and anchor slots, step count,
record of contexts and lock, so the cluster's operations on other threads neither wait for it
nor see it, and no work observer of the cluster is reached. The learner's reward function is
called once more, on the twin's completions.
"""

from __future__ import annotations

import threading
import time

from rlcluster_lab.app.learner import GRPOLearner, StepRecord
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.waits import waiting

REHEARSAL = "rehearsal"


class BackgroundCompile:
    """The rehearsal of the next training step on a thread of its own, one at a time: ``start``
    begins one after each Construct, a Training step ``join``s it first, and ``programs`` lists
    what it has compiled so far, so a wait for it can say what it waits for."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._compiled: list[tuple[str, float, bool]] = []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def programs(self) -> list[str]:
        """The programs the running (or last) rehearsal has built so far, by name."""
        return [name for name, _, _ in list(self._compiled)]

    def start(self, learner: GRPOLearner) -> None:
        """Rehearse ``learner``'s next step in the background (after any rehearsal still running:
        two would only compete for the cores)."""
        previous = self._thread

        def work() -> None:
            if previous is not None:
                previous.join()
            self._compiled = []
            try:
                with count_compilations() as found:
                    self._compiled = found
                    rehearse_next_step(learner)
            except Exception as exc:  # noqa: BLE001 - the real step will show the real error
                self.error = f"{type(exc).__name__}: {exc}"

        self.error = None
        # Not a daemon: the interpreter waits for it at exit. A daemon thread stopped inside an
        # XLA compilation aborts the whole process ("terminate called ... exception not rethrown").
        self._thread = threading.Thread(target=work, name="rlcluster-lab-rehearsal", daemon=False)
        self._thread.start()

    def join(self) -> float:
        """Wait until no rehearsal runs; returns the seconds waited."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return time.perf_counter() - start


def rehearse_next_step(learner: GRPOLearner) -> StepRecord:
    """Take ``learner``'s next step on twins of the learner and its cluster, whose results are
    dropped; returns the twin's record (the step that follows gives the same, seeds aside). It is
    a wait of its own (``core.waits``, kind ``REHEARSAL``): a click that waits for it can show
    what is being compiled, for how long, and how long the last rehearsal took."""
    twin = learner.on(learner.cluster.isolated())
    # Two threads: the step's own and one building the optimizer step, its longest program
    # (GRPOLearner.builds_ahead). Measured in the browser test on two cores, a standard layout not
    # built before (split), clicks a second apart: with one thread the Training step waited
    # 1.3-1.6 s, with two 0.7-1.2 s while a Sync clicked meanwhile took 0.6-0.7 s, not 0.3 s;
    # with three a Sync clicked at once took 1.1-1.4 s (the threads hold the interpreter's lock
    # while they trace, whatever their CPU priority).
    twin.builds_ahead = ("update",)
    with waiting("compiling the training step's programs (in the background)", kind=REHEARSAL):
        return twin.step()
