"""No silent wait: what the process waits for (core.waits) and the CLI's progress line on stderr.

Every check runs on a fake clock and a fake terminal; none depends on how long anything takes."""

from __future__ import annotations

import importlib
import io
import threading

import pytest

from rlcluster_lab.cli import progress
from rlcluster_lab.cli.progress import ProgressLine, wants_progress
from rlcluster_lab.core.waits import WAITS, Waits

cli_main = importlib.import_module("rlcluster_lab.cli.main")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal; ``written`` is set at the first write."""

    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty = tty
        self.written = threading.Event()

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        self.written.set()
        return super().write(text)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def waits(clock) -> Waits:
    return Waits(clock)


# ------------------------------------------------------------------ the waits


def test_nothing_is_waited_for_outside_a_wait(waits):
    assert waits.status() is None


def test_a_wait_says_what_it_waits_for_and_for_how_long(waits, clock):
    with waits.waiting("building the cluster"):
        clock.advance(0.7)
        status = waits.status()
    assert status.labels == ("building the cluster",)
    assert status.elapsed_s == pytest.approx(0.7)
    assert waits.status() is None


def test_nested_waits_read_outermost_first_with_each_elapsed_time(waits, clock):
    with waits.waiting("step 1 of 3"):
        clock.advance(1.0)
        with waits.waiting("update_actor"):
            clock.advance(0.5)
            status = waits.status()
    assert status.labels == ("step 1 of 3", "update_actor")
    assert (status.elapsed_s, status.stage_elapsed_s) == (pytest.approx(1.5), pytest.approx(0.5))
    assert status.line().startswith("step 1 of 3: update_actor, 1.5 s")


def test_the_last_wait_of_the_same_kind_is_the_estimate(waits, clock):
    with waits.waiting("step 1 of 3", kind="learner step"):
        assert waits.status().estimate_s is None
        clock.advance(2.0)
    with waits.waiting("step 2 of 3", kind="learner step"):
        clock.advance(0.1)
        status = waits.status()
    assert status.estimate_s == pytest.approx(2.0)
    assert "(last 2.0 s)" in status.line()


def test_programs_being_built_are_named_with_their_own_elapsed_time(waits, clock):
    with waits.waiting("generate"):
        waits.build_started("compiling", "jit(_generate)")
        clock.advance(1.2)
        during = waits.status()
        waits.build_ended("compiling", "jit(_generate)")
        after = waits.status()
    assert [(b.phase, b.name) for b in during.building] == [("compiling", "jit(_generate)")]
    assert during.building[0].elapsed_s == pytest.approx(1.2)
    assert "compiling sampling completions 1.2 s" in during.line()  # the work, not the function
    assert after.building == () and after.built == 1
    assert "1 program(s) built" in after.line()


def test_a_nested_trace_shows_the_outermost_program(waits):
    with waits.waiting("update_actor"):
        waits.build_started("tracing", "grpo_train_step")
        waits.build_started("tracing", "inner")
        waits.build_ended("tracing", "inner")
        assert [b.name for b in waits.status().building] == ["grpo_train_step"]
        waits.build_ended("tracing", "grpo_train_step")
        assert waits.status().building == ()


@pytest.mark.parametrize("when", ["begin", "end", "always"])
def test_a_failing_subscriber_is_reported_and_changes_nothing_else(waits, when):
    calls = []

    def broken() -> None:
        calls.append(waits.status() is not None)  # True at the begin, False at the end
        if when == "always" or (when == "begin") == calls[-1]:
            raise RuntimeError("the progress display is gone")

    waits.subscribe(broken)
    with pytest.warns(RuntimeWarning, match=r"broken\) raised RuntimeError: the progress display is gone"):
        with pytest.raises(KeyError, match="the body's own"):
            with waits.waiting("loading"):
                assert waits.status().labels == ("loading",)  # the wait began, whatever the subscriber did
                raise KeyError("the body's own")
    assert waits.status() is None  # and ended: no wait left behind
    assert calls == [True, False]
    with pytest.warns(RuntimeWarning):
        with waits.waiting("again"):
            pass
    assert waits.status() is None


def test_an_interrupt_in_a_subscriber_ends_the_wait_and_is_not_swallowed(waits):
    def interrupted() -> None:
        if waits.status() is not None:
            raise KeyboardInterrupt

    waits.subscribe(interrupted)
    with pytest.raises(KeyboardInterrupt):
        with waits.waiting("loading"):
            pass
    assert waits.status() is None


def test_compile_events_of_jax_reach_the_process_waits():
    """The real listener: a program jitted inside a wait is counted as built."""
    import jax
    import jax.numpy as jnp

    with WAITS.waiting("a test's compile"):
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(7.0)).block_until_ready()
        assert WAITS.status().built >= 1


# ------------------------------------------------------------------ the progress line


def test_the_line_stays_quiet_for_the_first_half_second(waits, clock):
    stream = FakeTerminal()
    line = ProgressLine(stream, waits)
    with waits.waiting("syncing weights"):
        clock.advance(0.4)
        assert line.tick() == ""
    assert stream.getvalue() == ""


def test_the_line_shows_the_wait_after_half_a_second_and_each_tick_redraws_it(waits, clock):
    stream = FakeTerminal()
    line = ProgressLine(stream, waits)
    with waits.waiting("building the cluster"):
        clock.advance(0.6)
        first = line.tick()
        waits.build_started("compiling", "jit(identity)")
        clock.advance(0.3)
        second = line.tick()
    assert first == "building the cluster, 0.6 s"
    assert second.startswith("building the cluster, 0.9 s; compiling a reshard between two layouts 0.3 s")
    assert stream.getvalue().count("\r\x1b[K") == 2


def test_the_line_is_erased_when_the_wait_ends(waits, clock):
    stream = FakeTerminal()
    line = ProgressLine(stream, waits)
    unsubscribe = waits.subscribe(line.tick)
    with waits.waiting("generate"):
        clock.advance(1.0)
        line.tick()
    unsubscribe()
    assert line.shown == ""
    assert stream.getvalue().endswith("generate, 1.0 s\r\x1b[K")


def test_the_line_redraws_at_least_every_half_second():
    assert progress.INTERVAL_S <= 0.5 and progress.DELAY_S <= 0.5


@pytest.mark.parametrize(
    ("tty", "json_output", "wanted"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_a_line_only_on_a_terminal_and_never_with_json(tty, json_output, wanted):
    assert wants_progress(FakeTerminal(tty), json_output) is wanted
    assert wants_progress(None, json_output) is False


# ------------------------------------------------------------------ the CLI


def _stub_report(seen: dict):
    """A report that waits until the progress line has written something (or 60 s, failing)."""

    def report(args):
        with WAITS.waiting("a stubbed report"):
            seen["written"] = seen["stream"].written.wait(60)
        return {"_text": "done"}

    return report


def test_the_cli_shows_a_waiting_command_on_a_terminal(monkeypatch, capsys):
    stream = FakeTerminal()
    seen = {"stream": stream}
    monkeypatch.setattr(cli_main, "_report", _stub_report(seen))
    monkeypatch.setattr(cli_main.sys, "stderr", stream)
    assert cli_main.main(["report"]) == 0
    assert seen["written"] is True
    assert "a stubbed report, " in stream.getvalue()
    assert stream.getvalue().endswith("\r\x1b[K")  # erased before the result is printed
    assert capsys.readouterr().out == "done\n"


@pytest.mark.parametrize(("flags", "tty"), [(["--json"], True), ([], False)])
def test_the_cli_is_quiet_with_json_or_without_a_terminal(monkeypatch, flags, tty):
    made = []
    monkeypatch.setattr(progress.ProgressLine, "start", lambda self: made.append(self) or self)
    monkeypatch.setattr(cli_main, "_report", lambda args: {"_text": "done"})
    stream = FakeTerminal(tty)
    monkeypatch.setattr(cli_main.sys, "stderr", stream)
    assert cli_main.main(["report", *flags]) == 0
    assert made == [] and stream.getvalue() == ""


@pytest.mark.cluster
def test_learn_marks_each_phase_of_a_step_as_a_wait():
    from rlcluster_lab import Scenario, build_cluster
    from rlcluster_lab.app.learner import GRPOLearner, LearnerConfig

    learner = GRPOLearner(
        build_cluster(Scenario(layout="colocated", max_tokens=4)), LearnerConfig(steps=1, prompts_per_step=1)
    )
    seen = []
    unsubscribe = WAITS.subscribe(lambda: seen.append(getattr(WAITS.status(), "labels", None)))
    try:
        learner.run()
    finally:
        unsubscribe()
    for phase in ("generate", "log-probs (anchor)", "log-probs (reference)", "update_actor", "sync_weights"):
        assert ("step 1 of 1", phase) in seen, seen
    assert WAITS.last("learner step") is not None


@pytest.mark.cluster
def test_the_labs_background_rehearsal_is_a_wait_a_click_can_show():
    from rlcluster_lab import GRPOLearner, LearnerConfig, Scenario, build_cluster
    from rlcluster_lab.lab.widget.rehearsal import REHEARSAL, rehearse_next_step

    cluster = build_cluster(Scenario(layout="colocated", max_tokens=4))
    seen = []
    unsubscribe = WAITS.subscribe(lambda: seen.append(getattr(WAITS.status(), "labels", None)))
    try:
        rehearse_next_step(GRPOLearner(cluster, LearnerConfig(steps=1, prompts_per_step=2, group_size=2)))
    finally:
        unsubscribe()
    assert ("compiling the training step's programs (in the background)",) in seen
    assert WAITS.last(REHEARSAL) is not None


@pytest.mark.cluster
def test_every_program_a_cluster_compiles_is_named_in_a_readers_words():
    """The status names the work a program does, never a function: every program a build, a sync
    and a training step compile (reshaped LoRA with a bfloat16 rollout, reward and critic; and a
    custom rollout mesh under the minimal strategy) has words of its own."""
    import warnings

    import jax

    from rlcluster_lab import Role, Scenario, build_cluster
    from rlcluster_lab.app.learner import GRPOLearner
    from rlcluster_lab.core.compile_cache import count_compilations
    from rlcluster_lab.core.meshes import layout_meshes, make_mesh
    from rlcluster_lab.core.waits import PROGRAM_WORDS
    from rlcluster_lab.placement.programs import clear_programs

    custom = layout_meshes("colocated")
    custom[Role.ROLLOUT] = make_mesh([jax.devices()[i] for i in (6, 0, 4)][:2], (2, 1))
    cases = [
        (Scenario(layout="reshaped", lora=True, rollout_dtype="bfloat16", with_reward=True, with_critic=True), None),
        (Scenario(reshard="minimal"), custom),
    ]
    # Programs an earlier test in this process compiled would not be built again, nor counted.
    jax.clear_caches()
    clear_programs()
    with count_compilations() as made, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for scenario, r2m in cases:
            cluster = build_cluster(scenario, role_to_mesh=r2m)
            cluster.sync_weights()
            if r2m is None:
                GRPOLearner(cluster).step()
    names = {name[4:-1] for name, _, _ in made}
    assert {"_generate", "_cut_and_pack", "_assemble_blocks", "identity", "copy_arrays", "write_anchor_over"} <= names
    assert names <= set(PROGRAM_WORDS), sorted(names - set(PROGRAM_WORDS))
