"""Compiler options chosen for the platform and the size of what a program computes.

On simulated CPU devices with the lab's small models, a user waits for XLA:CPU
compiling a program, not for it running (a log-prob program of the tiny model spent
about a second in LLVM, and ran in milliseconds). So on CPU, for programs over at most
``FAST_MAX_ELEMENTS`` parameters, the lab asks for cheap code generation (``FAST_CPU``).
Measured on the step's programs (2 busy cores, ``benchmarks/interactive.py``): the
sampler's compile went from about 4 s to 0.6-0.9 s, a log-prob program from 1.2-2 s to
0.2-0.4 s, the optimizer step from 3.7-6.6 s to 1.4-2.9 s. On GPUs, for the same small
programs, no autotuning (``FAST_GPU``). On TPUs, and for larger models, XLA's defaults.
Programs that only move data (a reshard, the anchor's write-over, the crossing between
processes) run at every sync, so they get cheap code generation only while it costs the move
nothing (``MOVE_FAST_MAX_ELEMENTS``, ``move_options``).

``RLCLUSTER_LAB_FAST_COMPILE`` overrides the choice: ``off``, ``on`` (whatever the size)
or ``auto`` (the default). The options are part of a program's key in JAX's persistent
cache, so programs compiled either way never mix.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlcluster_lab.core.precision import PROGRAMS, traced_at, traced_precision

ENV = "RLCLUSTER_LAB_FAST_COMPILE"
MODES = ("auto", "on", "off")


# XLA DebugOptions fields, passed per program (jax.jit's ``compiler_options``); all of them only
# change how XLA:CPU generates code, never what a program computes (float results may differ in
# the last bits: the numerics tests run with them). These are the options the lab asks for; the
# ones a program gets are those the running XLA accepts (``accepted_options``): XLA refuses a whole
# compile over one option it does not know, and its set changes between releases (JAX 0.12's
# XLA:CPU dropped ``xla_cpu_use_fusion_emitters``).
#
# The fourth keeps a program's machine code in one piece: XLA:CPU splits it into parts compiled on
# threads of their own by default, which on two cores busy with the lab's other work costs more
# than it saves (the first RL step's four programs: 1.06-1.14 s of compiling against 1.24-1.30 s;
# the same losses and log-probs). The fifth gives matrix products XLA:CPU's own (Eigen) kernels
# instead of YNNPACK fusions: a YNNPACK fusion builds its runtime the first time its program runs,
# about 0.3 ms per product, for every new program and for one read back from the disk cache (a
# program of 100 small products ran in 29 ms the first time and 0.4 ms after; with Eigen, 20 ms
# once per process and then nothing for any later program); the first RL step (tiny colocated
# LoRA, through the cluster's calls) took 1.84-1.92 s instead of 2.23 s cold and 1.00-1.04 s
# instead of 1.40 s from the disk cache, and ran about as fast once compiled.
FAST_CPU: Mapping[str, Any] = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
    "xla_cpu_use_fusion_emitters": False,
    "xla_cpu_parallel_codegen_split_count": 1,
    "xla_cpu_experimental_ynn_fusion_type": "",
}

# On a GPU XLA tries several kernels for each matrix product and fusion the first time it compiles
# a program (autotuning) and keeps the fastest, and writes products as Triton kernels compiled with
# the program; for the small models' products neither pays: the tiny model's first RL step on one
# H200 (through the learner, one process each) took 29.1 s, 13.8 s without autotuning, 3.3 s with
# cuBLAS's products as well (the programs: sampler 6.7 -> 4.1 -> 1.4 s, the log-probs 6.7 and
# 2.8 -> 0.5 and 0.5 s, the optimizer step 11.3 -> 4.7 -> 1.6 s; the step once compiled 40-56 ms
# either way). They change which kernel computes a product, not what it computes.
FAST_GPU: Mapping[str, Any] = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False}

# Cheap compiling per platform (others: XLA's defaults).
FAST: Mapping[str, Mapping[str, Any]] = {"cpu": FAST_CPU, "gpu": FAST_GPU}

# The lab's tiny (0.1 M parameters) and small (1.5 M) models compile cheaply; base (10 M) and
# large (47 M) keep XLA's defaults, where the programs' run time starts to matter on CPU.
FAST_MAX_ELEMENTS = 4_000_000

# A program that only moves data, on CPU (the reshaped layout's reshard, 8 devices, one process
# each, 2026-12-07): the tiny model's (0.1 M elements) compiled in 0.035 s with FAST_CPU against
# 0.31-0.34 s with XLA's defaults, and synced in the same 6 ms either way; the small model's
# (1.5 M) synced in 12 ms against 7.6 ms, and base's (10 M) in 47 ms against 25 ms. Cheap code
# generation up to here: below the small model, where it starts to slow every sync.
MOVE_FAST_MAX_ELEMENTS = 1_000_000


def compile_mode() -> str:
    """``RLCLUSTER_LAB_FAST_COMPILE`` as one of ``MODES`` (``auto`` when unset).

    Raises:
        ValueError: any other value, naming the ones allowed.
    """
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r} is not a compile mode; use one of {', '.join(MODES)}")
    return value


def chosen_options(platform: str | None, elements: int | None = None) -> dict[str, Any] | None:
    """The options the lab asks for, for a program on ``platform`` (``"cpu"``, ``"gpu"``, ``"tpu"``;
    None: unknown) over ``elements``, the model's parameter count or the elements the program's
    inputs hold (None: unknown, treated as small); None for XLA's defaults. XLA is not asked:
    ``compiler_options`` gives the ones it accepts."""
    mode = compile_mode()
    if mode == "off" or platform not in FAST:
        return None
    if mode == "auto" and elements is not None and elements > FAST_MAX_ELEMENTS:
        return None
    return dict(FAST[platform])


def compiler_options(platform: str | None, elements: int | None = None) -> dict[str, Any] | None:
    """The compiler options a program on ``platform`` over ``elements`` gets: ``chosen_options``
    less those the running XLA does not know (``accepted_options``); None for XLA's defaults."""
    chosen = chosen_options(platform, elements)
    if chosen is None or platform is None:
        return None
    return accepted_options(platform, chosen) or None


