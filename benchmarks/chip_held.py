"""A chip another process holds, as in JupyterLab when notebook 00's kernel keeps it: what the lab
does in every other process, timed. One JSON row per step on stdout.

Run on a machine with one TPU chip (the lab's ``src`` on ``PYTHONPATH``)::

    python benchmarks/chip_held.py                  # about 3-5 minutes
    python benchmarks/chip_held.py --stand-in       # anywhere: a stand-in holder and failure, a dry run

1. ``holder``: a process runs notebook 00's first code cell (``lab = rl.setup()``: it opens the
   chip) and waits; its row says whether it got the chip and how long opening it took.
2. ``setup``: another process runs ``rl.setup()``; its row has the seconds, the sentence it printed
   first, whether that names the holder's process id, and where the layouts were built.
3. ``notebook 01``: every code cell of notebook 01 in a fresh process (IPython's shell, no kernel),
   to its end or its first error; the first cell's first line.
4. ``cli``: ``python -m rlcluster_lab report``: exit code, seconds, its stderr lines.
5. ``take chip``: one process runs ``rl.setup()``, ends the holder by its process id, then runs
   ``rl.setup(take_chip=True)``: whether JAX opens the chip in the process that fell back to the
   CPU devices (its backends started again), and the sentence if not.
6. ``fresh setup``: ``rl.setup()`` in a fresh process once the holder is gone: the chip.

With ``--stand-in`` (a machine without a chip) the holder is a shell that keeps a stand-in device
file open, and JAX is started as a TPU machine starts it (platforms "tpu,cpu"), so its TPU backend
fails to start: the rows are the lab's behaviour around a failure, not a chip's. The background
warm start is off in every process (``RLCLUSTER_LAB_WARM=off``), so the timings are the lab's own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


def first_setup_cell() -> str:
    import nbformat

    cells = nbformat.read(NOTEBOOKS / "00_start_here.ipynb", as_version=4).cells
    return next(c.source for c in cells if c.cell_type == "code")


# The stand-in's prelude in every child: the lab looks for the stand-in device file, not the chip's.
STAND_IN = """
from rlcluster_lab.core import chip_holder as _ch
_ch.DEVICE_FILES = ({device!r},)
_ch.LOCKFILE = {device!r} + ".lock"
"""

HOLDER = r"""
import json, time
from IPython.core.interactiveshell import InteractiveShell
start = time.perf_counter()
result = InteractiveShell.instance().run_cell(CELL)
import jax
print("@@HOLDING@@ " + json.dumps({"ok": bool(result.success), "seconds": round(time.perf_counter() - start, 2),
                                   "platform": jax.devices()[0].platform}), flush=True)
time.sleep(HOLD_S)
"""

SETUP = r"""
import json, time, io, contextlib
start = time.perf_counter()
out = io.StringIO()
with contextlib.redirect_stdout(out):
    import rlcluster_lab as rl
    lab = rl.setup()
seconds = time.perf_counter() - start
said = out.getvalue().splitlines()
print("@@RESULT@@ " + json.dumps({"seconds": round(seconds, 2), "first_line": said[0] if said else "",
                                  "held": lab.held, "accelerator": lab.accelerator,
                                  "built_on": sorted({f.where for f in lab.layout_families()})}))
"""

NOTEBOOK = r"""
import json, time, io, contextlib
import nbformat
from IPython.core.interactiveshell import InteractiveShell
cells = [c.source for c in nbformat.read(PATH, as_version=4).cells if c.cell_type == "code"]
shell = InteractiveShell.instance()
ran, error, first, seconds = 0, None, "", []
for source in cells:
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(source, store_history=True)
    seconds.append(round(time.perf_counter() - start, 2))
    if ran == 0:
        first = (out.getvalue().splitlines() or [""])[0]
    if not result.success:
        exc = result.error_in_exec or result.error_before_exec
        error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        break
    ran += 1
print("@@RESULT@@ " + json.dumps({"cells": len(cells), "ran": ran, "error": error, "first_line": first,
                                  "seconds": round(sum(seconds), 1), "first_cell_seconds": seconds[0]}))
"""

TAKE = r"""
import json, os, signal, time, io, contextlib
import rlcluster_lab as rl
with contextlib.redirect_stdout(io.StringIO()):
    first = rl.setup()
