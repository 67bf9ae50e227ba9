"""A JupyterLab server on localhost with a token, for the real-browser test.

It serves a scratch folder holding a copy of the notebook, so running its
cells never writes outputs into the repository, and keeps its config,
runtime and workspace files there too. Started ``make_lab=True``, it runs what
`make lab` runs (read from ``make -n lab``): the working copies made from the
tracked notebooks into the scratch folder, then the same `jupyter lab` command.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_lab_commands(lab_dir: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """What `make lab` runs here, read from ``make -n lab`` with this Python's environment as the
    venv (so nothing is installed) and ``lab_dir`` as the folder of working copies: the command
    that makes the working copies, and the environment and arguments of the `jupyter lab` command
    (the warm start left out)."""
    venv = Path(sys.executable).parent.parent
    out = subprocess.run(
        ["make", "-n", "lab", f"VENV={venv}", f"LAB_DIR={lab_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [shlex.split(line) for line in out.replace("\\\n", " ").splitlines()]
    copies = [words for words in lines if "rlcluster_lab.lab.notebook.copies" in words]
    labs = [words for words in lines if "lab" in words and any(w.endswith("jupyter") for w in words)]
    assert len(copies) == 1 and len(labs) == 1, out
    env = {}
    while re.fullmatch(r"[A-Z_]+=.*", labs[0][0]):
        name, value = labs[0].pop(0).split("=", 1)
        env[name] = value
    return copies[0], env, labs[0]


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
    ``make_lab``: served as `make lab` serves the notebooks (its working copies, its command).
    ``hidden``: packages the kernels cannot import, as in an environment without them.
    """

    def __init__(
        self, root: Path, notebooks: list[Path], *, make_lab: bool = False, hidden: tuple[str, ...] = ()
    ) -> None:
        self.root = root
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "jupyter.log"
        self._proc: subprocess.Popen | None = None
        self.make_lab = make_lab
        self.hidden = hidden
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
        # Absolute: a kernel runs in its notebook's folder.
        paths = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if self.hidden:
            # Python imports sitecustomize at start; None in sys.modules makes an import fail
            # and importlib.util.find_spec answer None, as when the package is not installed.
            site = self.root / "hidden"
            site.mkdir(exist_ok=True)
            (site / "sitecustomize.py").write_text(
                "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in self.hidden)
            )
            paths.insert(0, str(site))
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def start(self, timeout: float = 120.0) -> None:
        env = self.env()
        cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={self.work}"]
        if self.make_lab:
            copies, assigned, cmd = make_lab_commands(self.work)
            subprocess.run(copies, cwd=REPO, env=env, check=True, capture_output=True)
            env.update(assigned)
        cmd += [
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.terminals_enabled=False",
            # Nothing from the network: no update check, no extension listing from a registry.
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI runs as root
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
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
