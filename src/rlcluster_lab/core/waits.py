"""What the process is waiting for right now: the waits in progress and the programs being built.

An action that may take a while runs inside ``waiting(label)``. Whatever shows progress
(the CLI's line on stderr, the lab's status) asks ``WAITS.status()`` as often as it
likes (``WaitStatus`` says what it holds).

Nothing here imports JAX: the compile events are listened to from the first wait that
starts after JAX was imported (``listen_to_jax``), so the CLI can show its own start-up.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# jax.monitoring events marking the start (a scalar) and the end (a duration) of tracing, lowering and
# compiling a program (or reading it back from the persistent cache).
_PHASES = {
    "/jax/core/compile/jaxpr_trace_duration": "tracing",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
    "/jax/core/compile/backend_compile_duration": "compiling",
}


# The lab's compiled programs in a reader's words, by the function name JAX compiles (``jit(_generate)``).
PROGRAM_WORDS = {
    "_generate": "sampling completions",
    "_logps": "per-token log-probs",
    "_scores": "the reward model's or critic's scores",
    "grpo_train_step": "the actor's optimizer step",
    "value_train_step": "the critic's optimizer step",
    "init_optimizer_state": "the optimizer's initial state",
    "identity": "a reshard between two layouts",
    "_cut_and_pack": "cutting the pieces a device sends (minimal reshard)",
    "_assemble_blocks": "assembling a device's shards (minimal reshard)",
    "crossing": "moving shards into another process",
    "receiving_zeros": "the receiving side of a move between processes",
    "replicate": "gathering a value to read it",
    "_all_finite": "the check for NaN or infinite values",
    "cast": "a cast to the rollout's dtype",
    "_threefry_seed": "a random seed",
    "convert_element_type": "a dtype conversion",
    "stage": "a host value put on a device",
    "copy_arrays": "a copy into new buffers of the same layout",
    "write_anchor_over": "the anchor written over its old pinned buffers",
}


def program_words(name: str) -> str:
    """A compiled program in a reader's words (``jit(_generate)`` -> ``sampling completions``);
    a program the lab does not know is 'another program'."""
    bare = name[4:-1] if name.startswith("jit(") and name.endswith(")") else name
    return PROGRAM_WORDS.get(bare, "another program")


@dataclasses.dataclass(frozen=True)
class Building:
    """A program being built now: ``phase`` is tracing, lowering or compiling (compiling covers a
    read from the persistent cache too); ``name`` as JAX reports it, e.g. ``jit(_generate)``."""

    phase: str
    name: str
    elapsed_s: float


@dataclasses.dataclass(frozen=True)
class WaitStatus:
    """One look at what the process waits for: ``labels``, the waits of the thread that has waited
    longest, outermost first; ``elapsed_s`` since the outermost began, ``stage_elapsed_s`` since the
    innermost; ``building``, programs being traced, lowered or compiled now in any thread; ``built``
    since the outermost began; ``estimate_s``, the last wait of the outermost's kind (None: none)."""

    labels: tuple[str, ...]
    elapsed_s: float
    stage_elapsed_s: float
    building: tuple[Building, ...] = ()
    built: int = 0
    estimate_s: float | None = None

    def line(self) -> str:
        """One line: ``step 1 of 30: update_actor, 2.4 s (last 0.6 s); compiling the actor's optimizer step 1.9 s``."""
        text = ": ".join(self.labels) + f", {self.elapsed_s:.1f} s"
        if self.estimate_s is not None:
            text += f" (last {self.estimate_s:.1f} s)"
        if self.building:
            text += "; " + ", ".join(f"{b.phase} {program_words(b.name)} {b.elapsed_s:.1f} s" for b in self.building)
            if self.built:
                text += f" ({self.built} program(s) built before)"
        elif self.built:
            text += f"; {self.built} program(s) built"
        return text


@dataclasses.dataclass
class _Wait:
    label: str
    kind: str
    start: float
    built_at_start: int


