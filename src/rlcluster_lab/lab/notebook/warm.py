"""The lab's warm start: compile the standard programs into the persistent cache, in the background.

The first Construct, Sync and Training step of a new environment compile their programs
(seconds each on two CPU cores). ``start_warm_up()`` starts one other process, at the lowest
CPU priority, that builds the standard tiny clusters (``STANDARD``) and takes one training
step of the widget's size on each (its sync included), so every program they compile lands in
the persistent compilation cache, for the lab and the notebooks to read back.

It never blocks (``make lab`` and ``rl.setup()`` only start it) and runs once per environment
(a record in the cache folder, ``warm_key``), never two at once (``_take_lock``), only where the
layouts run on simulated CPU devices (the process is pinned to the CPU, so it never takes an
accelerator's memory), and only when the persistent cache is on and trusted
(``core.compile_cache``: a folder of this user's, mode 0700). A folder it cannot write gets
one warning and no warm start; it never writes through a link (``O_NOFOLLOW``). What it writes
is bounded like the rest of the cache (``RLCLUSTER_LAB_COMPILATION_CACHE_MAX_MB``).
``RLCLUSTER_LAB_WARM=off`` turns it off (the test suite does).

    python -m rlcluster_lab.lab.notebook.warm               # warm now, in this process
    python -m rlcluster_lab.lab.notebook.warm --background  # start the background process and return
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcluster_lab.core.compile_cache import ENV as CACHE_ENV
from rlcluster_lab.core.compile_cache import KEEP_PREFIX, cache_dir, trusted_folder, warn_once
from rlcluster_lab.core.devices import cpu_only_env

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no warm start
    fcntl = None  # type: ignore[assignment]
from rlcluster_lab.core.options import DEFAULT_SIMULATED_DEVICES

ENV = "RLCLUSTER_LAB_WARM"
RECORD = KEEP_PREFIX + ".json"
LOCK = KEEP_PREFIX + ".lock"
LOG = KEEP_PREFIX + ".log"

# The widget's training step (``PlacementLab.step_config``).
STEP_SIZES = {"steps": 1, "prompts_per_step": 2, "group_size": 4}

# (layout, LoRA) of the tiny, vanilla clusters warmed: the lab's first clicks.
STANDARD: tuple[tuple[str, bool], ...] = tuple(
    (layout, lora) for layout in ("colocated", "reshaped", "split") for lora in (False, True)
)


def warm_key(devices: int = DEFAULT_SIMULATED_DEVICES) -> dict[str, Any]:
    """What the programs in the cache depend on: versions, devices, compile mode and the CPU
    compiler options it chooses (part of each program's cache key), each program's matmul
    precision in the standard clusters (``core.precision``: in each program's text), the scenarios."""
    import importlib.metadata as metadata

    from rlcluster_lab.core.compile_options import chosen_options, compile_mode
    from rlcluster_lab.core.config import ClusterConfig
    from rlcluster_lab.core.precision import PROGRAMS, precision_of

    compared = {f.name: f.default for f in dataclasses.fields(ClusterConfig)}["matmul_precision"]

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "?"

    return {
        **{name: version(name) for name in ("rlcluster-lab", "jax", "jaxlib", "flax", "optax")},
        "python": sys.version.split()[0],
        "devices": devices,
        "compile_mode": compile_mode(),
        "cpu_compiler_options": chosen_options("cpu"),  # XLA not asked: no backend started here
        "matmul_precisions": {program: precision_of(program, compared) for program in PROGRAMS},
        "scenarios": [list(s) for s in STANDARD],
    }


def is_warm(folder: Path, devices: int = DEFAULT_SIMULATED_DEVICES) -> bool:
    """Whether a finished warm-up for this environment is recorded in ``folder``."""
    try:
        data = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("key") == warm_key(devices)


def _open(folder: Path, name: str, flags: int) -> int:
    """A descriptor of ``folder / name``, made private (0600) when new, never through a link."""
    return os.open(folder / name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


_PID_WIDTH = 20  # a pid is written padded to this width in one write, so a reader never sees it half-replaced


def _write_pid(fd: int, pid: int) -> None:
    os.pwrite(fd, f"{pid:<{_PID_WIDTH}}".encode("ascii"), 0)


def _lock_pid(folder: Path, wait: float = 1.0) -> int | None:
    """The pid written in ``folder``'s lock (the warm-up holding it), None when unreadable. The
    holder writes it just after taking the lock, so an empty file is read again for up to ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = _open(folder, LOCK, os.O_RDONLY)
        except OSError:
            return None
        try:
            text = os.read(fd, 64).decode("ascii").strip()
        finally:
            os.close(fd)
        if text or time.monotonic() >= deadline:
            try:
                return int(text or "0") or None
            except ValueError:
                return None
        time.sleep(0.01)


def _take_lock(folder: Path) -> int | None:
    """A descriptor holding ``folder``'s lock (None when a warm-up holds it), this process's pid
    written in it. The lock is an exclusive ``flock``: taken atomically, and released by the kernel
    when the last descriptor of its holder closes, so a crashed warm-up leaves nothing stale.

    Raises:
        OSError: the lock file cannot be opened (a read-only folder, a link in its place).
    """
    fd = _open(folder, LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _write_pid(fd, os.getpid())
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unusable(folder: Path, err: OSError) -> str:
    """One warning per folder that the warm start cannot write; returns the line ``setup`` shows."""
    where = err.filename or folder
    reason = f"cannot be written ({err.strerror or err})"
    if err.errno == errno.ELOOP:
        reason = "is a symbolic link, which the warm start never writes through"
    warn_once(
        folder,
        f"the warm start is off: {where} {reason}; programs are compiled when first needed instead. Make "
        f"{folder} a writable folder of your own, set {CACHE_ENV} to one, or set {ENV}=off",
    )
    return f"warm start skipped: {folder} cannot be written (see the warning)"


def start_warm_up(devices: int = DEFAULT_SIMULATED_DEVICES, *, command: Sequence[str] | None = None) -> str:
    """Start the warm-up process when this environment is not warm yet; never waits for it. Returns
    one line saying what happened (started, with its pid and log; already warm; already running; or
    why not), "" when ``RLCLUSTER_LAB_WARM`` turns it off. ``command``: the process to start (tests pass a stub)."""
    if os.environ.get(ENV, "on").strip().lower() in ("0", "off", "false", "no"):
        return ""
    if fcntl is None:
        return "warm start skipped: it needs flock (a POSIX system)"
    where = cache_dir()
    if where is None:
        return "warm start skipped: the persistent compilation cache is off"
    folder = trusted_folder(where, "the persistent compilation cache")
    if folder is None:
        return f"warm start skipped: {where} cannot be trusted (see the warning)"
    if is_warm(folder, devices):
        return "compilation cache already warm for this environment"
    try:
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OSError(errno.EACCES, "it is read-only for this user", str(folder))
        lock = _take_lock(folder)
    except OSError as err:
        return _unusable(folder, err)
    if lock is None:
        pid = _lock_pid(folder)
        return f"the compilation cache is being warmed already ({f'process {pid}' if pid else 'another process'})"
    argv = list(command) if command is not None else [sys.executable, "-m", "rlcluster_lab.lab.notebook.warm"]
    argv += ["--devices", str(devices), "--low-priority"] if command is None else []
    try:
        log = _open(folder, LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            proc = subprocess.Popen(  # noqa: S603 - our own module, argv built here
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=cpu_only_env(),  # never the accelerator this kernel holds
                start_new_session=True,  # a kernel restart or Ctrl-C in the terminal does not stop it half-way
                pass_fds=(lock,),  # the process holds the lock until it ends
            )
        finally:
            os.close(log)
        _write_pid(lock, proc.pid)
    except OSError as err:
        return _unusable(folder, err)
    finally:
        os.close(lock)
    return f"warming the compilation cache in the background (process {proc.pid}, log {folder / LOG})"


def warm_programs(
    devices: int = DEFAULT_SIMULATED_DEVICES, scenarios: Sequence[tuple[str, bool]] = STANDARD
) -> dict[str, Any]:
    """In this process: build each standard cluster and take one training step of the widget's
    size (its sync included), so their programs land in the persistent cache; returns what it did."""
    from rlcluster_lab.core.compile_cache import count_compilations, enable_compilation_cache, flush_cache_writes
    from rlcluster_lab.core.devices import ensure_simulated_devices

    ensure_simulated_devices(devices)
    folder = enable_compilation_cache()
    if folder is None:
        raise RuntimeError("the persistent compilation cache is off or not trusted: there is nothing to warm")
    from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig
    from rlcluster_lab.app.scenario import build_cluster
    from rlcluster_lab.core.options import Scenario

    done = []
    start = time.perf_counter()
    for layout, lora in scenarios:
        t = time.perf_counter()
        with count_compilations() as built:
            cluster = build_cluster(Scenario(layout=layout, lora=lora))
            # The cluster is this process's own, dropped after: its learner's own first step,
            # which builds its later programs beside the sampling (no person's clicks to leave a
            # core for; 16 s for the six clusters against 20 s on one thread).
            GRPOLearner(cluster, LearnerConfig(**STEP_SIZES)).step()
            flush_cache_writes()  # on disk now, for a notebook already waiting on them
        seconds, cached = time.perf_counter() - t, sum(c for _, _, c in built)
        done.append({"layout": layout, "lora": lora, "seconds": seconds, "programs": len(built), "from_cache": cached})
        print(f"warmed {layout}{' LoRA' if lora else ''}: {len(built)} programs", flush=True)
        del cluster
    return {"folder": str(folder), "scenarios": done, "seconds": time.perf_counter() - start}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlcluster_lab.lab.notebook.warm", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--devices", type=int, default=DEFAULT_SIMULATED_DEVICES)
    parser.add_argument("--background", action="store_true", help="start the warm-up process and return at once")
    parser.add_argument("--low-priority", action="store_true", help="run at the lowest CPU priority (nice 19)")
    args = parser.parse_args(argv)
    if args.low_priority and hasattr(os, "nice"):
        with contextlib.suppress(OSError):
            os.nice(19)  # the notebook's own work comes first
    if args.background:
        print(start_warm_up(args.devices))
        return 0
    where = cache_dir()
    folder = trusted_folder(where, "the persistent compilation cache") if where is not None else None
    result = warm_programs(args.devices)
    if folder is not None:
        record = {"key": warm_key(args.devices), "finished": time.time(), "result": result}
        try:
            fd = _open(folder, RECORD, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with open(fd, "w", encoding="utf-8") as out:
                json.dump(record, out, indent=1)
        except OSError as err:
            print(_unusable(folder, err), flush=True)
            return 1
    print(f"compilation cache warm: {result['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
