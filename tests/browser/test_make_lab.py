"""`make lab` prints notebook 00's own address, not the Launcher's.

The test asks make for the commands `make lab` runs (``make -n``, with this Python's
environment as the venv, so nothing is installed, and a scratch folder for the working
copies), runs them, the server on a free port with a token of its own (and no browser), and
reads the address the server prints: it must be notebook 00's, and that page must exist, in
the working copies it serves. No browser is needed.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lab_server import REPO, JupyterLab, free_port, make_lab_commands

pytestmark = pytest.mark.cluster  # a JupyterLab server in a subprocess


def test_make_lab_prints_the_address_of_notebook_00(tmp_path: Path) -> None:
    port = free_port()
    work = tmp_path / "lab"
    copies, assigned, lab = make_lab_commands(work)
    env = {**JupyterLab(tmp_path, []).env(), **assigned}
    subprocess.run(copies, cwd=REPO, env=env, check=True)
    assert f"--ServerApp.root_dir={work}" in lab, "make lab does not serve the working copies"
    assert (work / "00_start_here.ipynb").read_bytes() == (REPO / "notebooks" / "00_start_here.ipynb").read_bytes()
    # The server makes its own token, as under `make lab` (one given to it is printed as "...").
    command = lab + [
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
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
        with _opened(url, proc, log) as page:
            assert page.status == 200
        contents = f"http://127.0.0.1:{port}/api/contents/00_start_here.ipynb?content=0&token={token}"
        with _opened(contents, proc, log) as info:
            assert info.status == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _opened(url: str, proc: subprocess.Popen, log: Path):
    """``url`` opened; a refused connection is tried again for up to 30 s while the server runs
    (on a loaded machine it once refused right after printing its address), and a server that
    is gone fails with its exit code and the end of its log."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return urllib.request.urlopen(url, timeout=30)
        except urllib.error.URLError as err:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{url} could not be opened ({err}); the server "
                    f"{'exited with ' + str(proc.returncode) if proc.poll() is not None else 'still runs'}; "
                    f"its log ends:\n{log.read_text()[-3000:]}"
                ) from err
            time.sleep(0.5)
