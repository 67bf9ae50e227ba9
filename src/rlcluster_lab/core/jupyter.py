"""The running Jupyter servers of this machine, asked over their REST API (standard library only).

A Jupyter server (JupyterLab, ``make lab``) lists itself in its runtime folder as
``jpserver-<pid>.json``: its URL and token. Its ``/api/sessions`` names the notebook each kernel
runs, and ``DELETE /api/kernels/<id>`` shuts a kernel down as the notebook's Kernel > Shut Down
Kernel does. ``core.chip_holder`` reads the first to name the notebook whose kernel holds the chip;
``lab.notebook.setup`` the second to hand the chip over. Every call fails quietly (``None``, ``False``) where
no server answers: a machine without sockets, a server with a password instead of a token.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# A server on this machine answers in milliseconds; one that does not is not waited on.
TIMEOUT_S = 2.0


@dataclasses.dataclass(frozen=True)
class Server:
    """One running Jupyter server: where it answers, and the token it asks for."""

    url: str  # with its base URL and a final "/": "http://localhost:8888/"
    token: str = dataclasses.field(repr=False)  # a credential: never printed
    root_dir: str = ""

    def call(self, method: str, path: str) -> Any:
        """The JSON the server answers ``method`` on ``path`` (``"api/sessions"``) with; None for no body.

        Raises:
            OSError: the server did not answer, or refused (``urllib.error.URLError`` is one).
            ValueError: it answered something other than JSON.
        """
        request = urllib.request.Request(urllib.parse.urljoin(self.url, path), method=method)
        if self.token:
            request.add_header("Authorization", f"token {self.token}")
        # No proxy: the server is on this machine, and an http_proxy setting would send the call away.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=TIMEOUT_S) as response:
            body = response.read()
        return json.loads(body) if body else None


def runtime_dirs(extra: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """The folders where running servers list themselves: ``JUPYTER_RUNTIME_DIR``, or Jupyter's own
    default (``jupyter_core``, where installed, else ``~/.local/share/jupyter/runtime``), and ``extra``
    (the folder of a kernel's connection file: its server's runtime folder)."""
    found = [os.environ.get("JUPYTER_RUNTIME_DIR", "")]
    if not found[0]:
        try:
            from jupyter_core.paths import jupyter_runtime_dir

            found[0] = jupyter_runtime_dir()
        except ImportError:
            found[0] = str(Path.home() / ".local" / "share" / "jupyter" / "runtime")
    found += [os.fspath(e) for e in extra]
    return list(dict.fromkeys(Path(f).resolve() for f in found if f))


def running_servers(dirs: Iterable[Path]) -> list[Server]:
    """The servers listed in ``dirs`` whose process is alive and that answer over TCP (a server on a
    Unix socket, or a file left by one that crashed, is skipped)."""
    servers = []
    for folder in dirs:
        for path in sorted(folder.glob("jpserver-*.json")):
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
                alive = Path(f"/proc/{int(info['pid'])}").exists()
                url = str(info["url"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if alive and url.startswith("http") and not info.get("sock"):
                server = Server(url.rstrip("/") + "/", str(info.get("token") or ""), str(info.get("root_dir") or ""))
                servers.append(server)
    return list(dict.fromkeys(servers))


def kernel_notebooks(servers: Iterable[Server]) -> dict[str, tuple[Server, str]]:
    """Kernel id -> (its server, the path of the notebook it runs, as the server names it), over
    every server that answers ``/api/sessions``; the others are left out."""
    found: dict[str, tuple[Server, str]] = {}
    for server in servers:
        try:
            sessions = server.call("GET", "api/sessions")
        except (OSError, ValueError):
            continue
        for session in sessions if isinstance(sessions, list) else []:
            kernel = session.get("kernel") if isinstance(session, dict) else None
            if isinstance(kernel, dict) and kernel.get("id"):
                found.setdefault(str(kernel["id"]), (server, str(session.get("path") or session.get("name") or "")))
    return found


def shut_down_kernel(server: Server, kernel_id: str) -> bool:
    """Ask ``server`` to shut the kernel ``kernel_id`` down (what the notebook's Kernel > Shut Down
    Kernel does); whether it said it did."""
    try:
        server.call("DELETE", f"api/kernels/{urllib.parse.quote(kernel_id, safe='')}")
    except (OSError, ValueError):
        return False
    return True
