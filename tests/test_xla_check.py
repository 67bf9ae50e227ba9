"""L4: a plan checked by XLA's own compiler (``plan --xla-check``), on the 8 simulated CPU devices:
the step's programs lowered from shapes and compiled for the plan's devices, XLA's bytes beside
the planner's. On a TPU topology the same code compiles with XLA:TPU's compile-only client
(libtpu, never installed here: its refusal is tested)."""

from __future__ import annotations

import contextlib
import io
import json

import jax
import pytest

from rlcluster_lab.cli.main import main
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.trace import Trace
from rlcluster_lab.model.fits import xla_figures
from rlcluster_lab.model.memory import ProgramBytes
from rlcluster_lab.planner.plan import plan_cluster
from rlcluster_lab.planner.tables import TOPOLOGIES
from rlcluster_lab.planner.xla_check import ProgramCheck, check_devices, check_plan, summary

PROGRAMS = [("generate", "rollout"), ("log-probs", "actor"), ("log-probs", "reference"), ("train step", "actor")]


@pytest.fixture(scope="module")
def checked() -> tuple[object, dict]:
    plan = plan_cluster("tiny", "local", layout="split", lora_rank=4)
    return plan, check_plan(plan, check_devices(plan.request.topology))


def test_l4_every_program_of_a_step_is_compiled_for_the_plans_devices(checked) -> None:
    plan, check = checked
    assert [(p["program"], p["role"]) for p in check["programs"]] == PROGRAMS
    meshes = plan.role_to_mesh
    for p in check["programs"]:
        assert p["refused"] is None and p["xla_bytes"] > 0
        # The busiest device of the program's own mesh: the rollout's devices for generate.
        assert p["device"] in meshes[p["role"]]["device_ids"]


def test_l4_xla_reads_the_arguments_the_plan_places(checked) -> None:
    """The programs are lowered over the plan's shardings: every argument XLA counts on the
    device is a shard the planner counts (the state's, the optimizer's) or the batch."""
    _, check = checked
    for p in check["programs"]:
        assert p["xla"]["argument"] == p["planned"]["arguments"], p["program"]
        assert p["xla"]["output"] >= p["planned"]["outputs"] > 0, p["program"]


def test_l4_xla_check_figures_are_compiled_memory_analysis(checked) -> None:
    _, check = checked
    for p in check["programs"]:
        x = p["xla"]
        assert p["xla_bytes"] == x["argument"] + x["output"] + x["temp"] - x["alias"]
        assert p["planned_bytes"] == p["planned"]["total"]


def test_l4_the_anchors_and_the_references_log_probs_compile_once_when_alike() -> None:
    plan = plan_cluster("tiny", "local", layout="colocated")
    check = check_plan(plan, check_devices(plan.request.topology))
    logps = [p for p in check["programs"] if p["program"] == "log-probs"]
    assert len(logps) == 2 and logps[0]["xla"] == logps[1]["xla"]


def _check(planned: int, xla: int | None, refused: str | None = None, others: int = 0) -> ProgramCheck:
    figure = ProgramBytes("train step", planned, 0, {})
    terms = {} if refused else {"argument": xla, "output": 0, "temp": 0, "alias": 0}
    return ProgramCheck("train step", "actor", 0, figure, terms, xla, refused, others, 0.0)


def test_l4_each_side_fits_when_every_program_and_what_else_its_device_keeps_fit() -> None:
    assert summary([_check(60, 70, others=30)], 100)["fits"] == {"planner": True, "xla": True}
    assert summary([_check(60, 80, others=30)], 100)["fits"] == {"planner": True, "xla": False}
    assert summary([_check(80, 60, others=30)], 100)["fits"] == {"planner": False, "xla": True}
    refused = _check(60, 200, "RESOURCE_EXHAUSTED: Ran out of memory")
    assert summary([refused], 100)["fits"] == {"planner": True, "xla": False}
    assert summary([_check(60, 70)], None)["fits"] == {"planner": None, "xla": None}
    assert summary([refused], None)["fits"] == {"planner": None, "xla": False}


