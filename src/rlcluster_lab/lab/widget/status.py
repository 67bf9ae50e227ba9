"""The lab's status: one sentence of fixed height, its details behind a toggle, a progress bar,
and, while an action waits, what it waits for and for how long so far.

A wait (a build, a sync, a training step, the background compile a step waits for) is shown
the moment it begins and redrawn from a thread of its own (``StatusLine.waiting``). The
sentence keeps one height whatever it says (two lines; the whole text is its hover title and
in the details), so nothing under it moves.

After each action the sentence says what happened and the one figure that matters, measured
(``constructed``, ``synced``, ``stepped``, ``refused``), and the details what it cost: pure
functions of the report and the timings, so a test reads what a user reads.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.core.waits import WAITS, Building, program_words
from rlcluster_lab.lab.figures.flow import rollout_text, warning_lines
from rlcluster_lab.lab.figures.style import on_where

TICK_SECONDS = 0.25  # a wait's line is redrawn at least this often
STATUS_HEIGHT_PX = 34  # two lines of 12 px text: the height the sentence keeps at least
_NAMES_SHOWN = 3  # program names a wait's line lists (the latest ones)


def building_now() -> tuple[Building, ...]:
    """The programs being traced, lowered or compiled at this moment, in any thread."""
    status = WAITS.status()
    return status.building if status is not None else ()


def wait_text(
    what: str,
    elapsed: float,
    estimate: float | None = None,
    programs: Sequence[str] = (),
    building: Sequence[Building] = (),
) -> str:
    """One wait in words: what it waits for, the seconds so far, the last comparable wait, and
    the program being built now, or else the latest programs compiled, as a reader knows them
    (``core.waits.program_words``)."""
    text = f"{what}: {elapsed:.1f} s so far"
    if estimate is not None:
        text += f" (last time {estimate:.1f} s)"
    if building:
        b = building[-1]
        text += f"; {b.phase} {program_words(b.name)} ({b.elapsed_s:.1f} s)"
        if programs:
            text += f", program {len(programs) + 1}"
    elif programs:
        names = [program_words(p) for p in programs]
        latest = ", latest: " if len(names) > _NAMES_SHOWN else ": "
        text += f"; compiled {len(names)}{latest}" + ", ".join(names[-_NAMES_SHOWN:])
    return text


class Ticker:
    """Shows ``text(seconds so far)`` at once, then again every ``TICK_SECONDS`` from a thread
    until stopped (``stop``: the event that ends the redraws and paces them)."""

    def __init__(
        self,
        show: Callable[[str], None],
        text: Callable[[float], str],
        *,
        clock: Callable[[], float] = time.perf_counter,
        stop: threading.Event | None = None,
        since: float | None = None,
    ) -> None:
        self.show, self.text, self.clock = show, text, clock
        self._stop = stop or threading.Event()
        self._since = since
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a redraw computes and shows its text in one go

    def elapsed(self) -> float:
        return self.clock() - (self._since if self._since is not None else self.clock())

    def start(self) -> None:
        """Show the text now (before the caller waits on anything), then start redrawing."""
        if self._since is None:
            self._since = self.clock()
        self.redraw()
        # A daemon: it only redraws text; nothing is lost if the interpreter leaves before it.
        self._thread = threading.Thread(target=self.run, name="rlcluster-lab-status", daemon=True)
        self._thread.start()

    def redraw(self) -> None:
        with self._lock:
            self.show(self.text(self.elapsed()))

    def run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self.redraw()

    def stop(self) -> float:
        """Stop redrawing; returns the seconds since ``start``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.elapsed()


class Wait:
    """What a wait is for, changeable while it lasts (an action's stages); a change shows at once."""

    def __init__(self, what: str) -> None:
        self._what = what
        self.ticker: Ticker | None = None

    @property
    def what(self) -> str:
        return self._what

    @what.setter
    def what(self, what: str) -> None:
        self._what = what
        if self.ticker is not None:
            self.ticker.redraw()


