"""A JupyterLab server on localhost with a token, for the real-browser test.

It serves a scratch folder holding a copy of the notebook, so running its
cells never writes outputs into the repository, and keeps its config,
runtime and workspace files there too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def copy_notebooks(notebooks: list[Path], folder: Path) -> None:
    """Copy each notebook into ``folder`` with its Markdown twin and ``jupytext.toml``, where they exist."""
    folder.mkdir(parents=True, exist_ok=True)
    for nb in notebooks:
        for twin in (nb, nb.with_suffix(".md"), nb.parent / "jupytext.toml"):
            if twin.exists():
                shutil.copy(twin, folder / twin.name)


class JupyterLab:
    """``jupyter lab`` started from this Python, so its kernel imports this package.

    ``notebooks`` are copied into the served folder (with their Markdown twins and
    ``jupytext.toml`` where they exist, so a save writes both, as in the repository).
    """

    def __init__(self, root: Path, notebooks: list[Path]) -> None:
        self.root = root
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "jupyter.log"
        self._proc: subprocess.Popen | None = None
        work = root / "work"
        work.mkdir(parents=True, exist_ok=True)
        copy_notebooks(notebooks, work)
        self.work = work

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        config = self.root / "config"
        (config / "labconfig").mkdir(parents=True, exist_ok=True)
        # No news toast over the panels (and no request for news).
        # The app object on ``window.jupyterapp``, so a test can run a command (save) as a menu would.
        (config / "labconfig" / "page_config.json").write_text(
            json.dumps(
                {
                    "disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True},
                    "exposeAppInBrowser": True,
                }
            )
        )
        env.update(
            JUPYTER_CONFIG_DIR=str(config),
            JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
            JUPYTER_DATA_DIR=str(self.root / "data"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.root / "workspaces"),
            JUPYTERLAB_SETTINGS_DIR=str(self.root / "settings"),
            IPYTHONDIR=str(self.root / "ipython"),
        )
        return env

    def start(self, timeout: float = 120.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.work}",
            "--ServerApp.terminals_enabled=False",
            # Nothing from the network: no update check, no extension listing from a registry.
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI runs as root
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self._proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"jupyter lab did not answer within {timeout:.0f}s:\n{self.log.read_text()[-3000:]}")

    def notebook_url(self, name: str, *, reset: bool = False) -> str:
        """The notebook's own address; ``reset``: in a workspace with nothing else open (JupyterLab
        would otherwise reopen, and start kernels for, every notebook opened before)."""
        return f"{self.url}/lab/tree/{name}?token={self.token}" + ("&reset" if reset else "")

    def api(self, path: str, method: str = "GET") -> object:
        """A call to the server's REST API; its JSON answer (None when empty)."""
        req = urllib.request.Request(f"{self.url}/api/{path}?token={self.token}", method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """End every kernel the server runs (one per notebook opened)."""
        for session in self.api("sessions") or []:
            self.api(f"sessions/{session['id']}", method="DELETE")

    def trust(self, path: Path) -> None:
        """Sign a notebook in this server's own trust database, as JupyterLab's "Trust Notebook" does."""
        subprocess.run(
            [sys.executable, "-m", "jupyter", "trust", str(path)], env=self.env(), check=True, capture_output=True
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        # Shut down through the API so the kernel goes too, then make sure.
        try:
            req = urllib.request.Request(f"{self.url}/api/shutdown?token={self.token}", method="POST")
            urllib.request.urlopen(req, timeout=10).close()
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - fall back to ending our own process
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
