"""The stored reports the figure tests read (tests/data/reports) are still what the code
produces: each one rebuilt and compared, all but what is timed or depends on the compilation
cache. When this fails after an intended change to a report, regenerate them with
``PYTHONPATH=src python tests/data/make_reports.py`` and review the diff."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from stored_reports import PLACEMENTS, STEP, stored

_SCRIPT = Path(__file__).resolve().parent / "data" / "make_reports.py"
# Measured times, and what the compilation cache's state decides (compiled, or read back).
_VARYING = {"includes_compilation", "includes_program_load", "programs", "cache_hits"}


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_reports", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steady(data: Any) -> Any:
    """``data`` without the fields that differ from run to run."""
    if isinstance(data, dict):
        return {k: _steady(v) for k, v in data.items() if not k.endswith("seconds") and k not in _VARYING}
    if isinstance(data, list):
        return [_steady(v) for v in data]
    return data


@pytest.mark.cluster
@pytest.mark.slow
def test_stored_reports_match_what_the_code_produces_now():
    script = _script()
    assert sorted(script.SCENARIOS) == list(PLACEMENTS) and script.STEP == STEP
    for name in PLACEMENTS:
        fresh = json.loads(json.dumps(script.make_report(name)))
        assert _steady(fresh) == _steady(stored(name)), f"{name}: regenerate tests/data/reports"
    fresh = json.loads(json.dumps(script.make_step()))
    assert _steady(fresh) == _steady(stored(STEP)), f"{STEP}: regenerate tests/data/reports"