class StatusLine:
    """The sentence, its details toggle, the details and the progress bar, spanning the width
    they are placed in; the sentence keeps two lines' height at least, and wraps rather than
    being cut."""

    def __init__(self) -> None:
        self.sentence = widgets.HTML(layout=widgets.Layout(min_height=f"{STATUS_HEIGHT_PX}px", flex="1 1 auto"))
        self.sentence.add_class("rl-status")
        self.toggle = widgets.ToggleButton(
            value=False,
            description="details",
            tooltip="what the last action cost, measured: its work, the report, the redraw, the programs compiled",
            layout=widgets.Layout(width="76px", height="24px", flex="0 0 auto"),
        ).add_class("rl-details-toggle")
        self.details = widgets.HTML(layout=widgets.Layout(display="none")).add_class("rl-details")
        self.toggle.observe(lambda c: setattr(self.details.layout, "display", "block" if c.new else "none"), "value")
        # Thin, and hidden rather than removed, so nothing below it moves when it shows.
        hidden = widgets.Layout(width="100%", height="8px", visibility="hidden")
        self.progress = widgets.IntProgress(value=0, min=0, max=3, layout=hidden)
        self.widget = widgets.HBox([self.sentence, self.toggle], layout=widgets.Layout(width="100%"))
        self.text = ""  # the sentence as plain text
        self.busy = False
        self.clock: Callable[[], float] = time.perf_counter  # the one clock of every time the status says
        self.started = self.clock()  # when the running (or last) action was clicked
        self.building_shown: list[str] = []  # programs a wait of this action showed being built
        self._lock = threading.Lock()
        self._ticker: Ticker | None = None

    def begin(self) -> None:
        """An action begins (a click): every time said until the next one counts from now, and
        what its waits show being built is recorded from now (``building_shown``)."""
        self.started = self.clock()
        self.building_shown = []

    def elapsed(self) -> float:
        """Seconds since the action began (``begin``), on the status' one clock."""
        return self.clock() - self.started

    def _show(self, text: str) -> None:
        with self._lock:
            self.text = text
            escaped = html.escape(text)
            self.sentence.value = f"<span title='{escaped}'>{escaped}</span>"

    def say(self, text: str, details: str = "") -> None:
        """The sentence after an action (or a refusal), and its details; it ends any wait's redraws."""
        if self._ticker is not None:
            self._ticker.stop()
        # The sentence and details first, then "not busy": a page never shows the wait's last
        # text as an answer (each change reaches the page as a message of its own, in order).
        self._show(text)
        self.details.value = f"<small>{html.escape(details)}</small>" if details else ""
        self._set_busy(False)

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        (self.sentence.add_class if busy else self.sentence.remove_class)("rl-busy")

    @contextlib.contextmanager
    def waiting(self, what: str, key: str, *, programs: Callable[[], Sequence[str]] = tuple) -> Iterator[Wait]:
        """Show what the block waits for at once, before anything blocks, and redraw it every
        ``TICK_SECONDS`` with the seconds since the action's click (``begin``: one clock for an
        action's waits and its sentence), the last wait of the same ``key`` as an estimate, and the
        program being built now (recorded in ``building_shown``) or ``programs()`` compiled so far.
        The wait joins ``core.waits`` (kind ``key``): its seconds are the next wait's estimate, and
        any progress display sees it. ``Wait.what`` changes what it waits for; ``say`` ends it."""
        self._set_busy(True)
        guess = WAITS.last(key)
        wait = Wait(what)

        def text(seconds: float) -> str:
            building = building_now()
            for b in building:
                if program_words(b.name) not in self.building_shown:
                    self.building_shown.append(program_words(b.name))
            return wait_text(wait.what, seconds, guess, programs(), building)

        ticker = Ticker(self._show, text, clock=self.clock, since=self.started)
        self._ticker = wait.ticker = ticker
        with WAITS.waiting(what, kind=key):
            ticker.start()
            try:
                yield wait
            finally:
                ticker.stop()
                if self._ticker is ticker:
                    self._ticker = None

    def stage(self, value: int) -> None:
        """Show the progress bar at ``value`` (of ``progress.max``)."""
        self.progress.value = value
        self.progress.layout.visibility = "visible"

    def done(self) -> None:
        self.progress.layout.visibility = "hidden"
        self._set_busy(False)


STEP_COUNTER = "global step"  # the one step counter the lab names (the cluster's syncs so far)
# Which cluster is live after a refusal or a failure, by whether the previous one was kept.
LIVE_AFTER = {True: "The cluster shown is still the previous one.", False: "No cluster is live now."}


def constructed(report: Mapping[str, Any], seconds: float) -> str:
    """After Construct: the rollout's branch (P3), the bytes held, measured, and the warnings as
    they stand now (``flow.warning_lines``). ``seconds``: since the click."""
    memory = report.get("memory") or {}
    warnings = warning_lines(report, short=True)
    return (
        f"Constructed in {seconds:.1f} s. Rollout: {rollout_text(report)}; "
        f"{fmt_bytes(memory.get('unique_bytes', 0))} held{on_where(memory)} (measured)"
        + (f"; warning: {'; '.join(warnings)}" if warnings else "")
        + "."
    )


