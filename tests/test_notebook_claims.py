"""The notebooks' prose agrees with the outputs stored beside it.

nbval holds each ``# NBVAL_CHECK_OUTPUT`` cell's stored output to what the code prints; here the
Markdown around those cells is held to the stored outputs, from the committed files alone (no
kernel). Where a figure moves with the code (a leaf count, a peak, a padding width), the cell
prints it from the report and the prose points at it; what the prose still says is checked:

- 00: the padding width and every id that is not a byte are explained as the output shows them;
  the first step's work on other threads is said where the table has it.
- 02: no buffer count the P3 table does not show.
- 05: the run the prose calls the highest peak is the table's; a partition spec the prose gives
  is printed by the cell below it.
- 06: only a copy the sync is not faster than is called its floor.
- 08: the host figures of a sync add up and the prose says which crosses; the resident bytes it
  quotes are the table's; the per-device figures say they draw rest and peak apart.
- every notebook: no words about the lab's history or the machine its outputs were made on.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcluster_lab.core.limits import fmt_bytes

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


class Notebook:
    """A committed notebook's cells: each one's source and, for code, its stored output as text."""

    def __init__(self, path: Path) -> None:
        self.name = path.stem
        self.cells = json.loads(path.read_text())["cells"]

    @classmethod
    def named(cls, prefix: str) -> Notebook:
        return cls(next(p for p in NOTEBOOKS if p.stem.startswith(prefix)))

    def source(self, i: int) -> str:
        return "".join(self.cells[i]["source"])

    def output(self, i: int) -> str:
        parts = []
        for out in self.cells[i].get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
        return "".join(parts)

    def code_cell(self, needle: str) -> int:
        """The index of the one code cell whose source contains ``needle``."""
        (i,) = [i for i, c in enumerate(self.cells) if c["cell_type"] == "code" and needle in self.source(i)]
        return i

    def markdown_after(self, i: int) -> str:
        """The Markdown between code cell ``i`` and the next code cell."""
        texts = []
        for cell in self.cells[i + 1 :]:
            if cell["cell_type"] == "code":
                break
            texts.append("".join(cell["source"]))
        return " ".join(" ".join(texts).split())

    def markdown(self) -> list[tuple[int, str]]:
        return [(i, self.source(i)) for i, c in enumerate(self.cells) if c["cell_type"] == "markdown"]


def _table(text: str) -> list[dict[str, str]]:
    """The first table ``experiments.format_table`` printed in ``text``, as rows of strings: its
    columns are where the dashes under the header are; it ends at a line that does not fit them."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"-+(\s+-+)*", line.strip()))
    cuts = [m.start() for m in re.finditer(r"-+", lines[start])]

    def cells(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in zip(cuts, [*cuts[1:], None])]

    def fits(line: str) -> bool:
        return bool(line.strip()) and all(line[a - 2 : a] == "  " for a in cuts[1:] if len(line) > a)

    rows = [cells(line) for line in itertools.takewhile(fits, lines[start + 1 :])]
    return [dict(zip(cells(lines[start - 1]), row)) for row in rows]


def _int(text: str) -> int:
    return int(text.replace(",", ""))


# ------------------------------------------------------------------ 00: what generate returns, the first step


def test_00_the_padding_and_the_ids_that_are_not_bytes_are_explained_as_the_output_shows_them():
    nb = Notebook.named("00")
    cell = nb.code_cell("left_padded_prompt_tokens[0]")
    out = nb.output(cell)
    said = " ".join([nb.markdown_after(cell - 2), nb.source(cell - 1), out])
    prompt = [int(x) for x in re.search(r"left_padded_prompt_tokens\[0\]: \[([\d\s]+)\]", out).group(1).split()]
    tokens = [int(x) for x in re.search(r"tokens\[0\]:\s+\[([\d\s]+)\]", out).group(1).split()]
    longest = sum(1 for i in prompt if i != 256)
    if re.search(r"left-padded to the longest", said):
        assert len(prompt) == longest, f"the prose pads to the longest prompt, the row is {len(prompt)} wide"
    width = re.search(r"left-padded to (\d+) ids", said)
    assert width and int(width.group(1)) == len(prompt)
    # Every id that is not a byte, in the row shown, is named or inside a range named.
    named = {int(n) for n in re.findall(r"\b(\d+)\b(?!-)", said)}
    for a, b in re.findall(r"\b(\d+)-(\d+)\b", said):
        named |= set(range(int(a), int(b) + 1))
    assert sorted({i for i in prompt + tokens if i >= 256} - named) == []


