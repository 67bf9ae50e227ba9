"""`make lab` prints notebook 00's own address, not the Launcher's.

The test asks make for the command `make lab` runs (``make -n``, with this Python's
environment as the venv, so nothing is installed), runs it on a free port with a token of its
own (and no browser), and reads the address the server prints: it must be notebook 00's, and
that page must exist. No browser is needed.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from lab_server import JupyterLab, free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster  # a JupyterLab server in a subprocess


def lab_command() -> list[str]:
    """The `jupyter lab ...` command `make lab` runs here, as arguments."""
    venv = Path(sys.executable).parent.parent
    out = subprocess.run(
        ["make", "-n", "lab", f"VENV={venv}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    lines = [line for line in out.replace("\\\n", " ").splitlines() if "jupyter lab" in line]
    assert len(lines) == 1, out
    return shlex.split(lines[0])


def test_make_lab_prints_the_address_of_notebook_00(tmp_path: Path) -> None:
    port = free_port()
    # The server makes its own token, as under `make lab` (one given to it is printed as "...").
    command = lab_command() + [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    env = JupyterLab(tmp_path, []).env()
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        address = re.compile(rf"http://127\.0\.0\.1:{port}/\S*")
        deadline = time.monotonic() + 120
        while not address.search(log.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        printed = address.findall(log.read_text())
        expected = re.compile(rf"http://127\.0\.0\.1:{port}/lab/tree/00_start_here\.ipynb\?token=(\w+)$")
        matches = [m for m in map(expected.match, printed) if m]
        assert matches, f"the server printed {printed}, not notebook 00's address"
        url, token = matches[0].group(0), matches[0].group(1)
        # The address opens notebook 00 (not a missing file): the page answers, the file is there.
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/contents/00_start_here.ipynb?content=0&token={token}", timeout=30
        ) as info:
            assert info.status == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
