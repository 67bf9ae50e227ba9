"""The docs' figures and claims, each read from the page and held to what the lab computes or does.

A figure written in prose drifts when the code changes; here each one the docs give is read
back from the page (so a sentence reworded without its figure fails, saying so) and compared
with the lab's own answer: the planner's, the progress line's, the sampler's, the files'.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from rlcluster_lab import Scenario
from rlcluster_lab.core.limits import fmt_bytes
from rlcluster_lab.core.waits import Building, WaitStatus

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _prose(path: Path) -> str:
    """A page's text on one line (a sentence may wrap anywhere)."""
    return " ".join(path.read_text().split())


def _claim(path: Path, pattern: str) -> re.Match[str]:
    found = re.search(pattern, _prose(path))
    assert found, f"{path.name} does not say what this test checks ({pattern}): update both together"
    return found


# ------------------------------------------------------------------ docs/measuring.md: the planner's figures


def test_the_chunked_sync_peaks_measuring_gives_are_the_plans():
    from rlcluster_lab.planner import plan_scenario

    said = _claim(
        DOCS / "measuring.md",
        r"small model's reshaped full sync, .*? peaks at (?P<whole>[\d.]+ \w+) on its busiest device in one piece, "
        r"(?P<mib>[\d.]+ \w+) in (?P<n_mib>\d+) chunks of at most 1 MiB and (?P<kib>[\d.]+ \w+) in (?P<n_kib>\d+) "
        r"chunks of at most 256 KiB, its largest leaf \(.*?\) being (?P<leaf>[\d.]+ \w+)",
    )
    peaks = {}
    for chunk in (None, 1 << 20, 256 << 10):
        scenario = Scenario(layout="reshaped", model_size="small", sync_chunk_bytes=chunk)
        peaks[chunk] = plan_scenario(scenario, sync_programs=True).sync["transient_peak"]
    device = {chunk: fmt_bytes(p["max_bytes"]["device"]) for chunk, p in peaks.items()}
    assert said["whole"] == device[None] and peaks[None]["chunks"] == 1
    assert (said["mib"], int(said["n_mib"])) == (device[1 << 20], peaks[1 << 20]["chunks"])
    assert (said["kib"], int(said["n_kib"])) == (device[256 << 10], peaks[256 << 10]["chunks"])
    # Below the largest leaf every chunk over the limit is one leaf alone: the largest chunk is that leaf.
    assert said["leaf"] == fmt_bytes(peaks[256 << 10]["largest_chunk_bytes"])


def test_the_70b_full_fine_tuning_peak_measuring_gives_is_the_plans():
    from rlcluster_lab.planner import Workload, plan_cluster

    said = _claim(
        DOCS / "measuring.md",
        r"70B full fine-tuning on `gpu-8` peaks at (?P<peak>[\d.]+) GiB of (?P<memory>[\d.]+) GiB per device during "
        r"the (?P<phase>[\w ]+?) \(nor does it fit on `gpu-2x8`, rematerialised or not: [^;]+; it fits on `gpu-8` "
        r"with LoRA\)",
    )
    full = plan_cluster("llama3-70b", "gpu-8")
    busiest = max(full.per_device, key=lambda d: d.peak_bytes)
    assert said["peak"] == f"{busiest.peak_bytes / 2**30:.1f}"
    assert said["memory"] == f"{busiest.memory / 2**30:.1f}"
    assert said["phase"] == busiest.peak_phase.replace("_", " ")
    assert not full.fits["all_fit"]
    assert not plan_cluster("llama3-70b", "gpu-2x8").fits["all_fit"]
    assert not plan_cluster("llama3-70b", "gpu-2x8", workload=Workload(remat=True)).fits["all_fit"]
    assert plan_cluster("llama3-70b", "gpu-8", lora_rank=16).fits["all_fit"]


# ------------------------------------------------------------------ docs/usage.md: the progress line


def test_the_progress_line_usage_shows_is_one_the_lab_draws():
    from rlcluster_lab.app import learner

    said = _claim(DOCS / "usage.md", r"with their own seconds: `(?P<line>[^`]+)`")["line"]
    status = WaitStatus(
        labels=("step 1 of 30", "update_actor"),
        elapsed_s=2.4,
        stage_elapsed_s=2.4,
        building=(Building("compiling", "jit(grpo_train_step)", 1.9),),
    )
    assert said == status.line()
    # The labels are the learner's own: its steps, and the wait of its update.
    source = Path(learner.__file__).read_text()
    assert 'waiting(f"step {i + 1} of {total}"' in source and 'waiting("update_actor")' in source


