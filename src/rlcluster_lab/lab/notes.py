"""Notes beside the lab's controls: a refusal's message next to the knob it names.

Each control that can be named gets a slot: the control, and a note that is hidden until a
refusal names it. The note is placed beside the control, over whatever lies to its right
(the views), out of the page's flow (``display.STYLE``: ``.rl-note``), so showing or hiding
it moves nothing: the knob under the cursor stays where it was.
"""

from __future__ import annotations

import html
from collections.abc import Mapping

import ipywidgets as widgets


class Notes:
    """One hidden note per named control, shown beside it on demand (one at a time)."""

    def __init__(self) -> None:
        self._notes: dict[str, widgets.HTML] = {}
        self.shown: str | None = None  # the control whose note is shown
        self.text: str | None = None  # what it says

    def wrap(self, box: widgets.Box, targets: Mapping[str, widgets.Widget]) -> None:
        """Put each of ``targets`` found inside ``box`` (at any depth of boxes) into a slot with
        its own note; the rest of the layout is unchanged."""
        by_id = {id(w): name for name, w in targets.items()}
        children = []
        for child in box.children:
            name = by_id.get(id(child))
            if name is not None:
                note = widgets.HTML(layout=widgets.Layout(display="none"))
                note.add_class("rl-note")
                note.add_class(f"rl-note-{name}")
                self._notes[name] = note
                slot = widgets.VBox([child, note])
                slot.add_class("rl-slot")
                children.append(slot)
            else:
                if isinstance(child, widgets.Box):
                    self.wrap(child, targets)
                children.append(child)
        box.children = tuple(children)

    def names(self) -> list[str]:
        return list(self._notes)

    def show(self, name: str, title: str, message: str, after: str = "") -> None:
        """Show the note beside ``name`` (hiding any other): a bold title, the message, and a
        last line in italics."""
        self.clear()
        note = self._notes[name]
        note.value = f"<b>{html.escape(title)}</b>: {html.escape(message)}" + (
            f"<br><i>{html.escape(after)}</i>" if after else ""
        )
        note.layout.display = "block"
        self.shown, self.text = name, f"{title}: {message}"

    def clear(self) -> None:
        for note in self._notes.values():
            note.value = ""
            note.layout.display = "none"
        self.shown = self.text = None

    def note(self, name: str) -> widgets.HTML:
        """The note widget beside ``name``."""
        return self._notes[name]
