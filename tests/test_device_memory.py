"""Every batch program is checked against its device's free memory before it is compiled: the
planner's figure for it (``model.memory``, held here to XLA's own memory analysis), a refusal in
the lab's words naming both figures and the knobs, and a cluster that still trains afterwards."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, TrainBatch, build_cluster
from rlcluster_lab.cli.main import main
from rlcluster_lab.core.compile_cache import count_compilations
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import describe
from rlcluster_lab.core.limits import DEVICE_LIMIT_ENV, TooLargeError, device_free_bytes
from rlcluster_lab.measure.program_memory import PROGRAMS, compare
from rlcluster_lab.model import MODEL_SIZES
from rlcluster_lab.model.fits import xla_refusal

# --- the planner's figure against XLA's -----------------------------------------------------


@given(
    size=st.sampled_from(["tiny", "small"]),
    rows=st.integers(1, 32),
    prompt=st.sampled_from([16, 32]),
    completion=st.sampled_from([8, 16]),
    lora_rank=st.sampled_from([0, 4]),
    program=st.sampled_from(PROGRAMS),
)
def test_l4_each_programs_figure_is_within_ten_percent_of_xlas_memory_analysis(
    size: str, rows: int, prompt: int, completion: int, lora_rank: int, program: str
) -> None:
    """The sampler, the log-prob program and the optimizer step, lowered through the lab's own
    code over abstract arrays and compiled by XLA:CPU at the lab's options: arguments + outputs +
    temporaries - aliased, against the figure the check before compiling reads."""
    compared = compare(program, MODEL_SIZES[size], rows, prompt, completion, lora_rank=lora_rank)
    assert compared.planned.arguments == pytest.approx(compared.xla["argument"], abs=16)
    assert compared.planned.outputs == compared.xla["output"]
    assert abs(compared.ratio - 1) <= 0.10, compared.to_json()


# --- the device's free memory -----------------------------------------------------------------


def test_a_simulated_device_memory_is_its_limit_less_what_the_live_arrays_hold_there(monkeypatch) -> None:
    device = jax.devices()[1]
    assert device_free_bytes(device) is None  # a CPU device reports no allocator figures
    monkeypatch.setenv(DEVICE_LIMIT_ENV, "64MiB")
    before = device_free_bytes(device)
    held = jax.device_put(np.zeros(1 << 18, np.float32), device)  # 1 MiB
    assert device_free_bytes(device) == before - (1 << 20)
    assert before <= 64 << 20
    del held
    monkeypatch.setenv(DEVICE_LIMIT_ENV, "a lot")
    with pytest.raises(ConfigError, match=DEVICE_LIMIT_ENV):
        device_free_bytes(device)


def test_xlas_own_refusal_is_said_in_the_labs_words_with_its_figures() -> None:
    xla = RuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (33.91G) "
        "exceeds available HBM (15.75G)."
    )
    with (
        pytest.raises(TooLargeError) as refused,
        xla_refusal(None, "a training step over 1,024 completions", (), "fix"),
    ):
        raise xla
    text = str(refused.value)
    assert text.startswith("XLA refused a training step over 1,024 completions") and refused.value.__cause__ is xla
    assert "33.91 GB of temporaries" in text and "15.75 GB" in text and "nothing of the cluster changed" in text
    with pytest.raises(ValueError, match="not memory"), xla_refusal(None, "x", (), "fix"):
        raise ValueError("not memory")


# --- refusals before compiling, and the cluster afterwards -----------------------------------


def _tight(monkeypatch, devices, extra: int) -> None:
    """Give every device ``extra`` bytes beside what this process's arrays hold on the fullest of ``devices``."""
    monkeypatch.setenv(DEVICE_LIMIT_ENV, "1TiB")
    held = max((1 << 40) - device_free_bytes(d) for d in devices)
    monkeypatch.setenv(DEVICE_LIMIT_ENV, str(held + extra))


def _snapshot(cluster) -> list[np.ndarray]:
    """The actor's parameters and optimizer state, read to the host."""
    return [np.asarray(x) for x in jax.tree.leaves((nnx.state(cluster.actor_model), cluster.optimizer_state))]


PROGRAM_NAMES = {"generate": "jit(_generate)", "log-probs": "jit(_logps)", "train step": "jit(grpo_train_step)"}


