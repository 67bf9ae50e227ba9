"""Start a multi-process run on this machine, wait for it, and never leave a process behind.

``run_reports`` never imports JAX: it writes the job to a file, starts one worker per process in
a session of its own (its process group can be signalled) and polls them. The first worker that
fails ends the run (the others get SIGTERM, then SIGKILL) with its error; the deadline ends a run
stuck in a collective, which JAX never detects; workers die with the launcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import rlcluster_lab
from rlcluster_lab.core.errors import ConfigError

MAX_PROCESSES = 16
POLL_S = 0.05
GRACE_S = 3.0
DEFAULT_TIMEOUT_S = 900.0


class LaunchError(RuntimeError):
    """A multi-process run did not finish: a worker failed, or the deadline passed.

    Attributes:
        process_id: the worker that failed first (None for a timeout).
        returncode: its exit status (negative: the signal that ended it).
        elapsed_s: seconds from the start of the run to the failure.
        log_tail: the last lines of the failed worker's log (of every worker's, for a timeout).
    """

    def __init__(
        self,
        message: str,
        *,
        process_id: int | None = None,
        returncode: int | None = None,
        elapsed_s: float | None = None,
        log_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.process_id, self.returncode, self.elapsed_s, self.log_tail = process_id, returncode, elapsed_s, log_tail


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """How many processes, and the seconds that bound the whole run (joining, heartbeats and the
    exit barrier are bounded in ``multiprocess.worker``)."""

    processes: int = 2
    devices_per_process: int = 4
    timeout_s: float = DEFAULT_TIMEOUT_S

    def check(self) -> None:
        """Raises ``ConfigError`` naming the setting that cannot work, and the fix."""
        from rlcluster_lab.core.options import check_device_count

        for name, value, low, high in (
            ("processes", self.processes, 1, MAX_PROCESSES),
            ("devices_per_process", self.devices_per_process, 1, None),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < low or (high is not None and value > high):
                bound = f"between {low} and {high}" if high is not None else f"at least {low}"
                raise ConfigError(f"{name} must be {bound}, got {value}")
        check_device_count(self.processes * self.devices_per_process, "processes x devices per process")
        value = self.timeout_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {value!r}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_socket(err: OSError) -> str:
    return f"open a loopback TCP socket ({err}), through which a run's processes find each other"


def _no_process(err: OSError | subprocess.SubprocessError) -> str:
    return f"start another Python process ({err}), which each process of a run is"


def cannot_launch() -> str | None:
    """What this runtime lacks to launch a run here, said as "cannot ..." completes it (None: nothing),
    tried rather than guessed: a loopback TCP socket (the coordinator's) and a Python process."""
    try:
        free_port()
    except OSError as err:
        return _no_socket(err)
    try:
        subprocess.run(  # noqa: S603 - this Python, a fixed argument
            [sys.executable, "-c", "pass"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return _no_process(err)
    return None


def launch(
    job: dict[str, Any],
    settings: LaunchSettings,
    *,
    progress: Callable[[str], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``job`` in ``settings.processes`` workers on this machine; returns each worker's result in
    process order, or raises as ``run_reports`` does once every worker is stopped."""
    settings.check()
    # The run's folder (job, results, progress, logs) is removed on every exit path.
    with tempfile.TemporaryDirectory(prefix="rlcluster-lab-processes-", ignore_cleanup_errors=True) as folder:
        return _run_workers(Path(folder), job, settings, progress, on_start)


@dataclasses.dataclass
class _Worker:
    """One worker's files (``w<i>.json``, ``.progress``, ``.log``) and what the launcher read of its progress."""

    index: int
    folder: Path
    process: subprocess.Popen = dataclasses.field(init=False)
    read: int = 0  # bytes of its progress file read so far
    last: str = ""  # its last progress line

    def path(self, suffix: str) -> Path:
        return self.folder / f"w{self.index}.{suffix}"

    def read_progress(self, progress: Callable[[str], None] | None) -> None:
        """Pass on the complete lines the worker wrote since the last call."""
        try:
            with open(self.path("progress")) as f:
                f.seek(self.read)
                text = f.read()
        except FileNotFoundError:
            return
        complete = text[: text.rfind("\n") + 1]
        self.read += len(complete.encode())
        for line in complete.splitlines():
            self.last = line
            if progress is not None:
                progress(line)

    def tail(self, lines: int = 40) -> str:
        """The last lines of its log (read before the run's folder is removed)."""
        try:
            return "\n".join(self.path("log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _run_workers(
    folder: Path,
    job: dict[str, Any],
    settings: LaunchSettings,
    progress: Callable[[str], None] | None,
    on_start: Callable[[list[int]], None] | None,
) -> list[dict[str, Any]]:
    job_file = folder / "job.json"
    job_file.write_text(json.dumps(job))
    try:
        port = free_port()
    except OSError as err:
        raise LaunchError(f"the run could not start: this runtime cannot {_no_socket(err)}") from err
    env = _worker_env()
    workers: list[_Worker] = []
    start = time.monotonic()
    failed: tuple[_Worker, int, float] | None = None
    timed_out = False
    try:
        for i in range(settings.processes):
            w = _Worker(i, folder)
            cmd = [
                sys.executable,
                "-m",
                "rlcluster_lab.multiprocess.worker",
                *("--job", str(job_file), "--out", str(w.path("json")), "--progress", str(w.path("progress"))),
                *("--process-id", str(w.index), "--num-processes", str(settings.processes)),
                *("--coordinator", f"127.0.0.1:{port}", "--devices", str(settings.devices_per_process)),
            ]
            with open(w.path("log"), "wb") as sink:
                try:
                    w.process = subprocess.Popen(
                        cmd, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True
                    )
                except OSError as err:  # the processes started before it are stopped below
                    raise LaunchError(f"the run could not start: this runtime cannot {_no_process(err)}") from err
            workers.append(w)
        if on_start is not None:
            on_start([w.process.pid for w in workers])
        while True:
            codes = [w.process.poll() for w in workers]
            for w in workers:
                w.read_progress(progress)
            bad = [i for i, rc in enumerate(codes) if rc not in (None, 0)]
            if bad:
                failed = (workers[bad[0]], int(codes[bad[0]]), time.monotonic() - start)  # type: ignore[arg-type]
                break
            if all(rc == 0 for rc in codes):
                break
            if time.monotonic() > start + settings.timeout_s:
                timed_out = True
                break
            time.sleep(POLL_S)
    finally:
        _stop([w.process for w in workers])
        for w in workers:
            w.read_progress(progress)
    if failed is not None or timed_out:
        raise _failure(workers, failed, settings, start)
    return [json.loads(w.path("json").read_text()) for w in workers]


def _worker_env() -> dict[str, str]:
    """The workers' environment: this copy of the lab first on the path, JAX on the CPU alone
    (``cpu_only_env``), unbuffered output, and no proxy (the runtime's connections are local)."""
    from rlcluster_lab.core.compile_cache import ENV as CACHE_ENV
    from rlcluster_lab.core.devices import cpu_only_env

    env = {k: v for k, v in cpu_only_env().items() if "_proxy" not in k.lower()}
    src = str(Path(rlcluster_lab.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([src, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    jax = sys.modules.get("jax")  # a caller that uses JAX already (a notebook, a test session)
    folder = jax.config.jax_compilation_cache_dir if jax is not None else None
    if folder and CACHE_ENV not in env:
        env[CACHE_ENV] = str(folder)  # the workers share the caller's compilation cache
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every worker's process group still running, SIGKILL what is left after the grace."""
    for p in processes:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    end = time.monotonic() + GRACE_S
    for p in processes:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()
    for p in processes:  # anything the worker started in its group goes with it
        _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def _failure(
    workers: Sequence[_Worker], failed: tuple[_Worker, int, float] | None, settings: LaunchSettings, start: float
) -> LaunchError | ConfigError:
    where = "; ".join(f"process {w.index}: {w.last or 'no progress yet'}" for w in workers)
    if failed is None:
        return LaunchError(
            f"the run did not finish within {settings.timeout_s:g} s and its {len(workers)} processes were "
            f"stopped (last progress: {where})",
            elapsed_s=time.monotonic() - start,
            log_tail="\n".join(f"[process {w.index}] {w.tail()}" for w in workers),
        )
    w, code, elapsed = failed
    reason, where_in_code, refusal = None, "", None
    with contextlib.suppress(OSError, ValueError):
        written = json.loads(w.path("json").read_text())
        reason, where_in_code, refusal = written.get("error"), written.get("traceback") or "", written.get("refusal")
    if refusal is not None:
        # A configuration that cannot work is refused as one process would refuse it, not reported as a crash.
        return in_launch_terms(ConfigError(refusal["message"], knobs=refusal["knobs"], problem=refusal["problem"]))
    return LaunchError(
        f"process {w.index} of {len(workers)} failed after {elapsed:.1f} s: {reason or _exit_reason(code, w)}; the "
        f"other processes were stopped (last progress: {where})",
        process_id=w.index,
        returncode=code,
        elapsed_s=elapsed,
        log_tail="\n".join(filter(None, [w.tail(), where_in_code])),  # the worker's traceback ends it
    )


def in_launch_terms(err: ConfigError) -> ConfigError:
    """A refusal that names the device count (``--devices``), said for a launch: its devices are
    processes x devices_per_process, the knobs to change instead."""
    err.knobs = tuple(k for f in err.knobs for k in (("devices_per_process", "processes") if f == "devices" else (f,)))
    return err


def _exit_reason(code: int, w: _Worker) -> str:
    """Why a worker that wrote no error ended: the signal, and the runtime's own last fatal line."""
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    lines = w.tail(lines=10**9).splitlines()
    # The distributed runtime aborts with a line starting "F<date>" naming the cause.
    fatal = [ln for ln in lines if ln.startswith("F") and "]" in ln]
    tail = fatal[-1].split("]", 1)[1].strip() if fatal else (lines[-1].strip() if lines else "")
    return how + (f" ({tail[:400]})" if tail else "")


def run_reports(
    scenarios: Sequence[Any],
    *,
    processes: int = 2,
    devices_per_process: int = 4,
    sync: bool | int = False,
    exercise: bool | Sequence[bool] = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
) -> list[dict[str, Any]]:
    """Placement reports of several scenarios, each built over ``processes`` processes on this machine,
    all in one launch (the workers start and compile once); each is ``report.merge_reports``'s.

    Args:
        scenarios: ``Scenario`` objects (checked here, before anything starts).
        processes: how many processes (at most 16).
        devices_per_process: simulated CPU devices in each.
        sync: run one weight sync per scenario (or this many) and report the last.
        exercise: also generate, score under every role and take one optimizer step before the
            sync, and score with the rollout after it (``exercise_by_process``); one flag for
            every scenario, or one per scenario.
        timeout: seconds for the whole run.
        progress: called with each progress line of each process.
        on_start: called with the workers' process ids once they started.

    Raises:
        LaunchError: a process failed (its error is in the message), the run passed ``timeout``,
            or it could not start (``cannot_launch``).
        ConfigError: a scenario or setting that cannot work.
    """
    from rlcluster_lab.rules.validation import check_scenario

    settings = LaunchSettings(processes=processes, devices_per_process=devices_per_process, timeout_s=timeout)
    settings.check()
    knobs = []
    for s in scenarios:
        try:  # a Scenario, its knobs, and its layout on the run's devices
            check_scenario(s, settings.processes * settings.devices_per_process)
        except ConfigError as err:
            raise in_launch_terms(err) from None
        if s.reshard == "minimal" and settings.processes > 1:
            raise ConfigError(
                "the minimal reshard strategy copies one buffer at a time between devices, which JAX does only "
                "within a process; use reshard='xla' (--reshard xla) with several processes"
            )
        knobs.append(dataclasses.asdict(s))
    if not knobs:
        raise ConfigError("run_reports needs at least one scenario")
    ops = [bool(exercise)] * len(knobs) if isinstance(exercise, bool) else [bool(e) for e in exercise]
    if len(ops) != len(knobs):
        raise ConfigError(f"exercise has {len(ops)} flag(s) for {len(knobs)} scenario(s); give one per scenario")
    syncs = int(sync)
    if syncs < 0:
        raise ConfigError(f"sync must be True, False or a number of syncs (at least 0), got {sync!r}")
    job = {"kind": "reports", "scenarios": knobs, "syncs": syncs, "exercise": ops}
    return launch(job, settings, progress=progress, on_start=on_start)[0]["reports"]
