"""Writes docs/performance.md from the rows the benchmarks stored in docs/performance_rows.json.

    python benchmarks/page.py > docs/performance.md

A benchmark run with ``--save-row docs/performance_rows.json`` stores its rows there
(``common.emit_rows``); this script only lays them out, one table per area, with the words a
figure needs: why a target is missed (``REASONS``, one line per row that misses) and what an
area measures (``AREAS``). ``tests/test_performance_page.py`` holds the page to the stored rows.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROWS = Path(__file__).resolve().parents[1] / "docs" / "performance_rows.json"
CPU = "2-core CPU"
WIDTH = 100  # the prose's lines; a table row or a missed target's line is one line whatever its length
TPU = "one TPU v5e chip"

HEADER = """# Performance

What the lab costs, as its benchmarks measure it on two machines: a 2-core CPU with 8 simulated
devices (where the tests and the notebooks run) and one TPU v5e chip (15.7 GiB; its host has 13
cores). Each row is one figure as a benchmark printed it, with the date and the commit it
measured, its target where it has one, and the one command that measures it again; a figure
with several values is several runs of that command at that commit, and `a-b` the spread over
one run's repeats. Where a figure's record named no commit, the commit is the first that held it.

A benchmark run with `--save-row docs/performance_rows.json` stores its rows there, and
`python benchmarks/page.py > docs/performance.md` writes this page from them
(`tests/test_performance_page.py` holds the two equal). The CPU is shared with other work, so
its timings move with the load: read a ratio against its own run, and run a command again
before trusting a small difference. Earlier figures are in the history of these two files.
"""

# (area, title, what the rows measure); the page's sections, in order.
AREAS: list[tuple[str, str, str]] = [
    (
        "clicks",
        "Construction and clicks",
        "The tiny model on the CPU's 8 simulated devices. A cold figure is a fresh process with an empty "
        "compilation cache. The lab's clicks are made from Python on the lab as shipped (`PlacementLab`, "
        "its rehearsal of the next training step on), one right after the other unless the row says "
        "otherwise; the warm start (`python -m rlcluster_lab.lab.notebook.warm`, which the lab starts in the "
        "background) fills the cache beforehand where the row says so.",
    ),
    (
        "first step",
        "The first learner step",
        "On the CPU: the tiny model, colocated, with LoRA, in a fresh process with an empty cache, "
        "cold over the same step once compiled; and the step's programs compiled for a v5e chip by "
        "XLA:TPU on that CPU, over the floor's (below). On the chip: the colocated cluster on the chip, one "
        "`GRPOLearner.step` of 4 prompts x 4 and 16 sampled tokens, cold (empty cache), then in a "
        "second process on the cache the first filled, then warm steps.",
    ),
    (
        "sync",
        "A sync against one `device_put`",
        "The steady weight sync as the learner makes it (`sync_weights(peak=False)`) against the "
        "fastest reshard of the same tree: the faster of one `jax.device_put` to the rollout's "
        "shardings as new buffers and one compiled copy to them, neither under the sync's transfer "
        "guard. On the CPU: tiny and small, the three layouts, full and LoRA (12 cases). On the chip: "
        "the rollout on a second mesh over the same chip, base and large, full and LoRA, float32 and "
        "bfloat16 (8 cases).",
    ),
    (
        "memory",
        "Memory: the walk against the allocator",
        "The bytes the lab's walk of live buffers holds (every role, each buffer once, device and "
        "pinned host memory) beside the chip allocator's bytes in use (device memory only, every "
        "buffer of the process, in the blocks it rounds them to), tiny preset. Offloaded, the roles "
        "lie in pinned host memory, which the allocator does not count. A CPU reports no allocator "
        "figures.",
    ),
    (
        "notebooks",
        "The notebooks",
        "Each notebook's code cells top to bottom in a fresh process through IPython's own shell (no "
        "kernel). A notebook ends either after its last cell or, where the runtime cannot give what "
        "it needs (sockets for 09's processes, the `[tunix]` extra for 10) and the stored notebook "
        "cannot be read, with one sentence saying so. About 10 s of each on the chip is the first "
        "cell: importing JAX and opening the chip. On the CPU the notebooks run under nbval in "
        "`make test` (the suite's rows); no CPU row of their own is stored.",
    ),
    (
        "suite",
        "The test suite",
        "CI is `bash .ci/run`: a fresh `.venv`, then `make test` (lint, every test, the eleven "
        "notebooks under nbval, the real-browser tests). `make test-fast` is the loop for "
        "contributors: no cluster build, no subprocess, no notebook. The clones install with pip's "
        "download cache filled; a machine that never installed the lab downloads about 1 GB first.",
    ),
]

# Why a row misses its target, one line each, by (key, machine).
REASONS: dict[tuple[str, str], str] = {
    ("twelve_vs_tunix", CPU): "the lab compiles and analyses the six reshard programs its first syncs "
    "need (its report of what each sync moved comes from them), and the interpreter's collector walks "
    "the objects JAX leaves at import; Tunix's sync refuses 8 of the twelve under its transfer guard.",
    ("lab.step.empty", CPU): "clicked at once, the step waits for the rehearsal compiling it in the "
    "background; clicked once the rehearsal has finished, it meets the target (row below).",
    ("lab.step.warmed", CPU): "clicked at once, the step waits about 1 s for the rehearsal, which reads "
    "its programs back from the filled cache after tracing and lowering each to find its key; clicked "
    "once the rehearsal has finished, it meets the target (row below).",
    ("suite.fast", CPU): "measured while the shared CPU carried other work (load average 1.9 before "
    "one run, none of the lab's running); three runs took 58-69 s, where the same tier took 48 s at 3fee5c7.",
    ("step.learner", CPU): "in brackets, the step's CPU seconds spread over both cores, over the step "
    "once compiled: the work alone sits near 5x on two cores, and the interpreter's lock, held while JAX "
    "traces and lowers each program, keeps the cores from being busy throughout.",
    ("step.calls", CPU): "each call needs the result of the one before, so its program compiles after "
    "that call; the cluster builds no program it was not asked for (`build_ahead` asks: row below).",
    ("step.calls_ahead", CPU): "as through the learner: the work's own bound on two cores (in brackets) "
    "and the interpreter's lock.",
    ("first_step.cached.large", TPU): "a cache hit is JAX's own work: reading the executables back "
    "(the train step's 27 MB, about 1 s) and tracing and lowering every program to find its cache key.",
    ("first_step.learn.large", TPU): "opening the chip takes about 7 s of it, importing JAX and the lab "
    "and building the cluster about 5 s; the rest is the first step's compiling (the cold row above) "
    "and two warm steps.",
    ("sync.median", CPU): "under the transfer guard (P13) a sync may not gather through host memory "
    "as `device_put` does: the reshaped syncs run a compiled reshard, the split ones one `device_put` "
    "of every leaf plus the handover's host work.",
    ("sync.worst", CPU): "the split sync's crossing is the floor's own `device_put` of every leaf, "
    "plus the handover's host work.",
    ("sync.median", TPU): "the bfloat16 syncs cast on the way, against a compiled copy that casts "
    "nothing; against one `device_put` every case is below 1.0 (row below).",
}

# Words a figure needs after its area's table.
NOTES: dict[str, str] = {
    "first step": "On the chip the programs P11 compares (the sampler, the log-probs) run at `highest` "
    "and the optimizer step at the platform's default (`core.precision`). The cold first step was held "
    "against the same programs written in plain JAX (a scanned layer stack, at the platform's default "
    "precision), traced and compiled in the same call: large 12.6 s against 10.5 s (1.20x, target 1.2x: "
    "met at its edge), small 9.1 s against 4.5 s (2.0x: not met; the small sampler and log-prob "
    "programs compiled in 3.2 and 2.6 s against the floor's 1.3 and 0.6 s). The floor's script is not "
    "part of the repository, so the rows give the seconds alone. The CPU's `tpu_aot.py` rows compile, "
    "with XLA:TPU's compile-only client (no chip), the lab's sampler, log-probs and train step as its "
    "first step lowers them and the floor's scanned generate, log-probs and full train step (the script "
    "passed with `--floor`), each the least of 3 rounds: XLA's compile alone, no tracing, lowering or "
    "running; as the lab compiles them, and with the two `highest` programs written at the platform's "
    "default (which P11 cannot take: 9.8e-3 on the chip's large preset, `core.precision`); at the default "
    "the gap left is the train step's. These are "
    "this 2-core CPU's seconds for XLA:TPU's compiler, not a chip host's: only their ratios carry over to "
    "a chip's host, and the target is judged on the chip's own cold first step (its rows above).",
}


def load_rows(path: Path = ROWS) -> list[dict[str, Any]]:
    return json.loads(path.read_text(encoding="utf-8"))["rows"]


def verdict(run: dict[str, Any], target: dict[str, Any]) -> bool | None:
    """Whether one run meets ``target``: True, False, or None where its spread straddles it."""
    if "ends" in target:
        return bool(run["ok"])
    value = run["value"]
    low, high = (value, value) if isinstance(value, int | float) else value
    if high <= target["at_most"]:
        return True
    return False if low > target["at_most"] else None


def met(row: dict[str, Any]) -> str:
    """``yes``, ``no``, ``in k of n runs`` or ``partly`` (a spread across the target); ``-``: no target."""
    if row["target"] is None:
        return "-"
    verdicts = [verdict(run, row["target"]) for run in row["runs"]]
    if all(v is True for v in verdicts):
        return "yes"
    if all(v is False for v in verdicts):
        return "no"
    if len(verdicts) == 1:
        return "partly"
    return f"in {sum(v is True for v in verdicts)} of {len(verdicts)} runs"


def measured(row: dict[str, Any]) -> str:
    return ", ".join(run["shown"] for run in row["runs"])


def cells(row: dict[str, Any]) -> list[str]:
    """The table's cells of ``row``: figure, measured, machine, date, commit, target, met, command."""
    target = "-" if row["target"] is None else row["target"]["shown"]
    return [
        row["figure"],
        measured(row),
        row["machine"],
        row["date"],
        row["commit"],
        target,
        met(row),
        f"`{row['command']}`",
    ]


