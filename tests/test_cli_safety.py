"""The CLI's manners and validate-before-allocate for sizes.

Every bad value ends in one line on stderr and exit 2, before anything large is
allocated; a closed stdout ends quietly (141); Ctrl-C ends with one line (130).
Memory refusals are tested under a small ``RLCLUSTER_LAB_MEMORY_LIMIT``, so no
test allocates much.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import signal
import subprocess
import sys

import pytest

import rlcluster_lab.app.scenario as scenario_module
from rlcluster_lab.app.learner import GRPOLearner, StepRecord
from rlcluster_lab.app.scenario import check_memory, rollout_bytes, validate
from rlcluster_lab.cli.main import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OUTPUT_FAILED, main
from rlcluster_lab.core.config import TrainingConfig
from rlcluster_lab.core.devices import MAX_SIMULATED_DEVICES, ensure_simulated_devices
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import describe
from rlcluster_lab.core.limits import LIMIT_ENV, TooLargeError
from rlcluster_lab.core.options import RolloutConfig, Scenario
from rlcluster_lab.model import get_model_config
from rlcluster_lab.planner.plan import plan_cluster
from rlcluster_lab.rules.validation import check_scenario

TINY = get_model_config("tiny")


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # main returns its code; an escape would be a defect
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_line_refusal(rc: int, out: str, err: str, fragment: str) -> None:
    assert rc == 2, (rc, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    assert fragment in err, err


# --- LoRA rank: bounded by the model's dimensions ----------------------------------------


def test_max_lora_rank_is_the_widest_adapted_projections_smaller_side():
    # tiny: q, o (64 x 64), k, v (64 x 32), gate, up (64 x 128), down (128 x 64).
    assert TINY.lora_shapes()["k"] == (64, 32)
    assert TINY.max_lora_rank == 64
    assert get_model_config("large").max_lora_rank == 512


def test_scenario_check_refuses_a_lora_rank_above_the_models_bound():
    check_scenario(Scenario(lora=True, lora_rank=64))
    with pytest.raises(ConfigError, match=r"between 1 and 64 for the tiny model, got 65"):
        check_scenario(Scenario(lora=True, lora_rank=65))
    # The large model's bound is its own.
    check_scenario(Scenario(lora=True, lora_rank=512, model_size="large"))
    with pytest.raises(ConfigError, match=r"between 1 and 512 for the large model"):
        check_scenario(Scenario(lora=True, lora_rank=513, model_size="large"))


def test_build_cluster_refuses_the_rank_before_building(monkeypatch):
    def no_build(*_args, **_kwargs):
        raise AssertionError("models were built for a rank the model cannot use")

    monkeypatch.setattr(scenario_module, "build_models", no_build)
    with pytest.raises(ConfigError, match="--lora-rank"):
        scenario_module.build_cluster(Scenario(lora=True, lora_rank=1000))


def test_planner_checks_the_rank_against_the_planned_model():
    with pytest.raises(ConfigError, match="between 1 and 64 for the tiny model"):
        plan_cluster("tiny", lora_rank=65)
    # A published architecture's own bound (llama3-8b: its 4096-wide projections).
    with pytest.raises(ConfigError, match="between 1 and 4096 for the llama3-8b model"):
        plan_cluster("llama3-8b", "gpu-8", lora_rank=4097)


# --- memory: the planner's estimate, checked before anything is built -----------------------


def test_check_memory_uses_the_plan_and_refuses_before_allocating(monkeypatch):
    scenario = Scenario()
    config = validate(scenario)  # nothing allocated
    # 20 MB: above what the tiny cluster needs (about 2.6 MB) but below the quick bound, so
    # the planner's estimate decides.
    monkeypatch.setenv(LIMIT_ENV, str(20 * 10**6))
    check_memory(scenario, config)
    monkeypatch.setenv(LIMIT_ENV, str(10**6))
    with pytest.raises(TooLargeError, match=r"building this scenario \(the tiny model.*estimated from shapes"):
        check_memory(scenario, config)


def test_build_cluster_refuses_a_scenario_over_the_limit_without_building(monkeypatch):
    def no_build(*_args, **_kwargs):
        raise AssertionError("models were built past the memory limit")

    monkeypatch.setattr(scenario_module, "build_models", no_build)
    monkeypatch.setenv(LIMIT_ENV, str(10**6))
    with pytest.raises(TooLargeError, match="a smaller model_size") as err:
        scenario_module.build_cluster(Scenario(with_reward=True, with_critic=True))
    # The CLI names its flags for the same refusal, the lab its widgets.
    flags = "The flag to change: --model-size (or --reward, --critic, --lora, --devices)."
    assert describe(err.value, "cli").endswith(flags)
    assert "model_size" not in describe(err.value, "lab")


def test_cli_report_over_the_memory_limit_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, str(10**6))
    assert_one_line_refusal(*run(capsys, ["report", "--json"]), "estimated from shapes")


def test_learner_batch_is_checked_before_the_backend_is_used(capsys, monkeypatch):
    # 400 completions of the tiny model need about 80 MB of KV cache and logits.
    assert rollout_bytes(Scenario(), 400) > 10**7
    monkeypatch.setenv(LIMIT_ENV, str(10**7))
    rc, out, err = run(capsys, ["learn", "--steps", "1", "--prompts-per-step", "100", "--group-size", "4"])
    assert_one_line_refusal(rc, out, err, "lower --prompts-per-step or --group-size")
    assert "400 completions" in err


# --- device counts -------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, -3, 200_000, 123456789012345678901])
def test_device_count_out_of_range_is_refused_before_jax_sees_it(count):
    with pytest.raises(ConfigError, match=f"between 1 and {MAX_SIMULATED_DEVICES}"):
        ensure_simulated_devices(count)


def test_device_count_of_the_wrong_type_names_the_argument():
    with pytest.raises(TypeError, match="count must be an int"):
        ensure_simulated_devices(True)


@pytest.mark.parametrize("value", ["0", "200000", "123456789012345678901"])
def test_cli_devices_out_of_range_is_one_line(capsys, value):
    assert_one_line_refusal(*run(capsys, ["report", "--devices", value]), "--devices must be between 1 and 4096")


def test_cli_devices_after_the_backend_started_says_how_to_get_more(capsys):
    # conftest started the backend with 8 devices: 16 cannot be had any more in this process.
    assert_one_line_refusal(*run(capsys, ["report", "--devices", "16"]), "jax_num_cpu_devices")


# --- every bad flag value: one line, exit 2 ---------------------------------------------------


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["report", "--lora-rank", "0"], "--lora-rank must be at least 1"),
        (["report", "--lora-rank", "-2", "--lora"], "--lora-rank must be at least 1"),
        (["report", "--lora-rank", "1000000"], "between 1 and 64"),  # checked with or without --lora
        (["report", "--lora", "--lora-rank", "65"], "between 1 and 64 for the tiny model"),
        (["report", "--lora-rank", "four"], "invalid int value"),
        (["report", "--devices", "abc"], "invalid int value"),
        (["report", "--engine", "trt"], "invalid choice"),
        (["learn", "--steps", "1", "--learning-rate", "nan"], "--learning-rate must be a finite number > 0"),
        (["learn", "--steps", "1", "--learning-rate", "inf"], "--learning-rate must be a finite number > 0"),
        (["learn", "--steps", "1", "--learning-rate", "-1"], "--learning-rate must be a finite number > 0"),
        (["learn", "--steps", "1", "--max-tokens", "200"], "--max-tokens must be below KV cache slots per row, 128,"),
        (["learn", "--steps", "1", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["learn", "--steps", "1", "--lora", "--lora-rank", "65"], "between 1 and 64"),
        (["learn", "--steps", "-1"], "--steps must be >= 0"),
        (["learn", "--group-size", "1"], "--prompts-per-step must be >= 1 and --group-size >= 2"),
        (["learn", "--mini-batch-size", "0"], "--mini-batch-size must be >= 1"),
        (["learn", "--iterations", "0"], "--iterations must be >= 1"),
        (["plan", "--vllm-tp", "0"], "--vllm-tp must be an int >= 1"),
        (["plan", "--engine", "vllm", "--vllm-tp", "3"], "does not divide the 8 rollout devices"),
        (["plan", "--memory-per-device", "1e400"], "--memory-per-device must be a positive, finite number"),
        (["plan", "--memory-per-device", "0"], "--memory-per-device must be a positive, finite number"),
        (["plan", "--bandwidth", "fast"], "--bandwidth: cannot read 'fast' as bytes"),
        (["plan", "--lora", "--lora-rank", "65"], "between 1 and 64 for the tiny model"),
        (["plan", "--model", "llama3-8b", "--lora", "--lora-rank", "5000"], "between 1 and 4096 for the llama3-8b"),
        (["plan", "--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["plan", "--devices", "0"], "--devices must be between 1 and 4096"),
        # A mesh the model cannot be split over: the flags that set it (the vllm engine's own mesh, P7).
        (
            ["plan", "--topology", "gpu-2x8", "--engine", "vllm"],
            "which does not divide it. The flag to change: --vllm-tp (or --engine, --topology).",
        ),
        # A named topology has its own devices: --devices would be ignored, so it is refused.
        (
            ["plan", "--topology", "gpu-8", "--devices", "6"],
            "--devices 6 sets the simulated devices that --topology local plans on; topology gpu-8 has devices "
            "of its own. The flag to change: --devices (or --topology).",
        ),
    ],
)
def test_bad_flag_values_are_one_line_exit_2(capsys, argv, fragment):
    rc, out, err = run(capsys, argv)
    assert_one_line_refusal(rc, out, err, fragment)
    # docs/guarantees.md: naming the flag to change, never a Python field.
    assert [f for f in PYTHON_FIELDS if re.search(rf"\b{f}\b", err)] == [], err


def _python_fields() -> frozenset[str]:
    """The fields of the lab's configurations and of every knob that a refusal could name: those
    whose name is not also a word (``group_size``, ``kv_cache_size``), and the classes' names."""
    from rlcluster_lab.app.learner import LearnerConfig
    from rlcluster_lab.core.config import ClusterConfig
    from rlcluster_lab.core.knobs import KNOBS
    from rlcluster_lab.planner import Workload

    classes = (Scenario, LearnerConfig, TrainingConfig, RolloutConfig, ClusterConfig, Workload)
    fields = {f.name for c in classes for f in dataclasses.fields(c)} | set(KNOBS)
    return frozenset({f for f in fields if "_" in f} | {c.__name__ for c in classes})


