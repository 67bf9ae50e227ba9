"""How long the test suite and the set-up take: CI from a clean clone, the fast tier, `make lab`.

    python benchmarks/suite_time.py          # `bash .ci/run` in a fresh clone of HEAD (11-13 minutes on 2 cores)
    python benchmarks/suite_time.py --fast   # `make test-fast` in this checkout (about a minute)
    python benchmarks/suite_time.py --lab    # `make lab` in a fresh clone of HEAD, until it prints its URL

A clone is made with ``git clone`` into a temporary folder and removed after. `.ci/run` there
makes its own `.venv` and runs `make test`; pytest's last line gives its tests and seconds.
`make lab` is timed until it prints notebook 00's URL, then stopped; the warm start it starts
in the background is waited for before the clone goes. pip's download cache is the user's, so
a machine that never installed the lab downloads about 1 GB first.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parents[1]
# pytest's summary: "==== 2056 passed, 1 skipped in 608.12s (0:10:08) ====".
SUMMARY = re.compile(r"=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s\b")
WARM_PID = re.compile(r"in the background \(process (?P<pid>\d+)")


def minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def pytest_summaries(output: str) -> list[tuple[int, float]]:
    """(tests passed, pytest's seconds) of each pytest run in ``output``, in order."""
    out = []
    for line in output.splitlines():
        found = SUMMARY.search(line)
        if found and "passed" in found["counts"]:
            out.append((int(re.search(r"(\d+) passed", found["counts"])[1]), float(found["seconds"])))
    return out


def pytest_summary(output: str) -> tuple[int, float] | None:
    """(tests passed, pytest's seconds) from its last summary line; None without one."""
    found = pytest_summaries(output)
    return found[-1] if found else None


def clone() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="rlcluster-lab-clone-"))
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(folder / "repo")], check=True)
    return folder / "repo"


def ci(where: str) -> list[dict]:
    repo = clone()
    try:
        proc = common.run_process(["bash", ".ci/run"], cwd=str(repo), timeout=3600)
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    # The first pytest run is `make test`'s; the ones after it, the second stage's (`make test-newest`:
    # the fast tier, the install check and the notebooks on Python 3.12 with the newest JAX).
    runs = pytest_summaries(proc["stdout"] + proc["stderr"])
    print(f"bash .ci/run: exit {proc['rc']}, {minutes(proc['wall_s'])}; pytest runs: {runs}")
    if proc["rc"] != 0 or not runs:
        print(common.tail(proc["stdout"] + proc["stderr"], 30))
        return []
    (passed, seconds), newest = runs[0], runs[1:]
    rows = [
        common.page_row(
            "suite.ci",
            "suite",
            "`bash .ci/run` from a clean clone, the install included",
            where,
            common.run_value(proc["wall_s"], minutes(proc["wall_s"])),
        ),
        common.page_row(
            "suite.pytest",
            "suite",
            "its pytest: every test and notebook",
            where,
            common.run_value(seconds, f"{minutes(seconds)} ({passed:,} tests)"),
        ),
    ]
    if newest:
        tests, spent = sum(n for n, _ in newest), sum(s for _, s in newest)
        rows.append(
            common.page_row(
                "suite.newest",
                "suite",
                "its second stage's pytest: the fast tier, the install check and the notebooks on Python 3.12 "
                "with the newest JAX",
                where,
                common.run_value(spent, f"{minutes(spent)} ({tests:,} tests)"),
            )
        )
    return rows


def fast(where: str) -> list[dict]:
    proc = common.run_process(["make", "test-fast"], cwd=str(REPO), timeout=1800)
    found = pytest_summary(proc["stdout"] + proc["stderr"])
    print(f"make test-fast: exit {proc['rc']}; pytest: {found}")
    if proc["rc"] != 0 or found is None:
        print(common.tail(proc["stdout"] + proc["stderr"], 30))
        return []
    passed, seconds = found
    return [
        common.page_row(
            "suite.fast",
            "suite",
            "`make test-fast`",
            where,
            common.run_value(seconds, f"{minutes(seconds)} ({passed:,} tests)"),
            common.at_most(60, "<= 1 min"),
        )
    ]


def lab(where: str, timeout: float) -> list[dict]:
    repo = clone()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    start = time.perf_counter()
    proc = subprocess.Popen(
        ["make", "lab"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: stopped whole below
    )
    seconds, warm_pid = None, None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if (found := WARM_PID.search(line)) is not None:
                warm_pid = int(found["pid"])
            if "http" in line and "00_start_here.ipynb" in line:
                seconds = time.perf_counter() - start
                break
            if time.perf_counter() - start > timeout:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        # The warm start runs apart from make's process group; it finishes before the clone goes.
        while warm_pid is not None and time.perf_counter() - start < timeout and _alive(warm_pid):
            time.sleep(1)
        shutil.rmtree(repo.parent, ignore_errors=True)
    print(f"make lab: notebook 00's URL after {seconds if seconds is None else minutes(seconds)}")
    if seconds is None:
        return []
    return [
        common.page_row(
            "suite.lab",
            "suite",
            "`make lab` from a fresh clone, until it prints notebook 00's URL",
            where,
            common.run_value(seconds, minutes(seconds)),
        )
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--fast", action="store_true", help="`make test-fast` in this checkout")
    which.add_argument("--lab", action="store_true", help="`make lab` in a fresh clone, until its URL")
    p.add_argument("--timeout", type=float, default=900, help="seconds `make lab` may take")
    common.add_row_options(p)
    args = p.parse_args()
    where = common.machine("cpu")
    rows = fast(where) if args.fast else lab(where, args.timeout) if args.lab else ci(where)
    common.emit_rows(rows, args.save_row)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