# ------------------------------------------------------------------ docs/reference.md: sampler against scorer


@pytest.mark.cluster
def test_sampler_and_scorer_log_probs_agree_as_reference_says():
    from rlcluster_lab import build_cluster

    said = _claim(DOCS / "reference.md", r"sampler and scorer log-probs agree (?P<how>exactly|to float32 rounding)")
    cluster = build_cluster(Scenario(layout="colocated", max_tokens=8))
    out = cluster.generate(["hello", "a", "the quick brown fox", "xyz"])
    scored = np.asarray(cluster.get_actor_per_token_logps(out.left_padded_prompt_tokens, out.tokens))
    gap = float(np.abs(scored - out.logprobs).max())
    if said["how"] == "exactly":
        assert gap == 0.0
    else:  # a few units in the last place of the largest log-prob
        assert gap <= 16 * float(np.spacing(np.float32(np.abs(out.logprobs).max())))


# ------------------------------------------------------------------ docs/guarantees.md: a closed pipe


@pytest.mark.cluster
def test_the_closed_pipe_guarantees_gives_ends_with_the_status_it_says():
    said = _claim(
        DOCS / "guarantees.md", r"\(`plan --json \| head -c (?P<bytes>\d+)`\) ends quietly with status (?P<status>\d+)"
    )
    # A reader that takes some bytes and leaves races the writer: the whole output may fit the
    # pipe's buffer before it leaves (status 0), or not (141). Only a reader gone before the first
    # byte is written stops the command every time, so only that example can promise a status.
    assert said["bytes"] == "0", "`head -c N` with N > 0 ends with 0 or 141 depending on timing"
    read, write = os.pipe()
    os.close(read)  # head -c 0 leaves at once, long before an interpreter has started
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlcluster_lab", "plan", "--json"], stdout=write, stderr=subprocess.PIPE, text=True
    )
    os.close(write)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == int(said["status"]), err
    assert err == ""


# ------------------------------------------------------------------ the docs' commands over files


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_every_notebook_glob_the_docs_give_reaches_every_notebook():
    pages = [*DOCS.glob("*.md"), ROOT / "CONTRIBUTING.md", ROOT / "README.md"]
    globs = {m for p in pages for m in re.findall(r"notebooks/[^\s`]*[*?\[][^\s`]*\.ipynb", p.read_text())}
    assert globs, "the docs give no notebook glob any more: drop this test"
    for pattern in globs:
        assert sorted(Path(p) for p in glob.glob(str(ROOT / pattern))) == NOTEBOOKS, pattern


def _extras_closure(extras: set[str]) -> set[str]:
    """Every requirement ``pip install -e .[extras]`` installs besides the package's own (extras that
    name the package itself, ``rlcluster-lab[lab]``, opened up)."""
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found, todo = set(), list(extras)
    while todo:
        for req in optional[todo.pop()]:
            inner = re.fullmatch(r"rlcluster-lab\[([\w,]+)\]", req)
            if inner:
                todo += inner.group(1).split(",")
            else:
                found.add(req)
    return found


def test_environment_yml_installs_what_make_test_installs():
    env = re.search(r"-e \.\[([\w,]+)\]", (ROOT / "environment.yml").read_text())
    make = re.search(
        r"\$\(TEST_STAMP\):.*?pip install --quiet -e \"\.\[([\w,]+)\]\"", (ROOT / "Makefile").read_text(), re.S
    )
    assert env and make
    assert _extras_closure(set(env.group(1).split(","))) == _extras_closure(set(make.group(1).split(",")))


def test_contributing_quotes_no_time_of_its_own():
    # The suite's times are measured and kept on one page (docs/performance.md, checked against the
    # benchmarks' stored results there); a figure copied here would drift from it.
    text = _prose(ROOT / "CONTRIBUTING.md")
    durations = re.findall(r"\b\d[\d,.]*\s*(?:minutes?|min|seconds?|s)\b(?!\w)", text)
    assert durations == []