PYTHON_FIELDS = _python_fields()


def test_plan_of_a_published_model_with_lora_runs(capsys):
    # The scenario flags are shared: plan replaces a published model by a lab size for the
    # knob checks, and checks the rank against the published model itself.
    rc, out, err = run(capsys, ["plan", "--model", "llama3-8b", "--topology", "gpu-8", "--lora", "--lora-rank", "128"])
    assert rc == 0, err
    assert "LoRA rank 128" in out


def test_config_values_are_checked_where_the_config_is_made():
    for rate in (math.nan, math.inf, 0.0, -1e-3):
        with pytest.raises(ConfigError, match="learning_rate"):
            TrainingConfig(learning_rate=rate)
    with pytest.raises(ConfigError, match="--vllm-tp"):
        RolloutConfig(rollout_vllm_tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="kv_cache_size"):
        Scenario(max_tokens=128)


# --- Ctrl-C and a closed stdout --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, target",
    [
        (["plan"], "rlcluster_lab.planner.plan.plan_cluster"),
        (["report"], "rlcluster_lab.app.scenario.build_cluster"),
    ],
)
def test_keyboard_interrupt_is_one_line_exit_130(capsys, monkeypatch, argv, target):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(target, interrupted)
    rc, out, err = run(capsys, argv)
    assert rc == EXIT_INTERRUPTED == 130
    assert out == "" and err == "error: interrupted\n"