def test_l4_a_refusal_for_memory_names_its_bytes() -> None:
    text = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (18.71G) "
        "exceeds available HBM (15.75G)."
    )
    assert xla_figures(text) == (int(18.71 * 2**30), int(15.75 * 2**30))
    assert xla_figures("RESOURCE_EXHAUSTED: (512.5M) exceeds available HBM (1G)") == (int(512.5 * 2**20), 2**30)
    assert xla_figures("INVALID_ARGUMENT: (18.71G) exceeds available HBM (15.75G)") is None


def test_l4_a_tpu_topology_without_libtpu_is_refused_with_how_to_install_it(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"no libtpu in .*pip install --target DIR 'libtpu"):
        check_devices(TOPOLOGIES["tpu-v5e-8"], str(tmp_path))
    with pytest.raises(ValueError, match="gpu-8 is neither"):
        check_devices(TOPOLOGIES["gpu-8"])


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_l4_cli_plan_xla_check_json_and_text() -> None:
    argv = ["plan", "--topology", "local", "--layout", "split", "--lora", "--xla-check"]
    rc, out, _ = _run([*argv, "--json"])
    assert rc == 0
    check = json.loads(out)["xla_check"]
    assert set(check["fits"]) == {"planner", "xla"}
    for p in check["programs"]:
        assert {"program", "role", "planned_bytes", "xla_bytes"} <= set(p)
    rc, text, _ = _run(argv)
    assert rc == 0 and "XLA's check: the step's programs compiled for local" in text
    assert sum(line.startswith("  log-probs ") for line in text.splitlines()) == 2


def test_l4_cli_libtpu_without_xla_check_is_refused() -> None:
    rc, _, err = _run(["plan", "--libtpu", "/nowhere"])
    assert rc == 2 and "--libtpu names the folder --xla-check compiles with" in err


def test_l4_the_check_allocates_nothing(checked) -> None:
    """Lowered from jax.ShapeDtypeStructs: the check adds no array to the devices."""
    before = len(jax.live_arrays())
    plan = plan_cluster("tiny", "local", layout="reshaped")
    check_plan(plan, check_devices(plan.request.topology))
    assert len(jax.live_arrays()) == before


def test_l4_the_syncs_reshard_programs_are_compiled_where_its_route_has_any(checked) -> None:
    _, split = checked  # whole shards move between the split layout's meshes: no program
    assert split["sync"]["compiles_programs"] is False
    assert split["sync"]["xla_peak_bytes"] == split["sync"]["planned_peak_bytes"]
    plan = plan_cluster("tiny", "local", layout="reshaped")
    sync = check_plan(plan, check_devices(plan.request.topology))["sync"]
    # The reshaped layout's rollout mesh is another over the same devices: one compiled program,
    # whose temporaries come on top of the arrays on paper.
    assert sync["compiles_programs"] and sync["xla_peak_bytes"] > sync["planned_peak_bytes"]


def test_l4_the_stored_tpu_check_notebook_08_shows_holds_the_planners_figures_now() -> None:
    """Notebook 08 shows a check run with libtpu and stored with the lab: the planner's side of it
    is what the planner gives now (a change to ``model.memory`` asks for the check to be run again)."""
    from rlcluster_lab.lab.experiments import what_if
    from rlcluster_lab.planner.buffers import Buffers
    from rlcluster_lab.planner.plan import _construct
    from rlcluster_lab.planner.xla_check import step_programs

    run = json.loads(what_if.STORED_CHECK.read_text(encoding="utf-8"))
    stored = run["xla_check"]
    req = plan_cluster(**what_if.CHECKED).request
    programs = step_programs(req, _construct(req, Buffers(req.reshard), Trace()))
    assert [(p["program"], p["role"]) for p in stored["programs"]] == PROGRAMS
    # The planner asks the running JAX what its backward pass keeps (model.memory.softmax_residuals):
    # under the JAX the check ran with, its figures are the stored ones; under another, they still
    # agree with the stored XLA figures as the notebook says.
    same_jax = f"JAX {jax.__version__}," in run["versions"]
    for sp, p in zip(programs, stored["programs"]):
        now = sp.planned(p["device"]).total
        assert now == p["planned_bytes"] or not same_jax, p["program"]
        assert abs(now / p["xla_bytes"] - 1) <= stored["agree_within"], p["program"]
        assert abs(p["planned_bytes"] / p["xla_bytes"] - 1) <= stored["agree_within"]
    assert stored["fits"] == {"planner": True, "xla": True}
