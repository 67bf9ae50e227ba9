"""Every notebook's code cells, top to bottom, each notebook in a fresh process: cells run, seconds.

    python benchmarks/notebooks.py [--only 00,05] [--timeout 900]

Each notebook runs in a fresh Python process through IPython's own shell (no Jupyter kernel, so
it runs where no socket can be opened, as on some accelerator runtimes), in the notebooks'
folder, until its last cell or its first error. A notebook ends as designed either after its
last cell or with the one sentence that says what the runtime lacks (``ExtraMissingError``:
notebook 10 without the ``[tunix]`` extra; ``ProcessesUnavailableError``: notebook 09 where no
worker process can start), raised where the stored notebook cannot be read to show instead.
Widgets are built without a front end. The seconds include the first cell's imports and the
opening of the devices.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import common

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
# The errors a notebook stops with on purpose, in one sentence, and what they say is missing.
ONE_SENTENCE = {"ExtraMissingError": "an extra missing", "ProcessesUnavailableError": "no worker processes"}

CHILD = r"""
import json, time
import nbformat
from IPython.core.interactiveshell import InteractiveShell

cells = [c.source for c in nbformat.read(ARGS["path"], as_version=4).cells if c.cell_type == "code"]
shell = InteractiveShell.instance()
ran, error, start = 0, None, time.perf_counter()
for source in cells:
    result = shell.run_cell(source, store_history=True)
    if not result.success:
        exc = result.error_in_exec or result.error_before_exec
        error = [type(exc).__name__, " ".join(str(exc).split())[:300]]
        break
    ran += 1
seconds = time.perf_counter() - start
import jax
device = jax.devices()[0]
print("@@RESULT@@ " + json.dumps({"cells": len(cells), "ran": ran, "seconds": seconds, "error": error,
                                  "platform": device.platform, "kind": getattr(device, "device_kind", None)}))
"""


def run(path: Path, timeout: float) -> dict[str, Any] | None:
    code = f"ARGS = {json.dumps({'path': str(path)})}\n" + CHILD
    proc = common.run_python_child(code, cwd=str(NOTEBOOKS), timeout=timeout)
    if proc["result"] is None:
        print(f"!!! {path.name}: no result (rc {proc['rc']}):\n{common.tail(proc['stderr'], 20)}", flush=True)
    return proc["result"]


def page_row(name: str, out: dict[str, Any]) -> dict[str, Any]:
    """docs/performance.md's row of one notebook (``common.page_row``)."""
    stopped = out["error"][0] if out["error"] else None
    ended = stopped is None or stopped in ONE_SENTENCE
    shown = f"{out['ran']} / {out['cells']} cells"
    if stopped in ONE_SENTENCE:
        shown += f", then its one sentence ({ONE_SENTENCE[stopped]})"
    elif stopped is not None:
        shown += f", stopped by {stopped}"
    return common.page_row(
        f"notebook.{name}",
        "notebooks",
        f"notebook {name}",
        common.machine(out["platform"], out["kind"]),
        common.run_value(out["seconds"], f"{shown}, {out['seconds']:.1f} s", ok=ended),
        {"ends": True, "shown": "runs to its end"},
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated notebook numbers (00,05); every notebook if empty")
    p.add_argument("--timeout", type=float, default=900, help="seconds a notebook may take")
    common.add_row_options(p)
    args = p.parse_args()
    wanted = [n for n in args.only.split(",") if n]
    paths = sorted(q for q in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not wanted or q.name[:2] in wanted)
    rows = []
    for path in paths:
        out = run(path, args.timeout)
        if out is None:
            continue
        print(f"{path.stem}: {out['ran']} / {out['cells']} cells, {out['seconds']:.1f} s, error {out['error']}")
        rows.append(page_row(path.stem, out))
    print()
    common.emit_rows(rows, args.save_row)
    return 0 if rows and all(r["runs"][0]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
