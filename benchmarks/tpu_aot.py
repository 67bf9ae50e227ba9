"""The programs of one GRPO learner step compiled for a TPU v5e chip on a machine without one:
each program's executable size (the chip's) and the seconds this machine's CPU spends in XLA:TPU,
beside the same programs written in plain JAX (``--floor``).

    python benchmarks/tpu_aot.py --libtpu DIR [--sizes small,large] [--layers 2,12] [--lora]
        [--precisions lab,default] [--repeats 3] [--floor path/to/floor.py] [--save-row PATH]

``DIR`` holds libtpu, installed apart from the project's environment (where JAX would try to
open a chip at every start): ``pip install --target DIR "libtpu==0.0.42.*"`` (the version
``jax[tpu]`` 0.10.2 asks for; ``rlcluster_lab.core.compile_only`` opens it, as ``plan --xla-check`` does).

For each size and depth, fresh processes:

1. on one simulated CPU device, the colocated cluster takes one ``GRPOLearner.step`` (4 prompts x
   4, programs built one after the other) and every program it compiles is kept as JAX lowered
   it (StableHLO) with its compile options;
2. with ``--floor``, the floor script ``benchmarks/first_step.py --floor`` takes (a file of the
   user's, not part of the repository: the step's programs written plainly in JAX at the
   platform's default precision, each compiled with ``jax.jit`` under its function's name, one
   line printed per program, ``SIZE scan|loop full|lora PROGRAM ...``) runs for the size, and
   its scanned programs are kept the same way;
3. with libtpu on the path, each is compiled for a v5e chip (``jax.experimental.topologies``:
   XLA:TPU's compile-only client, no chip needed) once in each of ``--repeats`` rounds, and the
   least seconds are shown (the first compiles in a process carry XLA:TPU's warm-up, and a busy
   moment of a shared machine holds one round, not every compile of a program). The lab's
   programs at the lab's matmul precisions (``lab``: the sampler and the log-probs at
   ``highest``, the train step at the platform's default, ``core.precision``) and, with
   ``--precisions``, with the products' ``highest`` written as another (``default``: one
   bfloat16 pass per float32 product); the floor's as written.

With ``--floor``, the lab's sampler, log-probs and train step (``--lora``: against the floor's
LoRA train step) are shown beside the floor's, with lab / floor, and the three added up, per
precision: the rows of docs/performance.md (``--save-row``).

Lowered for CPU, compiled for TPU: JAX lowers a few primitives per platform (a ``device_put``
between memory kinds among them), so a program could differ from the chip's own; these come out
the size of the chip's cache entries (2026-12-06, large preset: the train step 27.1 MB here, 27.4
MB on the chip; generate 7.4 and 7.6; log-probs 6.6 and 6.7; all three at ``highest`` then). The
seconds are this machine's CPU, not the chip host's: compare them with each other. The cold
first step on a chip is ``first_step.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import common
from first_step import FLOOR_LINE

REPO = Path(__file__).resolve().parents[1]
# The lab's programs of the step, by the names XLA gets, and the floor's program computing the same.
FLOOR_OF = {"jit__generate": "generate", "jit__logps": "logps", "jit_grpo_train_step": "train_step"}
STEP = "generate + log-probs + train step"
# Compiling nothing from a persistent cache: a program read back from one would not be kept.
ENV = {"JAX_PLATFORMS": "cpu", "JAX_ENABLE_COMPILATION_CACHE": "false"}

KEEP = r"""
import pickle
import jax
jax.config.update("jax_num_cpu_devices", 1)
from jax._src import compiler

kept = []
compile_and_load = compiler.backend_compile_and_load


def keep(backend, module, devices, options, callbacks):
    name = str(module.operation.attributes["sym_name"]).strip('"')
    kept.append((name, module.operation.get_asm(binary=True, enable_debug_info=False), options.SerializeAsString()))
    return compile_and_load(backend, module, devices, options, callbacks)


compiler.backend_compile_and_load = keep
"""

CAPTURE = (
    KEEP
    + r"""
import dataclasses
from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.core import model_config

preset = model_config.MODEL_SIZES[ARGS["size"]]
if ARGS["layers"]:  # the preset at another depth (this benchmark's own override)
    model_config.MODEL_SIZES[ARGS["size"]] = dataclasses.replace(preset, num_layers=ARGS["layers"])
cluster = build_cluster(Scenario(layout="colocated", model_size=ARGS["size"], lora=ARGS["lora"]))
learner = GRPOLearner(cluster, LearnerConfig(prompts_per_step=4, group_size=4))
learner.builds_ahead = False
learner.step()
with open(ARGS["out"], "wb") as f:
    pickle.dump(kept, f)
