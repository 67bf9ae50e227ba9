"""``python -m rlcluster_lab``: the placement report (and a learner run) as text or JSON."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from rlcluster_lab.cli.flags import add_knob_flags, fields_given, scenario_from
from rlcluster_lab.cli.plan import add_plan_arguments, check_plan_flags, run_plan_command
from rlcluster_lab.cli.processes import multi_process, run_processes_command
from rlcluster_lab.cli.progress import progress_line
from rlcluster_lab.cli.text import format_report
from rlcluster_lab.core.knobs import describe
from rlcluster_lab.core.options import check_device_count
from rlcluster_lab.core.waits import WAITS, waiting
from rlcluster_lab.rules.validation import check_scenario


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage block: scripts read the reason, people read --help.
        print(f"error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m rlcluster_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    rep = sub.add_parser("report", help="build a cluster and print its placement report")
    add_knob_flags(rep, "report")
    rep.add_argument("--sync", action="store_true", help="also run one weight sync and report the bytes it moved (L3)")
    learn = sub.add_parser("learn", help="run the toy GRPO learner and print its reward curve and P11 numbers")
    add_knob_flags(learn, "learn", max_tokens={"default": 8})
    what_if = "what-if plan (L4): placement, memory and sync bytes from shapes alone, for any model size and topology"
    add_plan_arguments(sub.add_parser("plan", help=what_if))
    return parser


# Exit codes besides 0 (done) and 2 (a bad flag or a configuration that cannot work, one line):
# a closed stdout (``| head``) ends quietly with 141, what a shell reports for a tool killed by
# SIGPIPE (128 + 13), so ``set -o pipefail`` scripts see this command as they see ``cat`` or
# ``grep``; Ctrl-C ends with 130 (128 + SIGINT), as shells do.
EXIT_BAD_INPUT = 2
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130
# The result could not be written (a full disk, ``> /dev/full``, a closed stdout): sysexits' EX_IOERR.
EXIT_OUTPUT_FAILED = 74

# What a command raises for input it cannot use: a ConfigError (a ValueError; TooLargeError
# is one too, and a MemoryError), a wrong type, a file that is not there, a number too large
# for a C integer, a backend that cannot do what was asked.
_REFUSALS = (ValueError, TypeError, RuntimeError, FileNotFoundError, MemoryError, OverflowError)
# A multi-process run that failed (multiprocess.LaunchError) is a RuntimeError: exit 2, the worker's error.


class _Interrupts:
    """Ctrl-C while a command runs: recorded, and raised as ``KeyboardInterrupt`` where the command is.

    Python raises it in whatever code runs when the signal arrives; in a callback (JAX's GC
    callback, a finalizer) it is printed as "Exception ignored" and lost, and the command would
    go on and exit 0. So it is also recorded: raised again when the command next begins or
    ends a wait (``core.waits``) and before the output is written, and the command ends with
    one line and 130 whatever swallowed it (the "Exception ignored" report is left out).
    """

    def __init__(self) -> None:
        self.hit = False
        self.armed = True  # False once the command is over: a Ctrl-C is then only recorded
        self._main = threading.get_ident()

    def on_signal(self, signum: int, frame: Any) -> None:
        self.hit = True
        if self.armed:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the recorded interrupt (in the main thread, while the command runs)."""
        if self.hit and self.armed and threading.get_ident() == self._main:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous_handler = signal.signal(signal.SIGINT, self.on_signal)
        previous_hook = sys.unraisablehook

        def unraisable(info: Any) -> None:
            if not (self.hit and isinstance(info.exc_value, KeyboardInterrupt)):
                previous_hook(info)

        sys.unraisablehook = unraisable
        unsubscribe = WAITS.subscribe(self.check)
        try:
            yield
        finally:
            unsubscribe()
            sys.unraisablehook = previous_hook
            signal.signal(signal.SIGINT, previous_handler if previous_handler is not None else signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit code (0, 2, 74, 130 or 141: see ``EXIT_*``)."""
    interrupts = _Interrupts()
    with interrupts.installed():
        try:
            try:
                code = _main(argv, interrupts)
            finally:
                interrupts.armed = False
        except KeyboardInterrupt:
            interrupts.hit = True
        if interrupts.hit:  # raised, or swallowed by a callback: either way the command was interrupted
            print("error: interrupted", file=sys.stderr)
            # An interrupt that ended a string exec (a dataclass made while a module loads) leaves
            # CPython's "unhandled KeyboardInterrupt" flag set, and under ``python -m`` the process
            # would kill itself with SIGINT instead of exiting 130; the next string eval clears it.
            exec("None", {})  # noqa: S102 - a constant
            return EXIT_INTERRUPTED
    return code


def _main(argv: Sequence[str] | None, interrupts: _Interrupts) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # a bad flag (one line on stderr, exit 2) or --help (exit 0)
        return int(exit_.code or 0)
    try:
        # A line on stderr during every wait of half a second or more (a terminal only, not with --json).
        with progress_line(sys.stderr, json_output=bool(getattr(args, "json", False))):
            out = _run(args)
        text = json.dumps(out, indent=2, sort_keys=True) if args.json else out["_text"] if "_text" in out else ""
    except BrokenPipeError:  # progress lines written while the command ran
        return _stdout_closed()
    except _REFUSALS as exc:
        if interrupts.hit:  # an interrupt some code turned into another error on its way out
            raise KeyboardInterrupt from None
        # A refusal that names its knobs names them as this command's flags (core.knobs).
        print(f"error: {describe(exc, 'cli', args.command)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    interrupts.check()  # one a callback swallowed: nothing is written
    return _write(text)


def _write(text: str) -> int:
    """Print the result; an output that cannot take it ends with one line, never a traceback."""
    if sys.stdout is None:  # started with stdout closed (``>&-``): the result has nowhere to go
        print("error: cannot write the output: stdout is closed", file=sys.stderr)
        return EXIT_OUTPUT_FAILED
    try:
        print(text)
        sys.stdout.flush()  # a closed pipe or a full disk is found here, not at interpreter exit
    except BrokenPipeError:
        return _stdout_closed()
    except (OSError, ValueError) as exc:  # a full file system (``> /dev/full``), a closed file
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"error: cannot write the output: {reason}", file=sys.stderr)
        _stdout_closed()
        return EXIT_OUTPUT_FAILED
    return 0


def _run(args: argparse.Namespace) -> dict[str, Any]:
    check_device_count(args.devices, "--devices")
    # Knob-level refusals (P6, the LoRA rank the model allows, the learner's sizes) come back
    # before the backend starts.
    learning = _learn_setup(args) if args.command == "learn" else None
    if args.command == "report":
        if multi_process(args):  # several processes: the workers start JAX, this process never does
            return run_processes_command(args)
        check_scenario(scenario_from(args))
    if args.command == "plan":
        check_plan_flags(args)
    # The device count must be set before anything starts the JAX backend,
    # and the persistent compilation cache before the first compilation.
    with waiting("starting JAX"):
        from rlcluster_lab.core.chip_holder import ChipHeldError
        from rlcluster_lab.core.compile_cache import enable_compilation_cache
        from rlcluster_lab.core.devices import ensure_simulated_devices

        try:
            ensure_simulated_devices(args.devices, cpu=args.cpu)
        except ChipHeldError as exc:  # one line naming the holder and the flag, never libtpu's advice
            instead = f"or run with --cpu to use {args.devices} simulated CPU devices instead"
            raise ChipHeldError(exc.held, f"{exc}: {exc.held.to_free()}, {instead}") from None
        enable_compilation_cache()
    if args.command == "report":
        return _report(args)
    if args.command == "plan":
        return run_plan_command(args)
    return _learn(args, *learning) if learning is not None else {}


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): end quietly. Pointing the descriptor at
    /dev/null lets the interpreter's final flush succeed instead of printing a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no descriptor (replaced in-process): nothing to flush
        pass
    return EXIT_BROKEN_PIPE


def _report(args: argparse.Namespace) -> dict[str, Any]:
    from rlcluster_lab.app.report import placement_report
    from rlcluster_lab.app.scenario import build_cluster

    with waiting("building the cluster"):
        cluster = build_cluster(scenario_from(args))
    sync = None
    if args.sync:
        from rlcluster_lab.measure.sync import with_floor

        with waiting("syncing weights"):
            sync = with_floor(cluster, cluster.sync_weights())  # the handover beside one device_put
    with waiting("measuring the report"):
        data = placement_report(cluster, sync=sync).to_json()
    return data if args.json else {"_text": format_report(data)}


def _learn_setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The learner's scenario and settings, checked (the rollout's memory too) before the backend starts."""
    from rlcluster_lab.app.learner import LearnerConfig, check_learner_batch
    from rlcluster_lab.app.scenario import rollout_bytes
    from rlcluster_lab.core.config import TrainingConfig
    from rlcluster_lab.core.limits import check_fits

    scenario = scenario_from(args, max_tokens=args.max_tokens)
    # Each learner flag sets the field of its name (``core.knobs``). With --critic the learner runs
    # PPO-style steps: the critic's values as baseline, and the critic trained every step.
    training = TrainingConfig(**fields_given(TrainingConfig, args))
    config = LearnerConfig(**fields_given(LearnerConfig, args), critic=args.with_critic)
    check_learner_batch(config, training)
    check_scenario(scenario)
    check_fits(
        rollout_bytes(scenario, config.batch_size),
        f"a learner step of {config.batch_size:,} completions (--prompts-per-step {config.prompts_per_step:,} "
        f"x --group-size {config.group_size:,}) with the {scenario.model_size} model",
        "lower --prompts-per-step or --group-size",
    )
    return scenario, training, config


def _learn(args: argparse.Namespace, scenario: Any, training: Any, config: Any) -> dict[str, Any]:
    from rlcluster_lab.app.learner import GRPOLearner
    from rlcluster_lab.app.scenario import build_cluster

    with waiting("building the cluster"):
        learner = GRPOLearner(build_cluster(scenario, training_config=training), config)

    def show(s: Any) -> None:
        value_loss = f"  value loss {s.value_loss:.4f}" if s.value_loss is not None else ""
        print(f"step {s.step:3d}  mean reward {s.mean_reward:.3f}  loss {s.loss:+.4f}{value_loss}", flush=True)
        if s.rejected:
            print(f"          rejected: {s.rejected}", flush=True)

    words = learner.reward_words
    if not args.json:
        print(f"reward: {words.rewarded}; a rising mean reward means {words.rising}.", flush=True)
    result = learner.run(progress=None if args.json else show)
    if args.json:
        return {**result.to_json(), "reward": dataclasses.asdict(words)}
    later = [p for p in result.p11 if p.steps_taken_before > 0]
    first = [p for p in result.p11 if p.steps_taken_before == 0]
    lines = [
        f"mean reward: first step {result.rewards[0]:.3f}, last step {result.rewards[-1]:.3f}"
        if result.rewards
        else "no steps run",
        "P11: max |live - anchor| log-prob before the first optimizer step of a global step: "
        + (f"{max(p.live_vs_anchor for p in first):.2e}" if first else "n/a"),
        "P11: max |live - anchor| once the actor has stepped (later mini-batches): "
        + (f"{max(p.live_vs_anchor for p in later):.2e}" if later else "n/a (one mini-batch per step)"),
        "P11: max |anchor - sampler|: "
        + (f"{max(p.anchor_vs_sampler for p in result.p11):.2e}" if result.p11 else "n/a"),
    ]
    return {"_text": "\n".join(lines)}


if __name__ == "__main__":
    raise SystemExit(main())