log = logging.getLogger(__name__)
_ACCEPTED: dict[tuple[str, tuple[tuple[str, Any], ...]], dict[str, Any]] = {}
_ASKING = threading.Lock()


def _probe(x: Any) -> Any:
    return x + 1


def accepted_options(platform: str, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``wanted`` the running XLA accepts for ``platform``, asked of XLA itself once per
    process: a one-operation program is compiled with them, and an option it refuses
    ("No such compile option", or a value it cannot parse, either naming the option) is left out
    with one line in the log and the rest tried again. Where this process has no backend for
    ``platform``, nothing can be compiled for it and ``wanted`` is returned as it is."""
    key = (platform, options_key(wanted))
    with _ASKING:  # two threads compiling at once ask once
        if key not in _ACCEPTED:
            _ACCEPTED[key] = _ask_xla(platform, dict(wanted))
    return dict(_ACCEPTED[key])


def _ask_xla(platform: str, options: dict[str, Any]) -> dict[str, Any]:
    import jax
    import numpy as np

    try:
        device = jax.devices(platform)[0]
    except RuntimeError:  # no such backend in this process
        return options
    arg = jax.ShapeDtypeStruct((), np.float32, sharding=jax.sharding.SingleDeviceSharding(device))
    while options:
        error = run_apart(lambda: jax.jit(_probe, compiler_options=options).lower(arg).compile())
        if error is None:
            return options
        refused = [name for name in options if name in error]
        if not refused:  # a failure that names no option is no answer about them: keep them all
            log.info("asking XLA on %s about its compile options failed (%s); kept as asked", platform, error[:200])
            return options
        for name in refused:
            log.info("XLA on %s refused compile option %s=%r; left out (%s)", platform, name, options.pop(name), error)
    return options


def run_apart(compile_probe: Callable[[], Any]) -> str | None:
    """Run ``compile_probe`` (a question asked of JAX or XLA) on a thread of its own, so that no mesh
    this thread has entered (an operation's role context) applies to it; the first line of its
    error, None when it ran."""
    error: list[str] = []

    def probe() -> None:
        try:
            compile_probe()
        except Exception as err:  # noqa: BLE001 - XLA's refusal is the answer asked for
            error.append(str(err).splitlines()[0][:300] if str(err) else type(err).__name__)

    thread = threading.Thread(target=probe, name="rlcluster-lab-ask-xla")
    thread.start()
    thread.join()
    return error[0] if error else None


def platform_of(tree: Any) -> str | None:
    """The platform of the first array in ``tree`` (None when it holds none)."""
    import jax

    shardings = (s for s in (getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(tree)) if s is not None)
    return next((str(device.platform) for s in shardings for device in s.device_set), None)


def elements_of(tree: Any) -> int:
    """The elements ``tree``'s arrays (or ``jax.ShapeDtypeStruct``s) hold, all together."""
    import jax

    return sum(int(getattr(leaf, "size", 0)) for leaf in jax.tree.leaves(tree))


def options_for(tree: Any, elements: int | None = None) -> dict[str, Any] | None:
    """``compiler_options`` for a program over ``tree``'s arrays (``elements``: the model's
    parameter count when known, else the arrays' own element count)."""
    return compiler_options(platform_of(tree), elements_of(tree) if elements is None else elements)


def move_options(tree: Any, platform: str | None = None) -> dict[str, Any] | None:
    """``compiler_options`` for a program that only moves ``tree``'s arrays (on ``platform``, else
    theirs): XLA's defaults in ``auto`` mode once they hold more than ``MOVE_FAST_MAX_ELEMENTS``."""
    elements = elements_of(tree)
    if compile_mode() == "auto" and elements > MOVE_FAST_MAX_ELEMENTS:
        return None
    return compiler_options(platform or platform_of(tree), elements)


def options_key(options: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A hashable form of ``options``, for keys of compiled programs."""
    return tuple(sorted((options or {}).items()))


class ProgramFamily:
    """One jitted function per set of compiler options and matmul precision, each made on first use.

    A module-level program is jitted before anyone knows where it will run; the
    options depend on that (the platform, the model's size), so the jitted
    function is picked per call: ``family.jitted(options)(*args)``. ``program`` names
    its row of ``core.precision.PROGRAMS`` (None: it multiplies no matrices), which
    says the precision it is traced at.
    """

    def __init__(self, fun: Callable[..., Any], program: str | None = None, **jit_kwargs: Any) -> None:
        if program is not None:
            PROGRAMS[program]  # noqa: B018 - a name the table lacks is refused here, at import
        self._fun = fun
        self.program = program
        self._jit_kwargs = jit_kwargs
        self._by_options: dict[tuple[Any, ...], Any] = {}

    def jitted(self, options: Mapping[str, Any] | None) -> Any:
        """The function jitted with ``options`` (None: XLA's defaults), traced at the program's
        precision here (``core.precision.traced_precision``)."""
        precision = traced_precision(self.program)
        key = (options_key(options), precision)
        hit = self._by_options.get(key)
        if hit is None:
            import jax

            fun = traced_at(self._fun, precision)
            hit = jax.jit(fun, compiler_options=dict(options) if options else None, **self._jit_kwargs)
            # A dict write is atomic under the GIL: two threads at most build the same wrapper twice.
            self._by_options[key] = hit
        return hit


_BUILD_ONLY = threading.local()


class Built(Exception):  # noqa: N818 - not an error: the signal that ends a build-only call
    """Raised by ``run`` inside ``build`` once the program is compiled, instead of running it."""


def build(operation: Callable[[], Any]) -> None:
    """Call ``operation`` up to the first program it asks ``run`` for, on this thread: that
    program is compiled and not run, and ``Built`` ends the call there. The program lands in
    the jitted function's own cache, so the same call made later (any thread) runs it without
    compiling."""
    stop_at_first(_BUILD_ONLY, Built, operation)


def stop_at_first(flag: threading.local, stop: type[Exception], operation: Callable[[], Any]) -> None:
    """Call ``operation`` with ``flag.on`` set on this thread, until the first program it reaches
    raises ``stop`` (the signal that the program was built, or checked, and the call ends there);
    ``flag`` as it was afterwards, so calls nest."""
    previous = getattr(flag, "on", False)
    flag.on = True
    try:
        operation()
    except stop:
        pass
    finally:
        flag.on = previous


def run(jitted: Any, *args: Any) -> Any:
    """``jitted(*args)``; inside ``build``, compile it for ``args`` and raise ``Built``."""
    if getattr(_BUILD_ONLY, "on", False):
        jitted.lower(*args).compile()
        raise Built
    return jitted(*args)
