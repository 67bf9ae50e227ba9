"""``report --processes N``: the same report, built by N worker processes on this machine
(``multiprocess.launcher``); this process never starts JAX. A failed or stuck worker ends the
run with exit status 2 and that worker's error; a configuration the workers refuse is refused as
one process refuses it, the device count's flags being --devices-per-process and --processes.
The flags themselves are knobs of the table (``core.knobs``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rlcluster_lab.cli.flags import scenario_from
from rlcluster_lab.cli.text import format_report
from rlcluster_lab.core.errors import ConfigError
from rlcluster_lab.core.knobs import KNOBS


def multi_process(args: argparse.Namespace) -> bool:
    """True when the flags ask for several processes; refuses flags that only make sense with them."""
    if isinstance(args.processes, int) and args.processes > 1:
        return True
    if args.processes != 1:
        raise ConfigError(f"--processes must be at least 1, got {args.processes}")
    if args.timeout is not None:
        raise ConfigError("--timeout bounds a multi-process run: use it with --processes 2 or more")
    return False


def run_processes_command(args: argparse.Namespace) -> dict[str, Any]:
    """The merged report of a multi-process run, as JSON or (``_text``) a readable summary.

    Raises:
        ConfigError: a flag or scenario that cannot work (nothing started).
        LaunchError: a worker failed or the deadline passed (every worker was stopped).
    """
    from rlcluster_lab.multiprocess.launcher import DEFAULT_TIMEOUT_S, run_reports

    total = args.processes * args.devices_per_process
    if args.devices not in (KNOBS["devices"].default, total):
        raise ConfigError(
            f"--devices {args.devices} conflicts with --processes {args.processes} x --devices-per-process "
            f"{args.devices_per_process} = {total} devices; drop --devices with --processes"
        )
    progress = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    (data,) = run_reports(
        [scenario_from(args)],
        processes=args.processes,
        devices_per_process=args.devices_per_process,
        sync=args.sync,
        timeout=args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S,
        progress=progress,
    )
    if args.json:
        return data
    from rlcluster_lab.multiprocess.report import format_processes

    return {"_text": "\n".join([format_report(data), *format_processes(data)])}
