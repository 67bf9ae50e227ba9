"""The CLI's progress line: what a command waits for, on one line of stderr, rewritten in place.

Any wait (``core.waits``) that has lasted ``delay`` seconds (half a second) is
shown on stderr and redrawn every ``interval`` seconds (a quarter of a second)
until it ends, when the line is erased: what is waited for, the seconds so far,
the last comparable wait's duration when there was one, and the programs being
traced, lowered or compiled. Only on a terminal, and never with ``--json``:
piped or scripted output stays exactly what it was.
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
    """Shows ``waits.status()`` on ``stream``, one line rewritten in place.

    ``tick()`` draws once (tests call it with a fake clock); ``start()`` runs a
    thread that ticks every ``interval`` seconds, ``stop()`` ends it and erases
    the line. A wait that begins or ends ticks at once, so the line is gone
    before anything else is printed.
    """

    def __init__(
        self, stream: TextIO, waits: Waits = WAITS, *, delay: float = DELAY_S, interval: float = INTERVAL_S
    ) -> None:
        self.stream = stream
        self.waits = waits
        self.delay = delay
        self.interval = interval
        self.shown = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe = None

    def tick(self) -> str:
        """Draw what is waited for now (or erase the line when nothing has waited ``delay``
        seconds); returns the text shown ("" for none)."""
        status = self.waits.status()
        text = status.line()[:WIDTH] if status is not None and status.elapsed_s >= self.delay else ""
        with self._lock:
            try:
                if text:
                    self.stream.write(_ERASE + text)
                    self.stream.flush()
                elif self.shown:
                    self.stream.write(_ERASE)
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
        while not self._stop.wait(self.interval):
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
    assert stream is not None
    line = ProgressLine(stream).start()
    try:
        yield line
    finally:
        line.stop()