def table_line(row: dict[str, Any]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |"


def missed(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if met(r) not in ("yes", "-")]


def render(rows: Sequence[dict[str, Any]]) -> str:
    out = [HEADER]
    known = {a for a, _, _ in AREAS}
    stray = sorted({r["area"] for r in rows} - known)
    if stray:
        raise ValueError(f"rows of no area on the page: {stray}")
    for area, title, words in AREAS:
        mine = [r for r in rows if r["area"] == area]
        out += [f"## {title}", "", textwrap.fill(words, WIDTH), ""]
        if mine:
            out += ["| figure | measured | machine | date | commit | target | met | command |"]
            out += ["|---|---|---|---|---|---|---|---|"]
            # The CPU's rows first, then the chip's, each in the order stored.
            out += [table_line(r) for r in sorted(mine, key=lambda r: r["machine"] != CPU)]
            out += [""]
        gone = missed(mine)
        if gone:
            out += ["Missed:", ""]
            for r in gone:
                out += [f"- {r['figure']} ({r['machine']}): {measured(r)} against {r['target']['shown']}: {reason(r)}"]
            out += [""]
        if area in NOTES:
            out += [textwrap.fill(NOTES[area], WIDTH), ""]
    return "\n".join(out).rstrip() + "\n"


def reason(row: dict[str, Any]) -> str:
    try:
        return REASONS[(row["key"], row["machine"])]
    except KeyError:
        raise KeyError(f"no reason given for the missed row {row['key']!r} on {row['machine']}") from None


def main() -> int:
    sys.stdout.write(render(load_rows(Path(sys.argv[1]) if len(sys.argv) > 1 else ROWS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
