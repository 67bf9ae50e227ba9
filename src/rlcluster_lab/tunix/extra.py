"""The optional ``[tunix]`` extra: whether Tunix is installed, and the modules of it the lab
reads (imported only when a function needs them)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import types

from rlcluster_lab.rules.registry import REFERENCE

INSTALL_HINT = REFERENCE.install_hint


class TunixMissingError(ImportError):
    """Tunix is not installed in this environment; the message says how to install it."""


def available() -> bool:
    """True when the ``tunix`` package can be imported here (nothing is imported to find out)."""
    return importlib.util.find_spec("tunix") is not None


def installed_version() -> str | None:
    """The installed google-tunix version, or None when it is not installed."""
    try:
        return importlib.metadata.version(REFERENCE.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def require(what: str = "this") -> types.SimpleNamespace:
    """Tunix's ``rl.rl_cluster``, ``rl.rollout.base_rollout`` and ``rl.reshard`` as a namespace, or a
    ``TunixMissingError`` saying ``what`` needs Tunix."""
    if not available():
        raise TunixMissingError(f"{what} needs Tunix, which is not installed here: {INSTALL_HINT}")
    return types.SimpleNamespace(
        rl_cluster=importlib.import_module("tunix.rl.rl_cluster"),
        base_rollout=importlib.import_module("tunix.rl.rollout.base_rollout"),
        reshard=importlib.import_module("tunix.rl.reshard"),
    )


def version_note() -> str:
    """One line on the installed version against the pinned one."""
    version = installed_version()
    if version is None:
        return f"Tunix is not installed ({INSTALL_HINT})"
    if version != REFERENCE.version:
        return (
            f"google-tunix {version} is installed; the lab's rules follow {REFERENCE.version}, so observed "
            "decisions may differ for reasons of version"
        )
    return f"google-tunix {version}, the version the lab's rules follow"