@pytest.mark.cluster
@pytest.mark.parametrize("program", PROGRAMS)
def test_a_program_over_the_free_memory_is_refused_before_it_is_compiled_and_the_cluster_still_trains(
    program: str, monkeypatch
) -> None:
    cluster = build_cluster(Scenario())
    rows = 64
    prompt, completion = np.ones((rows, 16), np.int32), np.ones((rows, 16), np.int32)
    calls = {
        "generate": lambda: cluster.generate(["abc"] * rows),
        "log-probs": lambda: cluster.get_actor_per_token_logps(prompt, completion),
        "train step": lambda: cluster.update_actor(
            TrainBatch(prompt, completion, np.ones(rows, np.float32), np.zeros((rows, 16), np.float32), None)
        ),
    }
    before, steps = _snapshot(cluster), cluster.global_steps
    _tight(monkeypatch, cluster.devices(), 64 << 10)
    with count_compilations() as compiled, pytest.raises(TooLargeError) as refused:
        calls[program]()
    assert PROGRAM_NAMES[program] not in {name for name, _, _ in compiled}
    text = str(refused.value)
    assert "the planner's figure" in text and "free ($RLCLUSTER_LAB_DEVICE_MEMORY)" in text and "not compiled" in text
    assert "prompts_per_step" in refused.value.knobs and "group_size" in refused.value.knobs
    if program == "train step":
        assert refused.value.knobs[:2] == ("train_micro_batch_size", "mini_batch_size")
    # Nothing of the cluster changed, and it trains once the memory is there.
    assert all(np.array_equal(a, b) for a, b in zip(before, _snapshot(cluster), strict=True))
    monkeypatch.delenv(DEVICE_LIMIT_ENV)
    record = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=4)).step()
    assert np.isfinite(record.loss) and cluster.global_steps == steps + 1


@pytest.mark.cluster
def test_xla_refusing_the_sampler_changes_nothing_and_draws_no_seed(monkeypatch) -> None:
    from rlcluster_lab.model import sampling

    cluster = build_cluster(Scenario())
    cluster.generate(["abc", "xyz"])

    def exhausted(*args, **kwargs):
        raise RuntimeError(
            "RESOURCE_EXHAUSTED: the total memory required for HLO temporaries (9.1G) exceeds available HBM (8.0G)"
        )

    monkeypatch.setattr(sampling, "_run_generate", exhausted)
    with pytest.raises(TooLargeError, match="XLA refused generating for 2 prompts.*the planner's figure was"):
        cluster.generate(["abc", "xyz"])
    monkeypatch.undo()
    again = build_cluster(Scenario())
    again.generate(["abc", "xyz"])
    # The refused call drew no seed: the cluster samples what a cluster that was never refused samples next.
    assert np.array_equal(cluster.generate(["abc", "xyz"]).tokens, again.generate(["abc", "xyz"]).tokens)


@pytest.mark.cluster
def test_the_learner_refuses_a_step_whose_optimizer_step_cannot_fit_before_it_samples(monkeypatch) -> None:
    cluster = build_cluster(Scenario(), devices=jax.devices()[:1])
    learner = GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=8, group_size=4))
    drawn = learner._rng.bit_generator.state
    # Room for the sampler and the log-probs of 32 completions (about 6 and 2 MiB), not for the step (about 18).
    _tight(monkeypatch, cluster.devices(), 10 << 20)
    with count_compilations() as compiled, pytest.raises(TooLargeError) as refused:
        learner.step()
    assert not set(PROGRAM_NAMES.values()) & {name for name, _, _ in compiled}  # nothing sampled, scored or built
    assert str(refused.value).startswith("a training step over 32 completions of 16 + 16 tokens needs about")
    assert "--micro-batch-size" in describe(refused.value, "cli", "learn")
    assert learner._rng.bit_generator.state == drawn and cluster.global_steps == 0 and not learner.history
    monkeypatch.delenv(DEVICE_LIMIT_ENV)
    assert learner.step().step == 0 and cluster.global_steps == 1


@pytest.mark.cluster
def test_the_learn_command_refuses_a_batch_the_devices_cannot_hold_in_one_line(monkeypatch, capsys) -> None:
    _tight(
        monkeypatch, jax.devices(), 2 << 20
    )  # the cluster fits beside what is live, its sampler for 32 rows does not
    code = main(["learn", "--steps", "1", "--prompts-per-step", "8", "--group-size", "4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "the planner's figure" in err and "The flag to change: --prompts-per-step (or --group-size" in err


@pytest.mark.cluster
def test_the_labs_training_step_is_refused_in_its_words_and_its_cluster_still_trains(monkeypatch) -> None:
    from rlcluster_lab.lab.widget.placement_lab import PlacementLab

    lab = PlacementLab(rehearse=False)
    try:
        lab.construct_button.click()
        assert lab.error is None, lab.error
        cluster = lab.cluster
        _tight(monkeypatch, cluster.devices(), 16 << 10)
        lab.step_button.click()
        assert lab.error is not None and lab.error.startswith("TooLargeError"), lab.error
        assert "the planner's figure" in lab.error and "free ($RLCLUSTER_LAB_DEVICE_MEMORY)" in lab.error
        assert lab.cluster is cluster and cluster.global_steps == 0 and not lab.step_button.disabled
        monkeypatch.delenv(DEVICE_LIMIT_ENV)
        lab.step_button.click()
        assert lab.error is None, lab.error
        assert lab.cluster is cluster and cluster.global_steps == 1
    finally:
        lab.release()