def test_00_the_first_steps_work_on_other_threads_is_said_where_the_table_has_it():
    nb = Notebook.named("00")
    cell = nb.code_cell("sp.compare_rows(steps[0], steps[1])")
    out = nb.output(cell)
    rows = _table(out)
    column = next(k for k in rows[0] if k.endswith("other threads meanwhile ms"))
    beside = {r["phase"]: float(r[column]) for r in rows if float(r[column]) > 0}
    prose = nb.markdown_after(cell)
    for share, phase in re.findall(r"(most|all|some|part) of it on `([^`]+)`'s row", prose):
        whole = beside.get(phase, 0) == sum(beside.values())
        assert (share == "all") == whole, f"the prose says {share} of it is beside {phase}: the table has {beside}"
    if not beside:
        assert "No other thread traced or compiled during step 0." in out
        return
    said = re.search(r"Other threads traced and compiled for ([\d.]+) ms during step 0: (.*)\.", out)
    assert said, "the line under the table is missing"
    assert float(said.group(1)) == pytest.approx(sum(beside.values()), abs=0.1 * len(beside))
    assert dict((p, float(ms)) for ms, p in re.findall(r"([\d.]+) ms \(\d+%\) beside ([^;]+)", said.group(2))) == beside


def test_00_the_helper_threads_the_prose_has_compile_beside_the_first_step_show_in_its_table():
    nb = Notebook.named("00")
    cell = nb.code_cell("sp.compare_rows(steps[0], steps[1])")
    rows = _table(nb.output(cell))
    column = next(k for k in rows[0] if k.endswith("other threads meanwhile ms"))
    assert re.search(r"helper threads, so their time shows in the last column", nb.markdown_after(cell))
    assert any(float(r[column]) > 0 for r in rows), "the prose has helper threads; the table shows none"


# ------------------------------------------------------------------ 02: the rollout's buffers


def test_02_the_buffer_counts_the_prose_gives_are_the_tables():
    nb = Notebook.named("02")
    cell = nb.code_cell("print(ex.format_table(p3_rows))")
    rows = _table(nb.output(cell))
    buffers = {_int(r["rollout buffers"]) for r in rows}
    prose = nb.markdown_after(cell)
    said = [int(n) for n in re.findall(r"\b(\d+) (?:device )?buffers\b", prose)]
    assert [n for n in said if n not in buffers] == [], f"the table's rollout buffers are {sorted(buffers)}"
    devices = [int(n) for n in re.findall(r"on the (\d+) rollout devices", prose)] or [1]
    leaves = [int(n) for n in re.findall(r"\b(\d+) leaves\b", prose)]
    assert [n for n in leaves if not any(n * d in buffers for d in devices)] == []


# ------------------------------------------------------------------ 05: the transient peak, the specs


def test_05_the_highest_peak_the_notebook_names_is_the_tables():
    nb = Notebook.named("05")
    cell = nb.code_cell("sync_peaks.peak_rows(syncs)")
    out = nb.output(cell)
    peaks = {r["run"]: _int(r["device peak"]) for r in _table(out)}
    moved = {r["run"]: _int(r["moved_cross_device"]) for r in _table(nb.output(nb.code_cell("ex.sync_rows(syncs)")))}
    highest, most = max(peaks, key=peaks.get), max(moved, key=moved.get)
    said = re.search(
        r"highest device peak: ([^,]+, \w+), ([\d,]+) bytes .*moves the most between devices: ([^,]+, \w+)", out
    )
    assert said, "the answer under the table is missing"
    assert (said.group(1), _int(said.group(2)), said.group(3)) == (highest, peaks[highest], most)
    # Prose that calls a layout the highest names one that is, for the full actor or with LoRA.
    tops = {max((r for r in peaks if r.endswith(v)), key=peaks.get).split(",")[0] for v in ("full", "LoRA")}
    for _, text in nb.markdown():
        for part in re.split(r"\n(?=- )|\n\n", text):
            if "the highest" in part:
                named = set(re.findall(r"\*\*(colocated|reshaped|split)\*\*", part))
                assert named <= tops, f"{part!r}: the highest peaks are {tops}"