print(MARKER + json.dumps({"layers": model_config.MODEL_SIZES[ARGS["size"]].num_layers}))
"""
)

# The floor script as its user runs it, for one size; its printed lines name the programs, in the
# order it compiled them. The scanned ones the lab's are compared with are kept.
FLOOR = (
    KEEP
    + r"""
import contextlib, io, re, runpy, sys
sys.argv = [ARGS["floor"], ARGS["size"]]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    runpy.run_path(ARGS["floor"], run_name="__main__")
lines = list(re.finditer(ARGS["line"], printed.getvalue()))
names = ["jit_" + m["program"] for m in lines]
programs = [k for k in kept if k[0] in names]
if [k[0] for k in programs] != names:
    raise SystemExit(f"the floor compiled {[k[0] for k in programs]} where it printed {names}")
scanned = [(f"{m['train']} {m['program']}", *k[1:]) for m, k in zip(lines, programs) if m["how"] == "scan"]
scanned = [k for k in scanned if k[0] in ARGS["wanted"]]
with open(ARGS["out"], "wb") as f:
    pickle.dump(scanned, f)
print(MARKER + json.dumps({"programs": [name for name, *_ in scanned]}))
"""
)

COMPILE = r"""
import pickle, time
import jax
from jax._src.interpreters import mlir
from jax._src.lib import _jax, xla_client
from jax._src.lib.mlir import ir
from rlcluster_lab.core.compile_only import compile_only_devices

chip = compile_only_devices("v5e:1x1", (1, 1, 1), ARGS["libtpu"])[0]


def compiled(text, options):
    with mlir.make_ir_context():
        parsed = ir.Module.parse(text)
        t = time.perf_counter()
        executable = chip.client.compile(
            parsed, executable_devices=_jax.DeviceList((chip,)),
            compile_options=xla_client.CompileOptions.ParseFromString(options),
        )
        return time.perf_counter() - t, len(executable.serialize())


rows, jobs = [], {}
for source, path, precisions in ARGS["sets"]:
    for name, module, options in pickle.load(open(path, "rb")):
        with mlir.make_ir_context():
            text = ir.Module.parse(module).operation.get_asm(enable_debug_info=False)
        for precision in precisions:
            # Every product at "highest" written as another; a text compiled already is not again.
            written = text if precision == "lab" else text.replace("HIGHEST", precision.upper())
            job = jobs.setdefault((written, options), len(jobs))
            rows.append({"source": source, "program": name, "precision": precision, "job": job})
# Rounds, each compiling every program once: a busy moment of the machine holds one of a program's
# compiles, not all of them.
best = [(float("inf"), 0)] * len(jobs)
for _ in range(ARGS["repeats"]):
    for (written, options), job in jobs.items():
        best[job] = min(best[job], compiled(written, options))
for row in rows:
    row["compile_s"], row["bytes"] = best[row.pop("job")]
print(MARKER + json.dumps({"device": chip.device_kind, "rows": rows}))
"""


def child(code: str, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """``code`` in a fresh process with ``ARGS`` and ``MARKER`` set; the JSON object it printed."""
    head = f"import json\nARGS = json.loads({json.dumps(json.dumps(args))})\nMARKER = {common.RESULT_MARKER!r}\n"
    proc = common.run_python_child(head + code, env=env, timeout=3600)
    if proc["rc"] != 0 or proc["result"] is None:
        raise SystemExit(f"child failed (rc {proc['rc']}):\n{common.tail(proc['stderr'], 25)}")
    return proc["result"]


def floor_name(lab_program: str, lora: bool) -> str | None:
    """The floor's program (its ``train program`` words) computing what ``lab_program`` does."""
    program = FLOOR_OF.get(lab_program)
    if program is None:
        return None
    return f"{'lora' if lora and program == 'train_step' else 'full'} {program}"


def beside_floor(rows: list[dict[str, Any]], lora: bool) -> tuple[list[list[Any]], dict[str, dict[str, Any]]]:
    """The lab's rows of one size, each with the floor's matching program, its seconds and lab /
    floor; and per precision the step's three programs added up (``lab_s``, ``floor_s``, ``ratio``
    and each program's ``ratios``)."""
    floor = {r["program"]: r["compile_s"] for r in rows if r["source"] == "floor"}
    cells, steps = [], {}
    for r in rows:
        if r["source"] != "lab":
            continue
        name = floor_name(r["program"], lora)
        seconds = floor.get(name)
        ratio = r["compile_s"] / seconds if seconds else None
        cells.append([name or "-", "-" if seconds is None else seconds, "-" if ratio is None else ratio])
        if ratio is not None:
            step = steps.setdefault(r["precision"], {"lab_s": 0.0, "floor_s": 0.0, "ratios": {}})
            step["lab_s"] += r["compile_s"]
            step["floor_s"] += seconds
            step["ratios"][FLOOR_OF[r["program"]]] = ratio
    for step in steps.values():
        step["ratio"] = step["lab_s"] / step["floor_s"]
    return cells, steps


