"""The CLI's progress line: what a command waits for (``core.waits``), on one line of stderr,
redrawn in place until the wait ends, then erased. Only on a terminal, never with ``--json``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TextIO

from rlcluster_lab.core.waits import WAITS, Waits

DELAY_S = 0.5
INTERVAL_S = 0.25
WIDTH = 120  # longer lines are cut: a wrapped line could not be rewritten in place

_ERASE = "\r\x1b[K"  # back to the start of the line, erase to its end


class ProgressLine:
    """Shows ``waits.status()`` on ``stream`` once a wait has lasted ``DELAY_S`` seconds, one line
    redrawn every ``INTERVAL_S`` seconds by a thread (``start``, ``stop``); a wait that begins or
    ends draws at once (``tick``), so the line is gone before anything else is printed."""

    def __init__(self, stream: TextIO, waits: Waits = WAITS) -> None:
        self.stream = stream
        self.waits = waits
        self.shown = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe = None

    def tick(self) -> str:
        """Draw what is waited for now, or erase the line; returns the text shown ("" for none)."""
        status = self.waits.status()
        text = status.line()[:WIDTH] if status is not None and status.elapsed_s >= DELAY_S else ""
        with self._lock:
            try:
                if text or self.shown:  # draw the line, or erase the one shown
                    self.stream.write(_ERASE + text)
                    self.stream.flush()
            except (OSError, ValueError):  # stderr went away: nothing more to show
                self._stop.set()
                text = ""
            self.shown = text
        return text

    def start(self) -> ProgressLine:
        self._unsubscribe = self.waits.subscribe(self.tick)
        self._thread = threading.Thread(target=self._run, name="rlcluster-lab progress line", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.shown:
                with contextlib.suppress(OSError, ValueError):
                    self.stream.write(_ERASE)
                    self.stream.flush()
                self.shown = ""

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.tick()


def wants_progress(stream: TextIO | None, json_output: bool) -> bool:
    """A progress line only on a terminal, and never when the output is JSON."""
    if json_output or stream is None:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def progress_line(stream: TextIO | None, *, json_output: bool) -> Iterator[ProgressLine | None]:
    """A running ``ProgressLine`` on ``stream`` for the block, or None where none is wanted."""
    if not wants_progress(stream, json_output):
        yield None
        return
    line = ProgressLine(stream).start()
    try:
        yield line
    finally:
        line.stop()