os.kill(HOLDER_PID, signal.SIGTERM)  # the holder, ended by its process id
deadline = time.monotonic() + 60
while os.path.exists(f"/proc/{HOLDER_PID}") and "Z" not in open(f"/proc/{HOLDER_PID}/stat").read().split()[2]:
    if time.monotonic() > deadline:
        break
    time.sleep(0.1)
start = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    lab = rl.setup(take_chip=True)
import jax
seconds = round(time.perf_counter() - start, 2)
print("@@RESULT@@ " + json.dumps({"held_first": first.held is not None, "seconds": seconds,
                                  "accelerator": lab.accelerator, "held": lab.held,
                                  "devices": sorted({d.platform for d in jax.devices()})}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stand-in", action="store_true", help="a stand-in holder and failure (no chip needed)")
    parser.add_argument("--hold-s", type=float, default=540.0, help="how long the holder waits at most")
    parser.add_argument("--save", default="", help="also write the rows to this JSON file")
    args = parser.parse_args()

    env = {
        "RLCLUSTER_LAB_WARM": "off",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    prelude = ""
    folder = tempfile.mkdtemp(prefix="chip-held-")
    if args.stand_in:
        device = os.path.join(folder, "accel0")
        Path(device).touch()
        env["JAX_PLATFORMS"] = "tpu,cpu"  # as a TPU machine starts JAX: the TPU's failure raises
        prelude = STAND_IN.format(device=device)
        holder = subprocess.Popen(
            ["sh", "-c", 'exec 3<"$0"; echo "@@HOLDING@@ {}"; exec sleep "$1"', device, str(int(args.hold_s))],
            stdout=subprocess.PIPE,
            text=True,
        )
    else:
        code = f"CELL = {first_setup_cell()!r}\nHOLD_S = {args.hold_s}\n" + HOLDER
        holder = subprocess.Popen(
            [sys.executable, "-c", code], cwd=NOTEBOOKS, stdout=subprocess.PIPE, text=True, env={**os.environ, **env}
        )
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    try:
        said = []  # what the holder printed before it holds the chip (its set-up's summary)
        for line in holder.stdout:
            if line.startswith("@@HOLDING@@"):
                emit({"step": "holder", "pid": holder.pid, "first_line": (said or [""])[0], **json.loads(line[12:])})
                break
            said.append(line.rstrip("\n"))
        else:
            emit({"step": "holder", "pid": holder.pid, "ok": False, "said": said[-5:], "rc": holder.wait()})
            return 1
        child(emit, "setup", prelude + SETUP, env, holder.pid)
        child(
            emit,
            "notebook 01",
            prelude + f"PATH = {str(NOTEBOOKS / '01_backbone_sharing_map.ipynb')!r}\n" + NOTEBOOK,
            env,
            holder.pid,
            timeout=420,
        )
        cli = "import sys\n" + prelude + "from rlcluster_lab.cli.main import main\nraise SystemExit(main(['report']))"
        proc = common.run_process([sys.executable, "-c", cli], env=env, timeout=120)
        lines = proc["stderr"].strip().splitlines()
        emit(
            {
                "step": "cli",
                "rc": proc["rc"],
                "seconds": round(proc["wall_s"], 2),
                "stderr_lines": len(lines),
                "names_holder": any(str(holder.pid) in x for x in lines),
                "line": lines[-1] if lines else "",
                "sudo": "sudo" in proc["stderr"],
                "traceback": "Traceback" in proc["stderr"],
            }
        )
        child(emit, "take chip", prelude + f"HOLDER_PID = {holder.pid}\n" + TAKE, env, holder.pid)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    child(emit, "fresh setup", prelude + SETUP, env, holder.pid)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def child(emit: Any, step: str, code: str, env: dict[str, str], holder_pid: int, timeout: float = 180) -> None:
    """Run ``code`` in a fresh process in the notebooks' folder; one row of its result and wall time."""
    start = time.perf_counter()
    proc = common.run_python_child(code, env=env, cwd=str(NOTEBOOKS), timeout=timeout)
    row = {"step": step, "wall_s": round(time.perf_counter() - start, 2), "rc": proc["rc"], **(proc["result"] or {})}
    if proc["result"] is None:
        row["stderr"] = common.tail(proc["stderr"], 8)
    said = str(row.get("first_line") or row.get("held") or "")
    row["names_holder"] = f"process {holder_pid} " in said
    emit(row)


if __name__ == "__main__":
    raise SystemExit(main())
