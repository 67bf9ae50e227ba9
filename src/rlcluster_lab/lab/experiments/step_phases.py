"""One RL step, phase by phase: generate, rewards, log-probs, update, sync, each timed and
with its memory measured on the live buffers.

The step measured is the learner's own (``GRPOLearner.step``): nothing here calls a model or
re-orders the operations. Each cluster operation the step calls is wrapped while it runs, and
its ``Phase`` records the wall time; of it, the tracing and XLA compiling on the calling thread
(JAX's monitoring events time only top-level traces, so a first step's compiling and a later
step's running can be told apart); apart, the tracing and compiling other threads did meanwhile
(``RLCluster.build_ahead``); a memory walk (L2) at the operation's work point
(``cluster.observe.at_work``: the role's model on device if it ever is, P14, and working states
the cluster does not hold, such as the anchor's device copy, P10) and one after it; and what it
returned. Bytes are physical, per entry and memory kind, as in ``measure.memory``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig, StepRecord
from rlcluster_lab.cluster.observe import observing
from rlcluster_lab.core.precision import PLATFORM_DEFAULT, PROGRAMS, precision_of
from rlcluster_lab.core.roles import Role
from rlcluster_lab.measure.memory import MemoryReport, cluster_entries, memory_of
from rlcluster_lab.measure.sync import SyncReport
from rlcluster_lab.model.sampling import PROMPT_BUCKET

# One length for every prompt: each step then has the same shapes (see ``run_steps``).
EVEN_PROMPTS: tuple[str, ...] = ("abc", "the", "cat", "xyz", "jax", "rl ", "map", "row")

SECONDS_SOURCE = (
    "measured: wall time of each call until its results are ready (time.perf_counter), memory walks "
    "inside it left out; of it, trace: tracing and lowering for XLA, compile: XLA compilation or "
    "persistent-cache reads, on the calling thread (jax.monitoring events); apart, the tracing and "
    "compiling other threads did during the call (beside it, not part of its time)"
)
MEMORY_SOURCE = "measured: walk of the live buffers, inside each operation at its work point and after it"

# JAX's monitoring events (jax/_src/dispatch.py, compiler.py): a trace of a top-level function
# (nested traces are not timed), its lowering to an XLA module, one backend compile (or a read
# from the persistent cache) per program, and one event per persistent-cache hit.
_TRACE = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"

# The cluster operations a learner step calls: method -> (phase name, role whose mesh it enters,
# the program that multiplies matrices in it: its row of core.precision.PROGRAMS; None: none does).
_OPERATIONS: dict[str, tuple[str, str | None, str | None]] = {
    "generate": ("generate", "rollout", "sampler"),
    "get_rewards": ("rewards", "reward", "scores"),
    "get_values": ("values", "critic", "scores"),
    "update_actor": ("update", "actor", "train step"),
    "update_critic": ("update critic", "critic", "train step"),
    "sync_weights": ("sync", None, None),
}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a step: what ran, how long it took, what it held, what it returned."""

    name: str
    call: str  # what the learner called, e.g. "cluster.per_token_logps(Role.ACTOR, ...)"
    role: str | None  # the role whose mesh the operation entered (None: host code, or the sync)
    seconds: float  # measured, memory walks inside excluded
    trace_seconds: float  # measured: tracing and lowering for XLA, inside the call, on its thread
    compile_seconds: float  # measured: XLA compiling or reading the persistent cache, inside the call, on its thread
    programs: int  # programs compiled or read back from the cache inside the call, on its thread
    cache_hits: int  # of those, read back from the persistent cache
    callback_seconds: float  # in the caller's callback inside the call (the learner's P11 probe)
    # Measured: tracing and compiling on other threads while the call ran (beside it: not part of ``seconds``).
    other_threads_seconds: float
    during: MemoryReport | None  # walk at the operation's work point; None without one (host code, the sync)
    after: MemoryReport  # walk once the call returned
    returned: tuple[tuple[str, str], ...]  # (field, shape and dtype) of what the call returned
    # Its program's row of core.precision.PROGRAMS and the matmul precision it ran at ("highest",
    # "platform default"); None and "": host code or the sync, no matrix product.
    program: str | None = None
    precision: str = ""

    def memory(self, when: str = "during") -> MemoryReport:
        """The walk ``"during"`` the phase (the one after it where there is none) or ``"after"``."""
        if when not in ("during", "after"):
            raise ValueError(f"when must be 'during' or 'after', got {when!r}")
        return self.during if when == "during" and self.during is not None else self.after

    def bytes_by_entry(self, when: str = "during") -> dict[str, dict[str, int]]:
        """Entry -> memory kind -> physical bytes, from the walk ``when``."""
        return {e: dict(v["by_kind"]) for e, v in self.memory(when).by_role.items()}

    def on_device(self, when: str = "during") -> list[str]:
        """The entries holding bytes in device memory in the walk ``when``."""
        return [e for e, kinds in self.bytes_by_entry(when).items() if kinds.get("device")]

    def to_json(self) -> dict[str, Any]:
        during = None if self.during is None else self.during.to_json()
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {"during": during, "after": self.after.to_json(), "returned": [list(r) for r in self.returned]}


