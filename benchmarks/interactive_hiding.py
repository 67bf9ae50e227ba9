"""Section ``hiding`` of ``interactive.py``: what each part of the compile-hiding machinery saves
a person, each cold figure with the part and without it, alternated, medians.

1. ``RLCluster.build_ahead`` in ``GRPOLearner.step``'s first step (``builds_ahead``): the
   first learner step cold (tiny colocated LoRA), with the helpers and with
   ``builds_ahead = False``.
2. The lab's rehearsal (``PlacementLab(rehearse=...)``): a fresh process clicks Construct,
   then Training step, (a) rehearsal on, the step clicked once the rehearsal has finished
   (the seconds it needed given to the reader), (b) rehearsal on, clicked at once
   (it waits for the rehearsal), (c) rehearsal off; and the first Sync clicked at once after
   Construct, rehearsal on (case 3's empty cache) and off.
3. The warm start (``lab.notebook.warm``): a fresh process clicks Construct, Sync, then Training step
   at once (the lab as shipped), in an empty cache and in a cache that
   ``python -m rlcluster_lab.lab.notebook.warm`` filled beforehand (its own seconds reported apart);
   and Construct, then Training step once the rehearsal has finished, in both caches.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import common
import interactive_step

LAB_FIRST_CHILD = r"""
from rlcluster_lab.core.compile_cache import count_compilations
_t = time.perf_counter()
from rlcluster_lab.lab.widget.placement_lab import PlacementLab
IMPORT_LAB_S = time.perf_counter() - _t
lab = PlacementLab(build=False, rehearse=ARGS["rehearse"])
clicks, errors = {}, []


def click(name, fn):
    # Seconds of the click, and the programs this thread built in it: (built, of which read from the cache).
    with count_compilations() as built:
        t = time.perf_counter()
        fn()
        clicks[name] = time.perf_counter() - t
    clicks[name + " programs"] = [len(built), sum(cached for _, _, cached in built)]
    errors.append(lab.error)


click("construct", lab.construct)
if ARGS["sync"]:
    click("sync", lab.sync)
rehearsal_s = None
if ARGS["pause"]:
    # The reader waits as long as the rehearsal needs before clicking (its thread, joined here).
    t = time.perf_counter()
    lab.background.join()
    rehearsal_s = time.perf_counter() - t
click("step", lab.train_step)
emit({"import_lab_s": IMPORT_LAB_S, "clicks": clicks, "rehearsal_after_construct_s": rehearsal_s,
      "step_waited_s": float(lab._waited), "errors": errors, "rehearsal_error": lab.background.error})
