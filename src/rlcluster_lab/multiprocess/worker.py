"""One process of a multi-process run: JAX set up for it, its job, its result, and a clean exit.

A run ends instead of hanging: the worker dies with its launcher (``PR_SET_PDEATHSIG``); JAX's
preemption service is off, so SIGTERM ends it; joining and heartbeats are bounded; a failed
worker writes its error and leaves with ``os._exit(1)`` at once (a normal exit would wait in the
shutdown barrier while its peers wait in collectives). ``--progress`` lines say where it was.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcluster_lab.core.errors import ConfigError

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the launcher) exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher is gone already
        os._exit(1)


def refusal(exc: ConfigError) -> dict[str, Any]:
    """A ``ConfigError`` as JSON: what the launcher needs to raise it again (``launcher._failure``)."""
    return {"message": str(exc), "knobs": list(exc.knobs), "problem": exc.problem}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rlcluster_lab.multiprocess.worker", description=__doc__)
    p.add_argument("--job", required=True, help="JSON file: what to run")
    p.add_argument("--out", required=True, help="JSON file this process writes its result to")
    p.add_argument("--progress", required=True, help="file this process appends progress lines to")
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--coordinator", required=True, help="host:port of process 0's coordination service")
    p.add_argument("--devices", type=int, required=True, help="CPU devices of this process")
    return p.parse_args(argv)


class Progress:
    """Appends ``[process I +seconds] message`` lines to a file, flushed at once."""

    def __init__(self, path: str, process_id: int) -> None:
        self.path, self.process_id, self.start = path, process_id, time.monotonic()

    def __call__(self, message: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"[process {self.process_id} +{time.monotonic() - self.start:.1f}s] {message}\n")


def start_runtime(args: argparse.Namespace) -> None:
    """The CPU backend with ``--devices`` devices and gloo collectives, then the distributed runtime."""
    import jax

    from rlcluster_lab.core.compile_cache import enable_compilation_cache

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_preemption_service", False)  # SIGTERM must end the process
    # Only process 0 writes the persistent cache (JAX's rule); every process may read it.
    enable_compilation_cache()
    jax.distributed.initialize(
        coordinator_address=args.coordinator,
        num_processes=args.num_processes,
        process_id=args.process_id,
        local_device_ids=list(range(args.devices)),
        # Seconds that bound joining, a peer without heartbeats and the exit barrier.
        initialization_timeout=120,
        heartbeat_timeout_seconds=10,
        shutdown_timeout_seconds=60,
    )


def write_json(path: str, data: Any) -> None:
    """Write ``data`` whole or not at all (the launcher may read it any time)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(json.dumps(data))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run one job in this process and leave with ``os._exit`` (never returns)."""
    die_with_parent()
    args = parse_args(argv)
    progress = Progress(args.progress, args.process_id)
    try:
        job = json.loads(Path(args.job).read_text())
        progress("starting the JAX runtime")
        start_runtime(args)
        progress("runtime up")
        from rlcluster_lab.multiprocess.jobs import run_job

        result = run_job(job, progress)
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the process leaves
        with contextlib.suppress(Exception):
            write_json(
                args.out,
                {
                    "process_index": args.process_id,
                    "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000],
                    "traceback": traceback.format_exc()[-6000:],
                    # A configuration that cannot work: the launcher refuses it as this process did.
                    **({"refusal": refusal(exc)} if isinstance(exc, ConfigError) else {}),
                },
            )
            progress(f"failed: {type(exc).__name__}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    write_json(args.out, result)
    progress("done; leaving the runtime with the others")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import jax

        jax.distributed.shutdown()
    except Exception as exc:  # noqa: BLE001
        print(f"leaving the distributed runtime failed: {exc}", file=sys.stderr, flush=True)
        os._exit(3)
    os._exit(0)


if __name__ == "__main__":
    main()