def page_row(size: str, precision: str, step: dict[str, Any], lora: bool) -> dict[str, Any]:
    """docs/performance.md's row of one size and precision: the step's lab / floor on this CPU."""
    how = ", LoRA" if lora else ""
    at = "as the lab compiles them" if precision == "lab" else f"`highest` written `{precision}`"
    ratios = ", ".join(f"{p.replace('_', ' ')} {r:.2f}x" for p, r in step["ratios"].items())
    return common.page_row(
        f"tpu_aot.step_over_floor.{size}.{precision}{how}",
        "first step",
        f"{size} preset{how}, XLA:TPU compile for a v5e chip on this CPU, {STEP}, lab / floor ({at})",
        common.machine("cpu"),
        common.run_value(
            step["ratio"], f"{step['ratio']:.2f}x: {step['lab_s']:.1f} s / {step['floor_s']:.1f} s ({ratios})"
        ),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libtpu", required=True, help="folder holding libtpu (pip install --target DIR libtpu)")
    p.add_argument("--sizes", default="small,large", help="comma-separated model sizes")
    p.add_argument("--layers", default="", help="comma-separated depths (empty: each preset's own)")
    p.add_argument("--lora", action="store_true", help="a LoRA actor")
    p.add_argument("--precisions", default="lab", help="lab (the cluster's own) and/or others: default, high")
    p.add_argument("--repeats", type=int, default=1, help="rounds compiling every program (the least seconds shown)")
    p.add_argument("--floor", default="", help="a plain-JAX floor script (first_step.py's) to compile beside")
    common.add_row_options(p)
    args = p.parse_args()
    if not (Path(args.libtpu) / "libtpu").is_dir():
        raise SystemExit(f"no libtpu in {args.libtpu}: pip install --target {args.libtpu} 'libtpu==0.0.42.*'")
    if args.floor and args.layers:
        raise SystemExit("--floor compares the presets at their own depths: give no --layers")
    env = {**ENV, "PYTHONPATH": str(REPO / "src")}
    depths = [int(x) for x in args.layers.split(",") if x] or [0]
    precisions = [x.strip().lower() for x in args.precisions.split(",") if x.strip()]
    table, page_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            for depth in depths:
                out = str(Path(tmp) / f"{size}-{depth}.pkl")
                captured = child(
                    CAPTURE,
                    {"size": size, "layers": depth, "lora": args.lora, "out": out},
                    {**env, "RLCLUSTER_LAB_WARM": "off"},
                )
                sets = [["lab", out, precisions]]
                if args.floor:
                    floor_out = str(Path(tmp) / f"{size}-floor.pkl")
                    wanted = [floor_name(name, args.lora) for name in FLOOR_OF]
                    floor = {"floor": str(Path(args.floor).resolve()), "size": size, "wanted": wanted}
                    child(FLOOR, {**floor, "line": FLOOR_LINE.pattern, "out": floor_out}, env)
                    sets.append(["floor", floor_out, ["default"]])
                compiled = child(COMPILE, {"sets": sets, "repeats": args.repeats, "libtpu": args.libtpu}, env)
                lab = [r for r in compiled["rows"] if r["source"] == "lab"]
                floor_cells, steps = beside_floor(compiled["rows"], args.lora)
                for r, cells in zip(lab, floor_cells, strict=True):
                    row = [size, captured["layers"], r["program"], r["precision"], r["compile_s"], r["bytes"] / 1e6]
                    table.append(row + (cells if args.floor else []))
                    print(" ".join(str(x) for x in table[-1]), file=sys.stderr, flush=True)
                for precision, step in steps.items():
                    ratio = [step["floor_s"], step["ratio"]]
                    table.append([size, captured["layers"], STEP, precision, step["lab_s"], "-", "step", *ratio])
                    page_rows.append(page_row(size, precision, step, args.lora))
    headers = ["size", "layers", "program", "matmul precision", "XLA:TPU compile s", "executable MB"]
    if args.floor:
        headers += ["floor program", "floor s", "lab / floor"]
    print(f"\nthe first learner step's programs, compiled for one {compiled['device']} chip on this machine's CPU")
    print(common.table(headers, table))
    common.emit_rows(page_rows, args.save_row)


if __name__ == "__main__":
    main()