"""

LAB_CASES = {
    "rehearse_paused": {"rehearse": True, "pause": True, "sync": False},
    "rehearse_at_once": {"rehearse": True, "pause": False, "sync": False},
    "no_rehearsal": {"rehearse": False, "pause": False, "sync": False},
    # What a rehearsal costs the Sync clicked while it runs (beside WARM_CASE in an empty cache).
    "no_rehearsal_sync": {"rehearse": False, "pause": False, "sync": True},
}
# The lab as shipped, clicked without pauses: Construct, Sync, Training step.
WARM_CASE = {"rehearse": True, "pause": False, "sync": True}
# The lab as shipped, Training step clicked once the rehearsal has finished.
WARM_PAUSED_CASE = {"rehearse": True, "pause": True, "sync": False}


def hiding_section(run: Any, quick: bool) -> dict[str, Any]:
    repeats = 1 if quick else 4
    out: dict[str, Any] = {"repeats": repeats, "learner": {"ahead": [], "no_ahead": []}, "lab": {}, "warm": {}}
    out["lab"] = {k: [] for k in LAB_CASES}
    out["warm"] = {"warmed": [], "empty": [], "warmed_paused": [], "empty_paused": [], "warm_up": []}
    step_args = {"repeats": 1, "via": "learner"}
    for i in range(repeats):
        # Alternated within each part, so a change in the machine's load falls on both alike.
        for key, extra in (
            (("ahead", {}), ("no_ahead", {"no_ahead": True}))
            if i % 2 == 0
            else (
                ("no_ahead", {"no_ahead": True}),
                ("ahead", {}),
            )
        ):
            out["learner"][key].append(
                run.python(
                    f"first learner step, cold, {key}",
                    interactive_step.STEP_CHILD,
                    dict(step_args, **extra),
                    run.fresh_cache(),
                )
            )
        order = list(LAB_CASES) if i % 2 == 0 else list(reversed(LAB_CASES))
        for key in order:
            out["lab"][key].append(
                run.python(
                    f"lab Construct + Training step, cold, {key}", LAB_FIRST_CHILD, LAB_CASES[key], run.fresh_cache()
                )
            )
        for key in ("warmed", "empty") if i % 2 == 0 else ("empty", "warmed"):
            cache, paused = run.fresh_cache(), run.fresh_cache()
            if key == "warmed":
                # Each folder warmed by its own warm start: a copied folder is not read back (the
                # programs' cache keys differ with the folder's path).
                for folder in (cache, paused):
                    argv = [sys.executable, "-m", "rlcluster_lab.lab.notebook.warm", "--devices", str(run.args.devices)]
                    r = run.command("warm start, in the foreground", argv, folder)
                    if r["rc"] != 0:
                        run.fail("warm start", r, f"exit code {r['rc']}")
                    out["warm"]["warm_up"].append(r["wall_s"] if r["rc"] == 0 else None)
            for folder, case, name in ((cache, WARM_CASE, key), (paused, WARM_PAUSED_CASE, key + "_paused")):
                out["warm"][name].append(run.python(f"lab first clicks, {name} cache", LAB_FIRST_CHILD, case, folder))
    return out


def _ok(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c["result"] for c in children if c["ok"] and not any(c["result"].get("errors") or [])]


def _med(values: list[float | None]) -> float | None:
    good = [v for v in values if v is not None]
    return statistics.median(good) if good else None


def _runs(values: list[float | None]) -> str:
    return ", ".join("failed" if v is None else f"{v:.2f}" for v in values)


def _saved(with_s: float | None, without_s: float | None) -> str:
    if with_s is None or not without_s:
        return "n/a"
    return f"{without_s - with_s:.2f} s ({(without_s - with_s) / without_s:.0%})"


def hiding_rows(out: dict[str, Any]) -> list[list[Any]]:
    """One row per figure: what, runs with, median with, runs without, median without, saved."""
    rows = []

    def add(what: str, with_runs: list[float | None], without_runs: list[float | None]) -> None:
        w, wo = _med(with_runs), _med(without_runs)
        rows.append([what, _runs(with_runs), w, _runs(without_runs), wo, _saved(w, wo)])

    learner = {k: [r["first_s"] for r in _ok(v)] for k, v in out["learner"].items()}
    add("1. first GRPOLearner.step, build_ahead on / off", learner["ahead"], learner["no_ahead"])
    lab = {k: _ok(v) for k, v in out["lab"].items()}
    off = [r["clicks"]["step"] for r in lab["no_rehearsal"]]
    add(
        "2. first Training step after the rehearsal finished / rehearsal off",
        [r["clicks"]["step"] for r in lab["rehearse_paused"]],
        off,
    )
    add(
        "2. first Training step clicked at once / rehearsal off",
        [r["clicks"]["step"] for r in lab["rehearse_at_once"]],
        off,
    )
    add(
        "2. first Construct, rehearsal on / off",
        [r["clicks"]["construct"] for r in lab["rehearse_at_once"] + lab["rehearse_paused"]],
        [r["clicks"]["construct"] for r in lab["no_rehearsal"]],
    )
    warm = {k: _ok(v) for k, v in out["warm"].items() if k != "warm_up"}
    add(
        "2. first Sync at once, rehearsal on / off",
        [r["clicks"]["sync"] for r in warm["empty"]],
        [r["clicks"]["sync"] for r in lab["no_rehearsal_sync"]],
    )
    for what, key in (
        ("first Construct", "construct"),
        ("first Sync at once", "sync"),
        ("first Training step at once", "step"),
    ):
        add(
            f"3. {what}, warm start done / off",
            [r["clicks"][key] for r in warm["warmed"]],
            [r["clicks"][key] for r in warm["empty"]],
        )
    add(
        "3. first Training step after the rehearsal finished, warm start done / off",
        [r["clicks"]["step"] for r in warm["warmed_paused"]],
        [r["clicks"]["step"] for r in warm["empty_paused"]],
    )
    add(
        "3. the rehearsal's seconds after Construct (the reader's pause), warm start done / off",
        [r["rehearsal_after_construct_s"] for r in warm["warmed_paused"]],
        [r["rehearsal_after_construct_s"] for r in warm["empty_paused"]],
    )
    return rows


def page_rows(out: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """docs/performance.md's rows of this section: the lab as shipped, its first clicks in an empty
    cache and in one the warm start filled (``common.page_row``)."""
    rows = []
    for key, what, click, case, target, shown in (
        ("lab.construct", "the lab's first Construct", "construct", "", 1.0, "<= 1 s"),
        ("lab.sync", "first Sync, clicked at once after Construct", "sync", "", 0.5, "<= 0.5 s"),
        ("lab.step", "first Training step, clicked at once after that Sync", "step", "", 1.0, "<= 1 s"),
        (
            "lab.step_paused",
            "first Training step, clicked once the rehearsal has finished",
            "step",
            "_paused",
            1.0,
            "<= 1 s",
        ),
    ):
        for cache, words in (("empty", "empty cache"), ("warmed", "cache filled by the warm start")):
            seconds = _med([r["clicks"][click] for r in _ok(out["warm"][cache + case])])
            if seconds is None:
                continue
            rows.append(
                common.page_row(
                    f"{key}.{cache}",
                    "clicks",
                    f"{what}, {words}",
                    where,
                    common.run_value(seconds, f"{seconds:.2f} s"),
                    common.at_most(target, shown),
                )
            )
    return rows


def print_hiding(out: dict[str, Any]) -> None:
    print(
        f"\n== 7. compile hiding: each part's cold figure with it and without it (fresh processes, empty caches, "
        f"alternated, {out['repeats']} of each, seconds)"
    )
    print(
        common.table(
            ["figure", "runs with", "median with", "runs without", "median without", "saved"], hiding_rows(out)
        )
    )
    paused = _ok(out["lab"]["rehearse_paused"])
    print(
        "   the rehearsal's own seconds after Construct (the reader's pause): "
        + _runs([r["rehearsal_after_construct_s"] for r in paused])
        + "; the warm start's own seconds (python -m rlcluster_lab.lab.notebook.warm): "
        + _runs(out["warm"]["warm_up"])
    )
    for part, cases in (("lab", out["lab"]), ("warm", {k: v for k, v in out["warm"].items() if k != "warm_up"})):
        for key, children in cases.items():
            programs = [{k: v for k, v in r["clicks"].items() if k.endswith("programs")} for r in _ok(children)]
            print(f"   programs built in each click (built, of them read from the cache), {part} {key}: {programs}")