class _ClosedPipe(io.TextIOBase):
    """A stdout whose reader went away: every write fails as a pipe's does."""

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.cluster
def test_learn_into_a_closed_stdout_ends_quietly(capsys, monkeypatch):
    # The progress lines are written while the learner runs, so the pipe breaks inside
    # GRPOLearner.run. Its GRPO step (compiling every program, most of a minute here) is
    # not what is tested: each step returns a record at once.
    monkeypatch.setattr(GRPOLearner, "step", lambda self: StepRecord(0, 0.5, 0.1, 0.0, 1))
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    rc = main(["learn", "--steps", "2", "--prompts-per-step", "1", "--group-size", "2", "--max-tokens", "2"])
    assert rc == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


@pytest.mark.cluster
def test_plan_json_into_a_pipe_closed_early_has_no_traceback():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte (`| head -c 0`)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rlcluster_lab", "plan", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.stderr == ""
    assert proc.returncode == EXIT_BROKEN_PIPE


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "--engine", "sglang_jax", "--lora", "--no-static-lora"],
        ["report", "--lora", "--lora-rank", "100000"],
        ["report", "--devices", "200000"],
    ],
)
@pytest.mark.cluster
def test_refusals_come_back_before_jax_is_imported(argv):
    # A knob-level refusal costs an interpreter start, not an `import jax` (about 3 s here).
    code = (
        "import sys\n"
        "from rlcluster_lab.cli.main import main\n"
        f"rc = main({argv!r})\n"
        "assert rc == 2, rc\n"
        "print(sorted(m for m in ('jax', 'flax', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "jax" not in out.stdout.splitlines()[-1], out.stdout


# --- issue 21: sizes and numerics bounded where they enter; refusals name the flag ------------------


def test_a_kv_cache_size_that_cannot_fit_is_refused_before_anything_is_built(monkeypatch):
    def no_build(*_args, **_kwargs):
        raise AssertionError("models were built for a cache that cannot fit")

    monkeypatch.setattr(scenario_module, "build_models", no_build)
    with pytest.raises(TooLargeError, match=r"KV cache of 100,000,000 slots.*lower kv_cache_size"):
        scenario_module.build_cluster(Scenario(kv_cache_size=10**8))


def test_a_cluster_given_models_refuses_a_cache_that_cannot_fit_before_placing_them():
    from rlcluster_lab import ClusterConfig, init_model, layout_meshes
    from rlcluster_lab.cluster.validate import check_inputs
    from rlcluster_lab.core.trace import Trace

    config = ClusterConfig(role_to_mesh=layout_meshes("colocated"), rollout_config=RolloutConfig(kv_cache_size=10**8))
    with pytest.raises(TooLargeError, match="kv_cache_size=100,000,000 slots for one prompt"):
        check_inputs(config, init_model("tiny"), None, None, None, Trace())


@pytest.mark.parametrize(
    "change, field",
    [
        ({"num_layers": 10**6}, "num_layers"),
        ({"num_layers": 10**9}, "num_layers"),
        ({"embed_dim": 10**12}, "embed_dim"),
        ({"vocab_size": 2**31}, "vocab_size"),
        ({"rms_eps": math.nan}, "rms_eps"),
        ({"rms_eps": math.inf}, "rms_eps"),
        ({"rms_eps": 1e-300}, "rms_eps"),
        ({"rope_base": math.inf}, "rope_base"),
        ({"rope_base": 1e-300}, "rope_base"),
        ({"param_dtype": "int8"}, "param_dtype"),
        ({"param_dtype": "float64"}, "param_dtype"),
        ({"param_dtype": "bool"}, "param_dtype"),
        ({"param_dtype": "complex64"}, "param_dtype"),
        ({"param_dtype": "uint32"}, "param_dtype"),
    ],
)
def test_model_config_refuses_what_would_hang_overflow_or_compute_nan(change, field):
    """Each was accepted: a plan that never returned, an OverflowError, NaN log-probs and NUL text."""
    import dataclasses

    with pytest.raises(ValueError, match=f"ModelConfig.{field}"):
        dataclasses.replace(TINY, **change)


def test_a_lora_scale_that_turns_adapters_to_inf_is_refused():
    from rlcluster_lab.model import init_model, with_lora

    with pytest.raises(ValueError, match=r"alpha / rank .* at most 10000"):
        with_lora(init_model("tiny"), 1, alpha=1e38)


def test_a_score_model_given_as_the_actor_is_refused(tmp_path):
    from rlcluster_lab import ClusterConfig, layout_meshes
    from rlcluster_lab.cluster.validate import check_inputs
    from rlcluster_lab.core.trace import Trace
    from rlcluster_lab.model.checkpoint import save
    from rlcluster_lab.model.scoring import init_score_model

    config = ClusterConfig(role_to_mesh=layout_meshes("colocated"))
    scorer = init_score_model("tiny")
    for actor in (scorer, save(scorer, tmp_path / "scorer")):
        with pytest.raises(ConfigError, match="actor must be a language model.*ScoreModel.*reward= or critic="):
            check_inputs(config, actor, None, None, None, Trace())


@pytest.mark.parametrize(
    "argv, flag, field",
    [
        (["plan", "--engine", "vllm", "--vllm-tp", "3"], "--vllm-tp", "rollout_vllm_tensor_parallel_size"),
        (["plan", "--prompt-length", "0"], "--prompt-length", "Workload."),
        (["plan", "--rollout-batch-size", "0"], "--rollout-batch-size", "Workload."),
        (["plan", "--max-tokens", "0"], "--max-tokens", "Workload."),
        (["plan", "--micro-batch-size", "0"], "--micro-batch-size", "Workload."),
        (["plan", "--kv-cache-size", "1"], "--kv-cache-size", "kv_cache_size is"),
        (["plan", "--devices-per-host", "3"], "--devices-per-host", "devices_per_host must"),
        (["plan", "--topology", "nope"], "--topology", "topology_names"),
        (["learn", "--steps", "-1"], "--steps", "LearnerConfig"),
        (["learn", "--group-size", "1"], "--group-size", "LearnerConfig"),
        (["learn", "--max-tokens", "0"], "--max-tokens", "max_tokens"),
    ],
)
def test_plan_and_learn_refusals_name_the_flag_not_the_python_field(capsys, argv, flag, field):
    rc, out, err = run(capsys, argv)
    assert_one_line_refusal(rc, out, err, f"The flag to change: {flag}")
    assert field not in err


@pytest.mark.parametrize(
    "limit, flags",
    [
        (10**5, "--model-size"),  # below the tiny model's KV cache for one prompt (196 KiB)
        (10**6, "--model-size (or --reward, --critic, --lora, --devices)"),  # below its cluster (about 2.6 MB)
    ],
    ids=["kv-cache", "cluster"],
)
def test_a_memory_refusal_names_the_commands_own_flags_not_the_python_fields(capsys, monkeypatch, limit, flags):
    # docs/guarantees.md: a refusal names the flag to change, never a Python field; and only a flag
    # this command takes (report has no --kv-cache-size).
    monkeypatch.setenv(LIMIT_ENV, str(limit))
    rc, out, err = run(capsys, ["report"])
    assert_one_line_refusal(rc, out, err, f"The flag to change: {flags}.")
    fields = [k for k in ("kv_cache_size", "model_size", "with_reward", "with_critic", "lora=") if k in err]
    assert fields == [] and "--kv-cache-size" not in err, err


class _FullDisk(io.TextIOBase):
    """A stdout on a full file system: every write fails as ``> /dev/full`` does."""

    def write(self, _text: str) -> int:
        raise OSError(28, "No space left on device")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("no descriptor")


@pytest.mark.parametrize("stdout", [_FullDisk(), None], ids=["full", "closed"])
def test_plan_into_a_full_or_closed_output_is_one_line_and_not_zero(capsys, monkeypatch, stdout):
    monkeypatch.setattr(sys, "stdout", stdout)
    rc = main(["plan", "--json"])
    err = capsys.readouterr().err
    assert rc == EXIT_OUTPUT_FAILED != 0
    assert err.count("\n") == 1 and err.startswith("error: cannot write the output: "), err
    assert "Traceback" not in err


# A CLI run (``python -m``, as a user starts it) that stops at one wait of the command
# (``core.waits``), says so on a pipe and waits there for the test's SIGINT: in the command's own
# code ("plain"); inside a garbage-collector callback ("gc"), where Python prints "Exception
# ignored" and drops the KeyboardInterrupt, as when Ctrl-C lands in JAX's GC callback; or inside a
# string exec ("exec", as while a dataclass is made), after which CPython, under ``-m``, would end
# the process by SIGINT rather than with its exit status.
_STOPPED_AT = r"""
import gc, os, sys, threading, time
point, where, ready = sys.argv[1], sys.argv[2], int(sys.argv[3])
from rlcluster_lab.cli.main import main
from rlcluster_lab.core.waits import WAITS

def wait_for_the_signal():
    os.write(ready, b"ready\n")
    deadline = time.monotonic() + 60  # a bound only: the signal comes at once
    while time.monotonic() < deadline:
        time.sleep(0.01)

def in_gc(phase, info):
    if phase == "start" and threading.current_thread() is threading.main_thread() and in_gc in gc.callbacks:
        gc.callbacks.remove(in_gc)
        wait_for_the_signal()

def at_point():
    status = WAITS.status()
    if status is not None and status.labels[-1] == point:
        unsubscribe()
        if where == "gc":
            gc.callbacks.append(in_gc)
            gc.collect()
        elif where == "exec":
            exec("wait_for_the_signal()", {"wait_for_the_signal": wait_for_the_signal})
        else:
            wait_for_the_signal()

unsubscribe = WAITS.subscribe(at_point)
raise SystemExit(main(["report", "--layout", "reshaped", "--sync", "--sync-chunk-bytes", "1"]))
"""

_POINTS = [
    ("starting JAX", "plain"),
    ("building the cluster", "gc"),
    ("building the cluster", "exec"),
    ("syncing weights", "plain"),
    ("syncing weights", "gc"),
    ("measuring the report", "gc"),
]


@pytest.mark.cluster
def test_ctrl_c_at_any_point_ends_with_one_line_and_130(tmp_path):
    (tmp_path / "stopped_cli").mkdir()
    (tmp_path / "stopped_cli" / "__main__.py").write_text(_STOPPED_AT)
    paths = [str(tmp_path), *(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    runs = []
    for point, where in _POINTS:  # all at once: each waits at its point for its signal
        read, write = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-m", "stopped_cli", point, where, str(write)],
            pass_fds=(write,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        os.close(write)
        runs.append((point, where, proc, os.fdopen(read)))
    results = []
    for point, where, proc, ready in runs:
        with ready:
            at_point = ready.readline() == "ready\n"  # "" if the process ended without reaching it
        if at_point:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
        results.append((point, where, at_point, proc.returncode, out, err))
    for point, where, at_point, rc, out, err in results:
        assert at_point, (point, where, rc, err[-2000:])
        assert (rc, out, err) == (EXIT_INTERRUPTED, "", "error: interrupted\n"), (point, where, rc, err[-2000:])