def test_05_a_partition_spec_the_prose_gives_is_printed_by_a_cell_beside_it():
    nb = Notebook.named("05")
    code = [j for j, c in enumerate(nb.cells) if c["cell_type"] == "code"]
    for i, text in nb.markdown():
        for spec in re.findall(r"`(P?\([^`]*\))`", text):
            if not re.fullmatch(r"P?\(((None|'\w+'),?\s*)*\)", spec):
                continue  # not a spec: a mesh shape, a call
            parts = [p.strip() for p in spec.split("(", 1)[1].rstrip(")").split(",") if p.strip()]
            written = f"P({', '.join(parts)})"
            above = max((j for j in code if j < i), default=None)
            below = min((j for j in code if j > i), default=None)
            beside = " ".join(nb.output(j) for j in (above, below) if j is not None)
            assert written in beside, f"cell {i} gives the spec {spec}; cells {above} and {below} print no such spec"


# ------------------------------------------------------------------ 06: a floor is what the sync does not beat


def test_06_only_a_copy_the_sync_is_not_faster_than_is_called_its_floor():
    nb = Notebook.named("06")
    cell = nb.code_cell("chip_figures(")
    ms = {r["operation"]: float(r["ms"]) for r in _table(nb.output(cell).split("\n", 1)[1])}
    sync = next(v for k, v in ms.items() if k.startswith("sync_weights"))
    beaten = [k for k, v in ms.items() if v > sync]
    words = {"one jax.device_put": "device_put", "one compiled copy": "compiled"}
    text = " ".join(" ".join(t.split()) for _, t in nb.markdown())
    for sentence in re.split(r"(?<=\.)\s", text):
        if re.search(r"\bfloors?\b", sentence):
            for operation in beaten:
                word = next((w for k, w in words.items() if operation.startswith(k)), None)
                assert word is None or word not in sentence, f"{sentence!r}: the sync beats {operation}"


# ------------------------------------------------------------------ 08: hosts, a step's peak


def test_08_a_syncs_host_figures_add_up_and_the_prose_says_which_crosses():
    nb = Notebook.named("08")
    cell = nb.code_cell("summary.host_rows(two_nodes)")
    out = nb.output(cell)

    def mib(pattern: str) -> float:
        found = re.search(pattern, out)
        assert found, f"the line for {pattern!r} is missing"
        value, unit = float(found.group(1)), found.group(2)
        return value * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]

    moved = mib(r"([\d.]+) (\wiB) of it from other devices")
    across = mib(r"([\d.]+) (\wiB) must cross between hosts")
    within = mib(r"([\d.]+) (\wiB) are copies of those blocks")
    assert across + within == pytest.approx(moved)
    route = nb.output(nb.code_cell('sync["plan"]'))
    shards = [float(x) for x in re.findall(r"\d+->\d+ ([\d.]+) MiB", route)]
    assert sum(shards) == pytest.approx(moved, rel=0.01)
    prose = " ".join([nb.markdown_after(cell - 2), nb.source(cell - 1)])
    if within > 0:
        assert not re.search(r"every byte a .{0,40} hands over crosses", prose)


def test_08_the_resident_bytes_the_prose_quotes_are_the_tables():
    nb = Notebook.named("08")
    rows = {r["plan"]: r for r in _table(nb.output(nb.code_cell("summary.verdict_row(label, p)")))}
    text = " ".join(" ".join(t.split()) for _, t in nb.markdown())
    said = re.search(r"on `gpu-8` needs ([\d.]+ GiB) of each GPU's ([\d.]+ GiB)", text)
    assert said and said.groups() == (rows["gpu-8, full"]["resident"], rows["gpu-8, full"]["per device"])


def test_08_the_per_device_figures_say_they_draw_rest_and_peak():
    # The figure is a picture (tests/test_plan_figures.py checks its bars); the prose before it
    # must say what the bars are, or a reader takes rest for what the device must hold.
    nb = Notebook.named("08")
    cells = [i for i, c in enumerate(nb.cells) if c["cell_type"] == "code" and "plan_memory(" in nb.source(i)]
    assert cells
    said = " ".join(" ".join(nb.source(j).split()) for j in range(cells[0]) if nb.cells[j]["cell_type"] == "markdown")
    assert re.search(r"at rest.{0,200}\bpeak\b", said.split("## Hosts")[-1])