class Waits:
    """The waits in progress (a stack per thread) and the programs being built, for one process.
    ``clock``: monotonic seconds (tests pass a fake). A subscriber (``subscribe``) is called after
    every wait begins or ends; its exception is a ``RuntimeWarning``, never ending or replacing a wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._stacks: dict[int, list[_Wait]] = {}
        # (thread, phase) -> [program name, start, depth]: nested jits trace inside their caller's
        # trace, so a thread's outermost program of each phase is the one shown.
        self._building: dict[tuple[int, str], list] = {}
        self._built = 0
        self._last: dict[str, float] = {}
        self._subscribers: list[Callable[[], None]] = []

    @contextmanager
    def waiting(self, label: str, kind: str | None = None) -> Iterator[None]:
        """Mark the block as a wait for ``label``; ``kind`` (default: the label) groups waits
        whose durations estimate each other (every learner step, say)."""
        listen_to_jax(self)
        me = threading.get_ident()
        with self._lock:
            wait = _Wait(label, kind or label, self.clock(), self._built)
            self._stacks.setdefault(me, []).append(wait)
        try:
            self._notify()  # inside: whatever ends the block here (Ctrl-C) still ends the wait
            yield
        finally:
            with self._lock:
                stack = self._stacks.get(me, [])
                if wait in stack:
                    stack.remove(wait)
                if not stack:
                    self._stacks.pop(me, None)
                self._last[wait.kind] = self.clock() - wait.start
            self._notify()

    def status(self) -> WaitStatus | None:
        """What is waited for now, or None when nothing is."""
        with self._lock:
            stacks = [s for s in self._stacks.values() if s]
            if not stacks:
                return None
            now = self.clock()
            stack = min(stacks, key=lambda s: s[0].start)
            outer, inner = stack[0], stack[-1]
            return WaitStatus(
                labels=tuple(w.label for w in stack),
                elapsed_s=max(0.0, now - outer.start),
                stage_elapsed_s=max(0.0, now - inner.start),
                building=tuple(
                    Building(phase, name, max(0.0, now - start))
                    for (_, phase), (name, start, _) in sorted(self._building.items(), key=lambda kv: kv[1][1])
                ),
                built=self._built - outer.built_at_start,
                estimate_s=self._last.get(outer.kind),
            )

    def last(self, kind: str) -> float | None:
        """How long the last wait of ``kind`` took (None when none ended yet)."""
        with self._lock:
            return self._last.get(kind)

    def subscribe(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn()`` after every wait begins or ends; returns the function that unsubscribes."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def _notify(self) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - a subscriber's fault is its own, and is reported
                # It never ends the wait, nor replaces the exception the block itself raised.
                warnings.warn(
                    f"a subscriber of the waits ({getattr(fn, '__qualname__', type(fn).__name__)}) raised "
                    f"{type(exc).__name__}: {exc}; the wait goes on without it",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def build_started(self, phase: str, name: str) -> None:
        """A program began its ``phase`` (tracing, lowering, compiling) in this thread."""
        key = (threading.get_ident(), phase)
        with self._lock:
            self._building.setdefault(key, [name, self.clock(), 0])[2] += 1  # a nested phase: one deeper

    def build_ended(self, phase: str, name: str) -> None:
        """The program's ``phase`` ended in this thread (a compile that ended counts as one program
        built; ``name`` is not needed: a thread's phases nest)."""
        key = (threading.get_ident(), phase)
        with self._lock:
            entry = self._building.get(key)
            if entry is not None:
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._building[key]
            if phase == "compiling":
                self._built += 1


WAITS = Waits()
waiting = WAITS.waiting  # mark the block as a wait the process's progress shows


_LISTENING: set[int] = set()
_LISTEN_LOCK = threading.Lock()


def listen_to_jax(waits: Waits) -> bool:
    """Feed ``waits`` JAX's compile events from now on, once JAX is imported (True when it listens);
    registered once per ``Waits`` for the life of the process."""
    if id(waits) in _LISTENING:
        return True
    if "jax" not in sys.modules:
        return False
    with _LISTEN_LOCK:
        if id(waits) in _LISTENING:
            return True
        from jax._src import monitoring

        def relay(method: Callable[[str, str], None]) -> Callable[..., None]:
            def listener(event: str, value: float, **kwargs: object) -> None:
                phase = _PHASES.get(event)
                if phase is not None:
                    method(phase, str(kwargs.get("fun_name", "?")))

            return listener

        monitoring.register_scalar_listener(relay(waits.build_started))
        monitoring.register_event_duration_secs_listener(relay(waits.build_ended))
        _LISTENING.add(id(waits))
    return True
