"""The programs of one GRPO learner step compiled for a TPU v5e chip on a machine without one:
each program's executable size (the chip's) and the seconds this machine's CPU spends in XLA:TPU.

    python benchmarks/tpu_aot.py --libtpu DIR [--sizes small,large] [--layers 2,12] [--lora]
        [--precisions highest,default]

``DIR`` holds libtpu, installed apart from the project's environment (where JAX would try to
open a chip at every start): ``pip install --target DIR "libtpu==0.0.42.*"`` (the version
``jax[tpu]`` 0.10.2 asks for; ``rlcluster_lab.core.compile_only`` opens it, as ``plan --xla-check`` does).

For each size and depth, two fresh processes:

1. on one simulated CPU device, the colocated cluster takes one ``GRPOLearner.step`` (4 prompts x
   4, programs built one after the other) and every program it compiles is kept as JAX lowered
   it (StableHLO) with its compile options;
2. with libtpu on the path, each is compiled for a v5e chip (``jax.experimental.topologies``:
   XLA:TPU's compile-only client, no chip needed), at the lab's matmul precision and, with
   ``--precisions``, with the products' precision written as another (``default``: one bfloat16
   pass per float32 product).

Lowered for CPU, compiled for TPU: JAX lowers a few primitives per platform (a ``device_put``
between memory kinds among them), so a program could differ from the chip's own; these come out
the size of the chip's cache entries (2026-12-06, large preset: the train step 27.1 MB here, 27.4
MB on the chip; generate 7.4 and 7.6; log-probs 6.6 and 6.7). The
seconds are this machine's CPU, not the chip host's (the large train step: 32 s here, 12-15 s
there): compare them with each other.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import common

REPO = Path(__file__).resolve().parents[1]

CAPTURE = r"""
import dataclasses, pickle
import jax
jax.config.update("jax_num_cpu_devices", 1)
from jax._src import compiler
from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
from rlcluster_lab.core import model_config

kept = []
compile_and_load = compiler.backend_compile_and_load


def keep(backend, module, devices, options, callbacks):
    name = str(module.operation.attributes["sym_name"]).strip('"')
    kept.append((name, module.operation.get_asm(binary=True, enable_debug_info=False), options.SerializeAsString()))
    return compile_and_load(backend, module, devices, options, callbacks)


compiler.backend_compile_and_load = keep
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

COMPILE = r"""
import pickle, time
import jax
from jax._src.interpreters import mlir
from jax._src.lib import _jax, xla_client
from jax._src.lib.mlir import ir
from rlcluster_lab.core.compile_only import compile_only_devices

chip = compile_only_devices("v5e:1x1", (1, 1, 1), ARGS["libtpu"])[0]
rows = []
for name, module, options in pickle.load(open(ARGS["programs"], "rb")):
    for precision in ARGS["precisions"]:
        with mlir.make_ir_context():
            parsed = ir.Module.parse(module)
            if precision != "lab":  # every product's precision written as another
                text = parsed.operation.get_asm(enable_debug_info=False)
                parsed = ir.Module.parse(text.replace("HIGHEST", precision.upper()))
            t = time.perf_counter()
            executable = chip.client.compile(
                parsed, executable_devices=_jax.DeviceList((chip,)),
                compile_options=xla_client.CompileOptions.ParseFromString(options),
            )
            seconds = time.perf_counter() - t
        rows.append({"program": name, "precision": precision, "compile_s": seconds,
                     "bytes": len(executable.serialize())})
print(MARKER + json.dumps({"device": chip.device_kind, "rows": rows}))
"""


def child(code: str, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """``code`` in a fresh process with ``ARGS`` and ``MARKER`` set; the JSON object it printed."""
    head = f"import json\nARGS = json.loads({json.dumps(json.dumps(args))})\nMARKER = {common.RESULT_MARKER!r}\n"
    proc = common.run_python_child(head + code, env=env, timeout=3600)
    if proc["rc"] != 0 or proc["result"] is None:
        raise SystemExit(f"child failed (rc {proc['rc']}):\n{common.tail(proc['stderr'], 25)}")
    return proc["result"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libtpu", required=True, help="folder holding libtpu (pip install --target DIR libtpu)")
    p.add_argument("--sizes", default="small,large", help="comma-separated model sizes")
    p.add_argument("--layers", default="", help="comma-separated depths (empty: each preset's own)")
    p.add_argument("--lora", action="store_true", help="a LoRA actor")
    p.add_argument("--precisions", default="lab", help="lab (the cluster's, highest) and/or others: default, high")
    args = p.parse_args()
    if not (Path(args.libtpu) / "libtpu").is_dir():
        raise SystemExit(f"no libtpu in {args.libtpu}: pip install --target {args.libtpu} 'libtpu==0.0.42.*'")
    src = str(REPO / "src")
    depths = [int(x) for x in args.layers.split(",") if x] or [0]
    precisions = [x.strip().lower() for x in args.precisions.split(",") if x.strip()]
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            for depth in depths:
                out = str(Path(tmp) / f"{size}-{depth}.pkl")
                captured = child(
                    CAPTURE,
                    {"size": size, "layers": depth, "lora": args.lora, "out": out},
                    {"PYTHONPATH": src, "JAX_PLATFORMS": "cpu", "RLCLUSTER_LAB_WARM": "off"},
                )
                compiled = child(
                    COMPILE,
                    {"programs": out, "precisions": precisions, "libtpu": args.libtpu},
                    {"PYTHONPATH": src, "JAX_PLATFORMS": "cpu"},
                )
                for r in compiled["rows"]:
                    table.append(
                        [size, captured["layers"], r["program"], r["precision"], r["compile_s"], r["bytes"] / 1e6]
                    )
                    print(" ".join(str(x) for x in table[-1]), file=sys.stderr, flush=True)
    print(f"\nthe first learner step's programs, compiled for one {compiled['device']} chip on this machine's CPU")
    print(common.table(["size", "layers", "program", "matmul precision", "XLA:TPU compile s", "executable MB"], table))


if __name__ == "__main__":
    main()