# ------------------------------------------------------------------ every notebook


HISTORY = re.compile(r"\b(no longer|an earlier version|earlier versions?|shared machine|this 2-core machine)\b", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_words_about_the_labs_history_or_the_machine_its_outputs_were_made_on(path):
    nb = Notebook(path)
    found = [f"cell {i}: {m.group(0)!r}" for i in range(len(nb.cells)) for m in HISTORY.finditer(nb.source(i))]
    assert found == []


# ------------------------------------------------------------------ the sentences the cells print, over drawn inputs
# The cells print these sentences from the reports; each is held here to the figures it is
# built from, over drawn inputs as the lab's words are (tests/test_lab_agrees.py), not only
# over the one run stored in a notebook.


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.dictionaries(
        st.sampled_from(["colocated, full", "reshaped, full", "split, full", "reshaped, LoRA", "split, LoRA"]),
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 7)),
        min_size=1,
    )
)
def test_the_peak_answer_names_the_highest_peak_and_the_most_moved(runs):
    from rlcluster_lab.lab.experiments.sync_peaks import peak_answer

    syncs = {
        label: {
            "moved_cross_device_bytes": moved,
            "transient_peak": {"max_bytes": {"device": peak}, "max_device": device, "phase_at_peak": {device: "move"}},
        }
        for label, (peak, moved, device) in runs.items()
    }
    pattern = (
        r"highest device peak: (.+?), ([\d,]+) bytes .*; "
        r"moves the most between devices: (.+?), ([\d,]+) bytes: (.*)"
    )
    said = re.fullmatch(pattern, peak_answer(syncs))
    assert said
    highest, most = said.group(1), said.group(3)
    assert _int(said.group(2)) == max(p for p, _, _ in runs.values()) == runs[highest][0]
    assert _int(said.group(4)) == max(m for _, m, _ in runs.values()) == runs[most][1]
    assert said.group(5) == ("the same sync" if highest == most else "another sync")


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["tiny", "small", "llama3-8b"]),
    topology=st.sampled_from(["local", "gpu-8", "gpu-2x8", "tpu-v5p-64"]),
    layout=st.sampled_from(["colocated", "reshaped", "split"]),
    lora=st.booleans(),
)
def test_a_syncs_lines_add_up_for_drawn_plans(model, topology, layout, lora):
    from rlcluster_lab.planner import plan_cluster, summary

    plan = plan_cluster(model, topology, layout=layout, lora_rank=16 if lora else None)
    lines = summary.sync_lines(plan)
    sync = plan.sync
    assert sync["cross_host_bytes"] + sync["within_host_cross_device_bytes"] == sync["moved_cross_device_bytes"]
    for key in ("synced_bytes", "moved_cross_device_bytes", "cross_host_bytes", "within_host_cross_device_bytes"):
        assert fmt_bytes(sync[key]) in lines, key


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    prompts=st.lists(st.text(st.characters(codec="utf-8"), max_size=40), min_size=1, max_size=4),
    new_tokens=st.integers(1, 64),
    cache=st.integers(16, 128),
)
def test_the_padding_words_say_the_width_the_sampler_pads_to(prompts, new_tokens, cache):
    from types import SimpleNamespace

    from rlcluster_lab.lab.experiments.step_phases import sample_words
    from rlcluster_lab.model.sampling import PROMPT_BUCKET, prompt_width
    from rlcluster_lab.model.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    longest = max(len(tok.encode(p)) for p in prompts)
    width = prompt_width(tok, prompts, new_tokens, cache)
    out = SimpleNamespace(left_padded_prompt_tokens=tok.encode_batch_left_padded(prompts, length=width))
    said = sample_words(tok, out)
    assert f"left-padded to {width} ids" in said
    rounded = f"rounded up to a multiple of {PROMPT_BUCKET}" in said
    assert rounded == (width > longest) and (not rounded or width % PROMPT_BUCKET == 0)
    spare = re.search(r"(\d+)-(\d+) mean nothing", said)
    assert (int(spare.group(1)), int(spare.group(2))) == (tok.eos_id + 1, tok.vocab_size - 1)
