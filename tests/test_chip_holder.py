"""A chip another process holds: who holds it (``core.chip_holder``), what ``setup()`` says and
builds then, the hand-over through a Jupyter server (``lab.notebook.chip_handover``), and the CLI's refusal.

The stand-in holder is a shell (not Python: the fast tier may start it) that opens a stand-in
device file and waits on its stdin; a stand-in Jupyter server answers on the loopback address.
JAX's failure to open the chip is made where the lab opens the accelerator
(``core.devices._jax_devices``), in libtpu's words as measured on a chip another process held.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest

import rlcluster_lab as rl
from rlcluster_lab.core import chip_holder, devices, jupyter
from rlcluster_lab.core.chip_holder import ChipHeld, Holder, chip_held, failed_platform, find_holders, kernel_id
from rlcluster_lab.lab.notebook import chip_handover

REPO = Path(__file__).resolve().parents[1]
# JAX's message on a TPU VM when another process holds the chip (jax.devices(), platforms "tpu,cpu").
HELD = (
    "Unable to initialize backend 'tpu': ABORTED: Internal error when accessing libtpu multi-process lockfile. "
    "Run \"$ sudo rm /tmp/libtpu_lockfile\". (set JAX_PLATFORMS='' to automatically choose an available backend)"
)
KERNEL = "6f1e8a4c-1234-4567-89ab-0123456789ab"


class StandIn:
    """A process that holds a stand-in device file open until its stdin closes, with a Jupyter
    kernel's arguments when ``connection_file`` is given (``-f .../kernel-<id>.json``)."""

    def __init__(self, device: Path, connection_file: Path | None = None) -> None:
        args = ["-f", str(connection_file)] if connection_file else ["stand-in"]
        script = 'exec 3<"$0"; echo ready; read _'  # $0: the device file, opened as fd 3
        self.process = subprocess.Popen(
            ["sh", "-c", script, str(device), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline() == "ready\n"  # the file is open from here on

    @property
    def pid(self) -> int:
        return self.process.pid

    def end(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


@pytest.fixture
def chip(tmp_path, monkeypatch) -> Path:
    """A stand-in chip: the device file the lab looks for, and a lockfile path with no file."""
    device = tmp_path / "accel0"
    device.touch()
    monkeypatch.setattr(chip_holder, "DEVICE_FILES", (str(tmp_path / "accel*"),))
    monkeypatch.setattr(chip_holder, "LOCKFILE", str(tmp_path / "libtpu_lockfile"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    (tmp_path / "runtime").mkdir()
    return device


@contextlib.contextmanager
def holding(device: Path, connection_file: Path | None = None) -> Iterator[StandIn]:
    holder = StandIn(device, connection_file)
    try:
        yield holder
    finally:
        holder.end()


class FakeServer:
    """A Jupyter server on 127.0.0.1: ``/api/sessions`` lists one notebook's kernel, ``DELETE
    /api/kernels/<id>`` ends the stand-in holder; both ask for the token, as Jupyter does."""

    def __init__(self, runtime: Path, sessions: list[dict], token: str = "secret") -> None:
        self.deleted: list[str] = []
        self.on_delete = lambda kernel: None
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"token {token}":
                    return True
                self.send_error(403)
                return False

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self._authorized() and self.path == "/api/sessions":
                    body = json.dumps(sessions).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def do_DELETE(self) -> None:  # noqa: N802
                if self._authorized() and self.path.startswith("/api/kernels/"):
                    kernel = self.path.rsplit("/", 1)[1]
                    fake.deleted.append(kernel)
                    fake.on_delete(kernel)
                    self.send_response(204)
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        port = self.httpd.server_address[1]
        info = {"pid": os.getpid(), "url": f"http://127.0.0.1:{port}/", "token": "secret", "root_dir": str(runtime)}
        (runtime / f"jpserver-{os.getpid()}.json").write_text(json.dumps(info))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(chip) -> Iterator[FakeServer]:
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    sessions = [{"path": "00_start_here.ipynb", "type": "notebook", "kernel": {"id": KERNEL, "name": "python3"}}]
    fake = FakeServer(runtime, sessions)
    yield fake
    fake.close()


@pytest.fixture
def cpu_fallback_undone():
    """JAX's platforms and the lab's record of its fallback as they were before the test."""
    platforms = jax.config.jax_platforms
    yield
    jax.config.update("jax_platforms", platforms)
    devices._before_fallback.clear()


def _fail_to_open(monkeypatch, message: str = HELD) -> None:
    def held() -> list:
        raise RuntimeError(message)

    monkeypatch.setattr(devices, "_jax_devices", held)


# ---------------------------------------------------------------------------- who holds it


def test_a_process_with_the_device_file_open_is_found_with_its_command(chip):
    assert find_holders() == ()
    with holding(chip) as holder:
        (found,) = find_holders()
        assert found.pid == holder.pid and found.argv[:2] == ("sh", "-c") and found.argv[-1] == "stand-in"
        assert found.kernel_id is None and found.notebook is None
        assert found.words() == f"process {holder.pid} ({found.command})" and "stand-in" in found.command
    assert find_holders() == ()


def test_a_lock_on_the_lockfile_names_its_process_from_proc_locks(tmp_path):
    lockfile = tmp_path / "libtpu_lockfile"
    lockfile.touch()
    assert chip_holder._locking_pids(str(lockfile), "/proc") == []
    with open(lockfile) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        assert chip_holder._locking_pids(str(lockfile), "/proc") == [os.getpid()]
        assert find_holders((), str(lockfile)) == ()  # this process is never its own holder


def test_a_pid_libtpu_names_is_a_holder_while_it_runs(chip):
    with holding(chip) as holder:
        said = f"ABORTED: The TPU is already in use by process with pid {holder.pid}."
        held = chip_held("tpu", said, device_files=())
        assert held is not None and [h.pid for h in held.holders] == [holder.pid]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ("python3", "-m", "ipykernel_launcher", "-f", f"/root/.local/share/jupyter/runtime/kernel-{KERNEL}.json"),
            KERNEL,
        ),
        (("python", "-m", "ipykernel_launcher", f"--f=/tmp/kernel-{KERNEL}.json"), KERNEL),
        (("python", "-m", "ipykernel_launcher", "-f", "/tmp/connection.json"), None),
        (("python", "notebook.py", "-f"), None),
        (("sleep", "600"), None),
    ],
)
def test_a_jupyter_kernel_is_known_by_its_connection_file(argv, expected):
    assert kernel_id(argv) == expected


def test_a_kernel_command_is_shown_without_folders_and_cut_to_a_line():
    argv = (
        "/usr/bin/python3",
        "-m",
        "ipykernel_launcher",
        "-f",
        f"/root/.local/share/jupyter/runtime/kernel-{KERNEL}.json",
    )
    assert Holder(1, argv).command == f"python3 -m ipykernel_launcher -f kernel-{KERNEL}.json"
    assert len(Holder(1, ("python", "x" * 200)).command) == chip_holder._COMMAND_CHARS


@pytest.mark.parametrize(
    "message, platform",
    [
        (HELD, "tpu"),
        ("Backend 'tpu' failed to initialize: ABORTED: lockfile. Available backends are ['cpu']", "tpu"),
        ("Unable to initialize backend 'cpu': out of memory", None),
        ("Unknown backend tpu. Available backends are ['cpu']", None),
        ("INVALID_ARGUMENT: No such compile option", None),
    ],
)
def test_the_platform_that_failed_is_read_from_either_of_jaxs_messages(message, platform):
    assert failed_platform(RuntimeError(message)) == platform


def test_a_failure_is_a_held_chip_only_with_a_holder_or_in_libtpus_words_for_one(chip):
    missing = "INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object file"
    assert chip_held("tpu", missing) is None  # a machine without libtpu, nothing holding a chip
    assert chip_held("tpu", HELD) == ChipHeld("tpu", ())  # held, by no process this user can list
    with holding(chip) as holder:
        assert [h.pid for h in chip_held("tpu", missing).holders] == [holder.pid]
        assert chip_held("tpu", missing, said=True) is None  # JAX's quiet record: libtpu's words only
    assert ChipHeld("tpu", ()).who() == "another process (one this user cannot list)"


# ---------------------------------------------------------------------------- its notebook, from its server


def test_a_kernel_holder_is_named_with_the_notebook_its_server_runs(chip, server):
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    with holding(chip, runtime / f"kernel-{KERNEL}.json") as holder:
        (found,) = find_holders()
        assert found.pid == holder.pid and found.kernel_id == KERNEL
        assert found.notebook == "00_start_here.ipynb" and found.server is not None
        assert found.words().endswith(", the kernel of notebook 00_start_here.ipynb)")
        assert "secret" not in repr(found)  # the server's token is never shown


def test_a_server_that_refuses_the_token_or_has_gone_leaves_the_notebook_unknown(chip, server, tmp_path):
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    (listing,) = runtime.glob("jpserver-*.json")
    info = json.loads(listing.read_text())
    listing.write_text(json.dumps({**info, "token": "wrong"}))
    with holding(chip, runtime / f"kernel-{KERNEL}.json"):
        (found,) = find_holders()
        assert found.kernel_id == KERNEL and found.notebook is None and found.server is None
    server.close()
    listing.write_text(json.dumps(info))
    assert jupyter.kernel_notebooks(jupyter.running_servers([runtime])) == {}
    # A listing left by a server that is no longer running is not asked at all.
    listing.write_text(json.dumps({**info, "pid": 2**22 + 1}))
    assert jupyter.running_servers([runtime]) == []


# ---------------------------------------------------------------------------- what setup() says and builds


def test_setup_with_the_chip_held_names_the_holder_and_builds_every_layout_on_the_simulated_devices(
    chip, server, monkeypatch, cpu_fallback_undone, capsys
):
    _fail_to_open(monkeypatch)
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    with holding(chip, runtime / f"kernel-{KERNEL}.json") as holder:
        lab = rl.setup(8)
    out = capsys.readouterr().out
    sentence = out.splitlines()[0]
    assert sentence == lab.held and sentence.count(". ") == 0 and sentence.endswith(".")  # one sentence, first
    assert sentence.startswith(f"The TPU chip is held by process {holder.pid} (sh -c ")
    assert "the kernel of notebook 00_start_here.ipynb" in sentence
    assert "run lab = rl.setup(take_chip=True), which shuts it down through its Jupyter server" in sentence
    assert "Kernel > Shut Down Kernel" in sentence and "sudo" not in out and "lockfile" not in out
    # Every layout on the 8 simulated CPU devices, and every label says so.
    assert lab.simulated and lab.accelerator is None and list(lab.devices) == jax.devices("cpu")
    assert lab.reachable == ("colocated", "reshaped", "split")
    assert {f.where for f in lab.layout_families()} == {"8 simulated CPU devices"}
    assert "layouts are built on: 8 simulated CPU device(s)" in out and jax.config.jax_platforms == "cpu"


def test_setup_names_a_holder_that_is_no_kernel_and_says_to_end_it(chip, monkeypatch, cpu_fallback_undone):
    _fail_to_open(monkeypatch)
    with holding(chip) as holder:
        lab = rl.setup(8, quiet=True)
    assert f"end that process (kill {holder.pid}), then run lab = rl.setup(take_chip=True)." in lab.held
    assert lab.summary().splitlines()[0] == lab.held


def test_setup_reads_the_chip_held_from_jaxs_record_where_jax_fell_back_to_the_cpu_itself(
    chip, monkeypatch, cpu_fallback_undone
):
    # Platforms not named: jax.devices() gives the CPU's, and jax.devices("tpu") raises JAX's record.
    record = HELD.removeprefix("Unable to initialize backend 'tpu': ")
    monkeypatch.setattr(devices, "_backend_errors", lambda: {"tpu": record})
    with holding(chip) as holder:
        lab = rl.setup(8, quiet=True)
    assert lab.held.startswith(f"The TPU chip is held by process {holder.pid} ")
    # A machine without libtpu keeps such a record too: nothing is said then.
    monkeypatch.setattr(devices, "_backend_errors", lambda: {"tpu": "INTERNAL: Failed to open libtpu.so"})
    assert rl.setup(8, quiet=True).held is None


def test_setup_raises_jaxs_own_error_for_any_other_failure(chip, monkeypatch, cpu_fallback_undone):
    _fail_to_open(monkeypatch, "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so")
    with pytest.raises(RuntimeError, match="Failed to open libtpu.so"):
        rl.setup(8, quiet=True)


def test_take_chip_shuts_the_holding_kernel_down_through_its_server_and_waits_for_the_chip(chip, server):
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    with holding(chip, runtime / f"kernel-{KERNEL}.json") as holder:
        server.on_delete = lambda kernel: holder.end()  # the server ends the kernel it was asked to
        done = chip_handover.hand_over()
        assert server.deleted == [KERNEL] and holder.process.poll() is not None
    assert done.kernels == (f"the kernel of notebook 00_start_here.ipynb (process {holder.pid})",)
    assert not done.reopened  # this process never fell back to the CPU: nothing to start again
    assert find_holders() == ()


def test_take_chip_leaves_a_holder_no_server_runs_alone(chip, server):
    with holding(chip) as holder:
        assert chip_handover.hand_over().kernels == () and server.deleted == []
        assert holder.process.poll() is None


# ---------------------------------------------------------------------------- in a fresh process, as on a chip

# JAX as a TPU VM starts it (platforms "tpu,cpu": jax.devices() raises when the TPU's backend does
# not start), the stand-in device file read in place of the chip's.
CHILD = """\
import sys
from rlcluster_lab.core import chip_holder
chip_holder.DEVICE_FILES = (sys.argv[1],)
chip_holder.LOCKFILE = sys.argv[1] + ".lock"
"""


def _child_env() -> dict[str, str]:
    return {**os.environ, "JAX_PLATFORMS": "tpu,cpu", "RLCLUSTER_LAB_WARM": "off", "PYTHONPATH": str(REPO / "src")}


@pytest.mark.cluster
def test_in_a_fresh_process_setup_falls_back_and_take_chip_hands_the_chip_over(chip, server):
    runtime = Path(os.environ["JUPYTER_RUNTIME_DIR"])
    code = CHILD + (
        "import json, rlcluster_lab as rl\n"
        "first = rl.setup(quiet=True)\n"
        "second = rl.setup(quiet=True, take_chip=True)\n"
        "print(json.dumps([first.summary(), second.summary(), len(second.devices)]))\n"
    )
    with holding(chip, runtime / f"kernel-{KERNEL}.json") as holder:
        server.on_delete = lambda kernel: holder.end()
        run = subprocess.run(
            [sys.executable, "-c", code, str(chip)], capture_output=True, text=True, env=_child_env(), timeout=300
        )
    assert run.returncode == 0, run.stderr
    first, second, count = json.loads(run.stdout.strip().splitlines()[-1])
    assert first.startswith(f"The TPU chip is held by process {holder.pid} ") and "00_start_here.ipynb" in first
    assert server.deleted == [KERNEL] and count == 8
    # This machine has no TPU: JAX, started again, still cannot open one, and says what to do.
    assert f"shut down the kernel of notebook 00_start_here.ipynb (process {holder.pid}), which held the chip" in second
    assert second.startswith("The TPU chip is free, yet JAX in this kernel could not open it again")
    assert "restart this kernel (Kernel > Restart Kernel)" in second and "sudo" not in first + second


@pytest.mark.cluster
def test_the_cli_refuses_in_one_line_naming_the_holder_and_the_flag_for_cpu_devices(chip):
    cli = CHILD + "from rlcluster_lab.cli.main import main\nraise SystemExit(main(sys.argv[2:]))\n"
    with holding(chip) as holder:
        run = subprocess.run(
            [sys.executable, "-c", cli, str(chip), "plan", "--model-size", "tiny"],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=300,
        )
        on_cpu = subprocess.run(
            [sys.executable, "-c", cli, str(chip), "plan", "--model-size", "tiny", "--cpu"],
            capture_output=True,
            text=True,
            env=_child_env(),
            timeout=300,
        )
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"error: the TPU chip is held by process {holder.pid} (sh -c ")
    assert line.endswith(
        f"end that process (kill {holder.pid}), or run with --cpu to use 8 simulated CPU devices instead"
    )
    assert on_cpu.returncode == 0, on_cpu.stderr