@dataclasses.dataclass(frozen=True)
class StepPhases:
    """The phases of one learner step, in the order they ran, and the step's own record."""

    step: int
    offload: bool
    phases: tuple[Phase, ...]
    record: StepRecord
    seconds: float  # the whole step, measured (memory walks excluded)

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; this step ran {', '.join(p.name for p in self.phases)}")

    def to_json(self) -> dict[str, Any]:
        head = {"step": self.step, "offload": self.offload, "seconds": self.seconds}
        sources = {"seconds_source": SECONDS_SOURCE, "memory_source": MEMORY_SOURCE}
        return {**head, **sources, "phases": [p.to_json() for p in self.phases], "record": self.record.to_json()}


def describe(value: Any) -> str:
    """Shape and dtype of an array, or a short account of anything else."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        text = f"{type(value).__name__} of {len(value)} {'/'.join(kinds) or 'items'}"
        if value and all(isinstance(v, Mapping) for v in value):
            text += f" (keys: {', '.join(sorted(value[0]))})"
        return text
    return repr(value) if isinstance(value, (int, float, str, bool)) or value is None else type(value).__name__


def returned_fields(value: Any) -> tuple[tuple[str, str], ...]:
    """What an operation returned, field by field: (name, shape and dtype)."""
    if isinstance(value, SyncReport):
        kept = ("synced_bytes", "moved_cross_device_bytes", "anchor_bytes", "global_step")
        return (("leaves", str(len(value.leaves))), *((k, str(getattr(value, k))) for k in kept))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return tuple((f.name, describe(getattr(value, f.name))) for f in dataclasses.fields(value))
    return (("value", describe(value)),)


def output_rows(value: Any) -> list[dict[str, Any]]:
    """A dataclass of arrays (``RolloutOutput``) as rows: field, type, shape, dtype."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"output_rows takes a dataclass instance such as RolloutOutput, got {type(value).__name__}")
    rows = []
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if isinstance(v, (jax.Array, np.ndarray)):
            rows.append({"field": f.name, "type": type(v).__name__, "shape": tuple(v.shape), "dtype": str(v.dtype)})
            continue
        many = isinstance(v, (list, tuple))
        first = v[0] if many and v else v
        kind = f"{type(v).__name__} of {type(first).__name__}"
        rows.append({"field": f.name, "type": kind, "shape": (len(v),) if many else "", "dtype": ""})
    return rows


def decoded_sample(tokenizer: Any, out: Any) -> dict[str, str]:
    """The first row of a ``RolloutOutput`` decoded with the cluster's tokenizer, beside its ``text``
    (special ids such as padding and BOS dropped, stopping at EOS, as the engine does)."""
    return {
        "prompt (decoded from left_padded_prompt_tokens)": repr(tokenizer.decode(out.left_padded_prompt_tokens[0])),
        "completion (decoded from tokens)": repr(tokenizer.decode(out.tokens[0])),
        "completion (text field)": repr(out.text[0]),
    }


