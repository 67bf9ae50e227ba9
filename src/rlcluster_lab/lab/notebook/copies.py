"""The working copies ``make lab`` serves: running and saving a notebook leaves ``notebooks/`` as committed.

JupyterLab serves ``.lab/notebooks`` (ignored by git), which holds a copy of each tracked
notebook, its Markdown twin and ``jupytext.toml``. Before each start, ``sync_copies`` copies
what is missing there and refreshes a copy whose tracked notebook changed since it was copied
(a pull). A copy changed meanwhile (run and saved, edited) is never overwritten: it is renamed
``NAME.backup-N.ipynb`` (and ``.md``) beside the new copy, and said so. A copy whose tracked
notebook did not change stays as the user left it; deleting it brings the committed one back.

    python -m rlcluster_lab.lab.notebook.copies notebooks .lab/notebooks
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

PATTERNS = ("*.ipynb", "*.md", "jupytext.toml")  # a notebook, its twin (one stem), the pairing
RECORD = ".copied.json"  # file name -> digest of the tracked file its copy was made from


def sync_copies(tracked: Path, work: Path) -> list[str]:
    """Bring the working copies in ``work`` up to date with the tracked files in ``tracked``.

    Returns:
        One line per kind of change made (copied, refreshed, kept as a backup); none when
        nothing changed.
    """
    work.mkdir(parents=True, exist_ok=True)
    try:
        record = json.loads((work / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    units: dict[str, list[str]] = {}
    for pattern in PATTERNS:
        for path in sorted(tracked.glob(pattern)):
            units.setdefault(path.stem, []).append(path.name)
    copied, refreshed, kept = [], [], []
    for stem, names in sorted(units.items()):
        new = {name: _digest(tracked / name) for name in names}
        now = {name: _digest(work / name) for name in names}
        if now == new:  # the copy is the tracked version
            pass
        elif not any(now.values()):
            copied.append(stem)
        elif all(new[name] == record.get(name) for name in names):
            continue  # the tracked files did not change since the copy: it is the user's as left
        elif all(now[name] in (None, record.get(name)) for name in names):
            refreshed.append(stem)
        else:
            kept.extend(_back_up(work, stem, [name for name in names if now[name]]))
            now = dict.fromkeys(names)
        for name in names:  # the notebook before its twin: jupytext reads a twin older than it as outdated
            if now[name] != new[name]:
                shutil.copyfile(tracked / name, work / name)
        record.update(new)
    (work / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    said = (
        (f"copied from {tracked}", copied),
        (f"refreshed from {tracked} (changed there since copied)", refreshed),
        (f"changed in {tracked} and here too, so your copies are kept as", kept),
    )
    return [f"{what}: {', '.join(names)}" for what, names in said if names]


def _back_up(work: Path, stem: str, names: list[str]) -> list[str]:
    """Rename the working copy's files ``stem.backup-N.*``, N the first number free for all of them."""
    n = 1
    while any((work / f"{stem}.backup-{n}{Path(name).suffix}").exists() for name in names):
        n += 1
    backups = []
    for name in names:
        backup = work / f"{stem}.backup-{n}{Path(name).suffix}"
        os.replace(work / name, backup)
        backups.append(str(backup))
    return backups


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlcluster_lab.lab.notebook.copies", description=__doc__.splitlines()[0]
    )
    parser.add_argument("tracked", type=Path, help="the tracked notebooks (notebooks/)")
    parser.add_argument("work", type=Path, help="the working copies JupyterLab serves (.lab/notebooks)")
    args = parser.parse_args(argv)
    print(
        f"JupyterLab serves working copies of {args.tracked}/ in {args.work}/: using them leaves {args.tracked}/ as is."
    )
    for line in sync_copies(args.tracked, args.work):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
