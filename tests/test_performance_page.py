"""docs/performance.md is what ``benchmarks/page.py`` writes from the rows the benchmarks stored
(docs/performance_rows.json): every row of the page is a stored row and every stored row is on
the page, every command it names is a benchmark with those flags, every missed target says why,
and the README quotes the page's figures. Nothing here runs a benchmark."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
PAGE = REPO / "docs" / "performance.md"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_benchmarks_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


page = _load("page")
common = _load("common")
ROWS = page.load_rows()
TEXT = PAGE.read_text(encoding="utf-8")


def test_the_page_is_what_page_py_writes_from_the_stored_rows():
    assert TEXT == page.render(ROWS), "run `python benchmarks/page.py > docs/performance.md`"


def test_every_row_on_the_page_is_a_stored_row_and_every_stored_row_is_on_the_page():
    header = "| figure | measured | machine | date | commit | target | met | command |"
    on_page = [line for line in TEXT.splitlines() if line.startswith("| ") and line != header]
    stored = [page.table_line(r) for r in ROWS]
    assert sorted(on_page) == sorted(stored)
    assert len(set(stored)) == len(stored), "two stored rows read the same"
    assert len({(r["key"], r["machine"]) for r in ROWS}) == len(ROWS), "a figure stored twice for one machine"


def test_the_page_fits_on_one_page():
    assert len(TEXT.splitlines()) <= 350


def _flags_of(script: Path) -> set[str]:
    """The long options a benchmark's parser takes: its own, and common.parser's when it uses that."""
    source = script.read_text(encoding="utf-8")
    if "common.parser(" in source or "common.add_row_options(" in source:
        source += (BENCHMARKS / "common.py").read_text(encoding="utf-8")
    return set(re.findall(r"add_argument\(\s*\"(--[a-z-]+)\"", source))


@pytest.mark.parametrize("command", sorted({r["command"] for r in ROWS}))
def test_every_command_is_a_benchmark_with_those_flags(command):
    argv = shlex.split(command)
    assert argv[0] == "python" and argv[1].startswith("benchmarks/"), command
    script = REPO / argv[1]
    assert script.is_file(), f"{argv[1]} is not in the repository"
    flags = {a.split("=")[0] for a in argv[2:] if a.startswith("--")}
    assert flags <= _flags_of(script), f"{argv[1]} takes no {sorted(flags - _flags_of(script))}"
    # The stored command is what the benchmark prints for itself (common.command_line).
    assert common.command_line([str(script), *argv[2:], "--save-row", "x.json"]) == command


def test_every_benchmark_that_gives_rows_takes_save_row():
    for script in {REPO / shlex.split(r["command"])[1] for r in ROWS}:
        assert "--save-row" in _flags_of(script), script.name
        assert "common.emit_rows(" in script.read_text(encoding="utf-8"), script.name


def test_every_stored_row_is_well_formed():
    areas = {a for a, _, _ in page.AREAS}
    for r in ROWS:
        where = f"{r['key']} on {r['machine']}"
        assert r["area"] in areas, where
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r["date"]), where
        # A figure measured with uncommitted changes cannot be reproduced at a commit.
        assert re.fullmatch(r"[0-9a-f]{7,40}", r["commit"]), f"{where}: commit {r['commit']!r}"
        assert r["runs"], where
        for run in r["runs"]:
            assert run["shown"] and isinstance(run["value"], int | float | list), where
            if isinstance(run["value"], list):
                low, high = run["value"]
                assert low <= high, where
        target = r["target"]
        assert target is None or set(target) in ({"at_most", "shown"}, {"ends", "shown"}), where
        if target is not None and "ends" in target:
            assert all(isinstance(run.get("ok"), bool) for run in r["runs"]), where


def test_every_commit_named_is_in_the_history():
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git checkout: the history cannot be read")
    for commit in sorted({r["commit"] for r in ROWS}):
        found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, check=False)
        assert found.returncode == 0, f"{commit} is not a commit of this repository"


def test_every_missed_target_gives_its_reason_and_every_reason_a_missed_target():
    missed = {(r["key"], r["machine"]) for r in page.missed(ROWS)}
    assert missed == set(page.REASONS)


def _run(value, ok=None):
    return {"value": value, "shown": str(value), **({} if ok is None else {"ok": ok})}


def test_met_reads_every_run_against_the_target():
    at_most = {"at_most": 1.0, "shown": "<= 1.0"}
    row = {"target": at_most, "runs": [_run(0.9)]}
    assert page.met(row) == "yes"
    assert page.met(dict(row, runs=[_run(1.2), _run(1.1)])) == "no"
    assert page.met(dict(row, runs=[_run(0.9), _run(1.1), _run(1.3)])) == "in 1 of 3 runs"
    assert page.met(dict(row, runs=[_run([0.9, 1.1])])) == "partly"
    assert page.met(dict(row, runs=[_run([0.8, 1.0])])) == "yes"
    assert page.met(dict(row, target=None)) == "-"
    ends = {"ends": True, "shown": "runs to its end"}
    assert page.met({"target": ends, "runs": [_run(3.0, ok=False)]}) == "no"


def _row(key, commit, value, command="python benchmarks/x.py", machine="2-core CPU"):
    return {
        "key": key,
        "machine": machine,
        "commit": commit,
        "command": command,
        "date": "2026-01-01",
        "runs": [_run(value)],
    }


def test_a_saved_row_replaces_its_figure_or_joins_it_as_another_run():
    stored = [_row("a", "abc1234", 1.0), _row("b", "abc1234", 2.0)]
    again = common.merge_rows(stored, [_row("a", "abc1234", 1.5)])
    assert [run["value"] for run in again[0]["runs"]] == [1.0, 1.5]
    newer = common.merge_rows(stored, [_row("a", "def5678", 0.5)])
    assert [run["value"] for run in newer[0]["runs"]] == [0.5] and newer[0]["commit"] == "def5678"
    other_flags = common.merge_rows(stored, [_row("a", "abc1234", 0.5, "python benchmarks/x.py --quick")])
    assert [run["value"] for run in other_flags[0]["runs"]] == [0.5]
    elsewhere = common.merge_rows(stored, [_row("a", "abc1234", 9.0, machine="one TPU v5e chip")])
    assert len(elsewhere) == 3 and elsewhere[:2] == stored
    assert stored[0]["runs"] == [_run(1.0)], "the stored rows were changed in place"


def test_the_readme_quotes_the_pages_figures_for_the_suite():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    prose = " ".join(readme.split())
    suite = [r for r in ROWS if r["area"] == "suite"]
    assert suite
    for r in suite:
        shown = r["runs"][-1]["shown"]
        figure = shown.split(" (")[0]
        assert figure in prose, f"README does not quote {r['figure']}: {figure}"
        tests = re.search(r"\(([\d,]+ tests)\)", shown)
        assert tests is None or tests[1] in prose, f"README does not quote {r['figure']}: {tests[1]}"
    assert "docs/performance.md#the-test-suite" in readme


# Words about how the lab was made or measured, which nothing it ships may say (a Jupyter server's
# /api/sessions is an address, not a word about the lab's making).
HISTORY_WORDS = re.compile(
    r"\b((?<!/api/)sessions?|lent|device machines?|not drawn|device time|chip time)\b", re.IGNORECASE
)


def test_the_docs_and_benchmarks_say_nothing_of_how_the_lab_was_made():
    shipped = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    shipped += sorted(BENCHMARKS.glob("*.py"))
    found = [
        f"{path.relative_to(REPO)}:{i}: {line.strip()}"
        for path in shipped
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY_WORDS.search(line)
    ]
    assert found == []