def sample_words(tokenizer: Any, out: Any) -> str:
    """What a reader of a ``RolloutOutput``'s ids needs, from the tokenizer and the output: the
    width the prompts were left-padded to and why, and which ids are not bytes."""
    prompts = np.asarray(out.left_padded_prompt_tokens)
    width = prompts.shape[1]
    longest = int((prompts != tokenizer.pad_id).sum(axis=1).max())
    if width > longest:
        why = (
            f"the longest prompt ({longest} ids with its begin id) rounded up to a multiple of {PROMPT_BUCKET} "
            "(model.sampling.PROMPT_BUCKET), so nearby prompt lengths run the programs already compiled"
        )
    else:
        why = "the longest prompt's length (the KV cache has no room for a rounded width)"
    special = sorted({tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id})
    spare = f"{special[-1] + 1}-{tokenizer.vocab_size - 1}"
    return (
        f"prompts left-padded to {width} ids: {why}\n"
        f"ids 0-255 are bytes; {tokenizer.pad_id} pads, {tokenizer.bos_id} begins and {tokenizer.eos_id} ends a "
        f"sequence; {spare} mean nothing (the vocabulary is rounded up to {tokenizer.vocab_size} so the embedding "
        "divides over 2, 4 or 8 devices): an untrained model may sample them, and decoding drops them"
    )


def beside_words(first: StepPhases) -> str:
    """Where the first step's work on other threads (its programs built ahead) went, phase by
    phase, from the measured phases: the sentence under ``compare_rows``' table."""
    beside = [(p.name, p.other_threads_seconds) for p in first.phases if p.other_threads_seconds > 0]
    if not beside:
        return f"No other thread traced or compiled during step {first.step}."
    total = sum(s for _, s in beside)
    where = "; ".join(f"{_ms(s)} ms ({100 * s / total:.0f}%) beside {name}" for name, s in beside)
    return f"Other threads traced and compiled for {_ms(total)} ms during step {first.step}: {where}."


@dataclasses.dataclass
class _Open:
    """A phase while it runs: what the listeners and the observer add to it."""

    name: str
    call: str
    role: str | None
    trace_seconds: float = 0.0
    compile_seconds: float = 0.0
    programs: int = 0
    cache_hits: int = 0
    walk_seconds: float = 0.0
    callback_seconds: float = 0.0
    other_threads_seconds: float = 0.0
    during: MemoryReport | None = None
    thread: int = dataclasses.field(default_factory=threading.get_ident)  # the thread that made the call


def _block(value: Any) -> None:
    """Wait for the arrays in a call's result, so its time includes computing them."""
    if isinstance(value, (jax.Array, list, tuple, dict)):
        jax.block_until_ready([x for x in jax.tree.leaves(value) if isinstance(x, jax.Array)])