def synced(sync: Mapping[str, Any], seconds: float) -> str:
    """After Sync weights (``seconds`` since the click): the global step it reached, the part of
    the synced bytes that arrived from other devices, and, apart, the bytes that crossed devices
    without staying (relayed), measured. The part is the report's ``arrived_cross_device_bytes``
    (``synced = arrived + copied + reused``, L3), so it is never more than the whole."""
    relayed = int(sync.get("relayed_cross_device_bytes", 0))
    return (
        f"Synced in {seconds:.2f} s, now at {STEP_COUNTER} {sync['global_step']}: "
        f"{fmt_bytes(sync['arrived_cross_device_bytes'])} of the {fmt_bytes(sync['synced_bytes'])} synced"
        f"{on_where(sync)} came from other devices"
        + (f", and {fmt_bytes(relayed)} more crossed devices without staying (relayed)" if relayed else "")
        + " (measured)."
    )


def stepped(
    global_step: int, mean_reward: float, seconds: float, waited: float = 0.0, rejected: str | None = None
) -> str:
    """After Training step (``seconds`` since the click, ``waited`` of them for the background
    compile): the global step its sync reached, the batch's mean reward, and the step record's
    ``rejected`` sentence when an optimizer step kept the previous parameters."""
    of_it = f" ({waited:.1f} s of it waiting for the background compile)" if waited > 0.05 else ""
    return (
        f"Training step done in {seconds:.1f} s{of_it}, now at {STEP_COUNTER} {global_step}: "
        f"mean reward {mean_reward:.3f}." + (f" Rejected: {rejected}." if rejected else "")
    )


def not_applied(action: str, pending: Sequence[tuple[str, str, str]]) -> str:
    """What an action on the constructed cluster did not use: the knobs changed since the last
    Construct, as (label, the constructed cluster's setting, the knob's setting now)."""
    if not pending:
        return ""
    said = "; ".join(f"{name}: {before}, not {now}" for name, before, now in pending)
    return f"{action} used the constructed cluster ({said}): Construct to apply the knobs."


def refused(kept: bool, outlined: bool, *, failed: bool = False) -> str:
    """After a refusal (the checks before a build) or a failure (of the action itself): where
    its message is (beside the outlined knob it names, or beside the buttons), and which
    cluster is live."""
    where = "see the note by the outlined knob" if outlined else "see the note by the buttons"
    return f"{'Failed' if failed else 'Refused'}: {where}. {LIVE_AFTER[kept]}"


def note_outlived(failed: bool, kept: bool) -> str:
    """After a knob changed while a refusal's (or failure's) note was shown: the note belonged to
    the settings before, so it is gone; which cluster is live."""
    return (
        f"The knobs changed since the {'failure' if failed else 'refusal'}, so its note is gone: "
        f"press Construct to try these settings. {LIVE_AFTER[kept]}"
    )


def said_before(note: str) -> str:
    """The details after a note was taken down: what it said, for the settings before."""
    return f"For the settings before the change: {note}" if note else ""


def details(
    timings: Mapping[str, Any],
    compiled: Sequence[tuple[str, float, bool]],
    waited: float,
    released: str = "",
    shown: Sequence[str] = (),
) -> str:
    """What the last action cost, measured: the seconds since the click and the work, the report
    and the redraw among them, the programs it compiled or read back from the compilation cache,
    those its waits showed being built in another thread (``shown``: the background compile's),
    and any wait for the background compile."""
    redrawn = ", ".join(timings.get("redrawn", [])) or "nothing"
    built = [program_words(name) for name, _, cached in compiled if not cached]
    loaded = sum(cached for _, _, cached in compiled)
    others = [name for name in shown if name not in {program_words(n) for n, _, _ in compiled}]
    parts = [
        f"{timings.get('total', 0):.2f} s from the click: {timings.get('work', 0):.2f} s work, "
        f"{timings.get('report', 0):.2f} s report, {timings.get('draw', 0):.2f} s drawing (redrawn: {redrawn})",
        (
            f"compiled {len(built)} program(s): {', '.join(built)}"
            if built
            else ("compiled nothing itself" if others else "nothing compiled")
        )
        + (f", read {loaded} from the compilation cache" if loaded else ""),
    ]
    if others:
        parts.append(f"built meanwhile in another thread (the background compile), as shown: {', '.join(others)}")
    if waited > 0.05:
        parts.append(f"waited {waited:.1f} s for the background compile of the step's programs")
    if released:
        parts.append(released)
    return "; ".join(parts) + "."