class _Recorder:
    """Stands in for the cluster while the learner runs one step: forwards every attribute,
    and times and measures the operations of ``_OPERATIONS`` and ``per_token_logps``."""

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._phases: list[Phase] = []
        self._open: _Open | None = None
        self.walk_seconds = 0.0  # every memory walk of the step, timed so it can be left out

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._cluster, name)
        if name in _OPERATIONS:
            phase, role, program = _OPERATIONS[name]
            return self.wrap(phase, f"cluster.{name}", role, target, program)
        if name == "per_token_logps":

            def logps(role: Any, *args: Any, **kwargs: Any) -> Any:
                parsed = Role.parse(role)
                name_ = "log-probs: actor (anchor)" if parsed is Role.ACTOR else f"log-probs: {parsed.value}"
                call = f"cluster.per_token_logps(Role.{parsed.name}, ...)"
                return self.wrap(name_, call, parsed.value, target, "log-probs")(role, *args, **kwargs)

            return logps
        return target

    def _precision(self, program: str) -> str:
        """The matmul precision ``program`` runs at in this cluster (``core.precision``)."""
        return precision_of(program, self._cluster.cluster_config.matmul_precision) or PLATFORM_DEFAULT

    def _walk(self, extra: Mapping[str, Any] | None = None) -> MemoryReport:
        start = time.perf_counter()
        entries = cluster_entries(self._cluster) | dict(extra or {})
        report = memory_of(entries, devices=self._cluster.devices())
        self.walk_seconds += time.perf_counter() - start
        return report

    def at_work(self, role: Role, working: Mapping[str, Any]) -> None:
        """The observer: a memory walk at the operation's work point (the first one per phase)."""
        if self._open is None or self._open.during is not None:
            return
        before = self.walk_seconds
        self._open.during = self._walk(working)
        self._open.walk_seconds += self.walk_seconds - before

    def on_compile(self, event: str, seconds: float, **_: Any) -> None:
        if self._open is None:
            return
        if threading.get_ident() != self._open.thread:
            # Another thread's work (a build ahead, a background compile): beside the call, not in it.
            if event == _BACKEND_COMPILE or event in _TRACE:
                self._open.other_threads_seconds += seconds
            return
        if event == _BACKEND_COMPILE:
            self._open.compile_seconds += seconds
            self._open.programs += 1
        elif event in _TRACE:
            self._open.trace_seconds += seconds

    def on_event(self, event: str, **_: Any) -> None:
        if self._open is not None and event == _CACHE_HIT and threading.get_ident() == self._open.thread:
            self._open.cache_hits += 1

    def _timed_callback(self, fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
        if fn is None:
            return None

        def callback(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self._open is not None:
                    self._open.callback_seconds += time.perf_counter() - start

        return callback

    def wrap(
        self, name: str, call: str, role: str | None, fn: Callable[..., Any], program: str | None = None
    ) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self._open is not None:  # an operation called from inside another: part of it
                return fn(*args, **kwargs)
            if "on_step" in kwargs:
                kwargs["on_step"] = self._timed_callback(kwargs["on_step"])
            self._open = _Open(name, call, role)
            try:
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                _block(out)
                total = time.perf_counter() - start
                opened = self._open
            finally:
                self._open = None
            # The open phase's figures, with the memory walks inside the call left out of its time.
            measured = {k: v for k, v in vars(opened).items() if k not in ("walk_seconds", "thread")}
            seconds = total - opened.walk_seconds
            after, returned = self._walk(), returned_fields(out)
            precision = "" if program is None else self._precision(program)
            self._phases.append(
                Phase(**measured, seconds=seconds, after=after, returned=returned, program=program, precision=precision)
            )
            return out

        return run


@contextlib.contextmanager
def _listening(recorder: _Recorder) -> Iterator[None]:
    jax.monitoring.register_event_duration_secs_listener(recorder.on_compile)
    jax.monitoring.register_event_listener(recorder.on_event)
    try:
        yield
    finally:
        jax.monitoring.unregister_event_duration_listener(recorder.on_compile)
        jax.monitoring.unregister_event_listener(recorder.on_event)


def measure_step(learner: GRPOLearner) -> StepPhases:
    """Run one ``learner.step()`` and record each cluster operation it calls as a phase.

    The learner's cluster and reward function are stood in for while the step runs (and given
    back afterwards, even when it raised): every call reaches the real cluster, and the step, its
    record and its history are the learner's own.

    Returns:
        The phases in the order the step ran them, and the step's ``StepRecord``.
    """
    cluster, reward_fn = learner.cluster, learner.reward_fn
    recorder = _Recorder(cluster)
    learner.cluster = recorder  # type: ignore[assignment]
    # Host code the learner calls (its reward function) is a phase of its own, in no role's mesh.
    learner.reward_fn = recorder.wrap("rewards", "reward_fn(prompts, completions)", None, reward_fn)
    try:
        with observing(cluster, recorder.at_work), _listening(recorder):
            start = time.perf_counter()
            record = learner.step()
            seconds = time.perf_counter() - start
    finally:
        learner.cluster, learner.reward_fn = cluster, reward_fn
    return StepPhases(
        step=record.step,
        offload=bool(cluster.cluster_config.offload_to_cpu),
        phases=tuple(recorder._phases),
        record=record,
        seconds=seconds - recorder.walk_seconds,
    )


def run_steps(cluster: Any, steps: int = 2) -> list[StepPhases]:
    """``steps`` learner steps on ``cluster``, each measured phase by phase. The prompts all have
    one length, so every step has the same shapes: the first compiles (or reads the persistent
    cache) and the later ones only run.

    Raises:
        ValueError: ``steps`` below 1.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    learner = GRPOLearner(cluster, LearnerConfig(steps=steps, prompts_per_step=4, group_size=4), prompts=EVEN_PROMPTS)
    return [measure_step(learner) for _ in range(steps)]


def _unique(memory: MemoryReport, kind: str) -> int:
    return sum(int(k.get(kind, 0)) for k in memory.by_device.values())


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


OTHER_THREADS = "other threads meanwhile ms"  # the column of work beside a phase, not part of its ms
PRECISION = "matmul precision"  # "-": no matrix product (host code, the sync)


def time_rows(step: StepPhases) -> list[dict[str, Any]]:
    """Per phase: its measured wall time, how much of it was tracing and compiling (or cache
    reads) on its own thread (parts of the time), and apart, what other threads traced and
    compiled meanwhile (beside it, not part of the time); the matmul precision its program ran
    at (``precision_rows`` says why)."""

    def row(name: str, seconds: float, phases: Sequence[Phase], probe: str = "", precision: str = "") -> dict:
        return {
            "phase": name,
            "ms": _ms(seconds),
            "trace ms": _ms(sum(p.trace_seconds for p in phases)),
            "compile ms": _ms(sum(p.compile_seconds for p in phases)),
            "programs (cache hits)": f"{sum(p.programs for p in phases)} ({sum(p.cache_hits for p in phases)})",
            "caller's probe ms": probe,
            OTHER_THREADS: _ms(sum(p.other_threads_seconds for p in phases)),
            PRECISION: precision,
        }

    rows = [
        row(p.name, p.seconds, [p], _ms(p.callback_seconds) if p.callback_seconds else "", p.precision or "-")
        for p in step.phases
    ]
    return [*rows, row(f"step {step.step} in all", step.seconds, step.phases)]


def compare_rows(first: StepPhases, later: StepPhases) -> list[dict[str, Any]]:
    """Per phase, the first step's time (with the tracing and compiling of its own thread, parts
    of it) beside a later step's; then the first step's work on other threads meanwhile (its
    programs built ahead): beside the phase, not part of its time; last, the matmul precision
    the phase's program ran at (``precision_rows`` says why)."""
    return [
        {
            "phase": a.name,
            f"step {first.step} ms": _ms(a.seconds),
            "of which trace ms": _ms(a.trace_seconds),
            "of which compile ms": _ms(a.compile_seconds),
            f"step {later.step} ms": _ms(b.seconds),
            f"step {later.step} trace + compile ms": _ms(b.trace_seconds + b.compile_seconds),
            f"step {first.step} {OTHER_THREADS}": _ms(a.other_threads_seconds),
            PRECISION: a.precision or "-",
        }
        for a, b in ((a, later.phase(a.name)) for a in first.phases)
    ]


def precision_rows(step: StepPhases) -> list[dict[str, Any]]:
    """Per phase that multiplies matrices: its program, the matmul precision it ran at and why
    (``core.precision.PROGRAMS``: exact where P11 compares the results, else the platform's
    default). The update's P11 probe scores with the log-prob program, at its precision."""
    return [
        {"phase": p.name, "program": p.program, PRECISION: p.precision, "why": PROGRAMS[p.program].why}
        for p in step.phases
        if p.program is not None
    ]


def memory_rows(step: StepPhases, when: str = "during") -> list[dict[str, Any]]:
    """Per phase: the entries in device memory and the bytes of each memory kind, each buffer
    counted once, from the walk ``when`` (phases with no work point: the walk after them)."""
    return [
        {
            "phase": p.name + ("" if when == "after" or p.during is not None else " *"),
            "on device": ", ".join(p.on_device(when)) or "(nothing)",
            "device B": _unique(p.memory(when), "device"),
            "pinned_host B": _unique(p.memory(when), "pinned_host"),
        }
        for p in step.phases
    ]


def returned_rows(step: StepPhases) -> list[dict[str, Any]]:
    """Per phase: the call the learner made and what it returned (shapes, dtypes)."""
    return [
        {"phase": p.name, "call": p.call, "returned": "; ".join(f"{k}: {v}" for k, v in p.returned)}
        for p in step.phases
    ]


def seconds_rows(steps: Mapping[str, StepPhases]) -> list[dict[str, Any]]:
    """Per phase, its measured milliseconds in each of several steps (``{label: step}``).

    Raises:
        ValueError: the steps did not run the same phases.
    """
    labelled = list(steps.items())
    names = [p.name for p in labelled[0][1].phases]
    for label, step in labelled[1:]:
        if [p.name for p in step.phases] != names:
            raise ValueError(f"{label!r} ran other phases than {labelled[0][0]!r}; compare steps of one learner kind")
    rows = [{"phase": n, **{f"{label} ms": _ms(step.phase(n).seconds) for label, step in labelled}} for n in names]
    return [*rows, {"phase": "whole step", **{f"{label} ms": _ms(step.seconds) for label, step in labelled}}]
