#!/usr/bin/env python3
"""crr external reporter: free FlexLM seats per feature, from `lmutil lmstat -a -c PORT@HOST`.

Run centrally by `crr external run --reporter flexlm` (script protocol,
`mode: periodic`): prints one report `{"values": {"<feature>_free": N, ...}}`
(cluster scope).  Only the names in $CRR_RESOURCES are reported when it is
set (the names the catalog lets this reporter publish); an uncounted
feature is reported as null ("cannot tell"); a declared feature lmstat does
not list, lists in error or lists ambiguously is null too and named in the
report's `problems` (the reporter's health turns `bad_output` saying so).
When the license server cannot be read — or answers but lists none of the
declared features, or only in error — it prints the reason on stderr and
exits 1: the reporter's health turns `failed` and its values go stale.
A feature listed more than once is counted once, summed or refused as
ambiguous (see `producers/lmstat.py`); what was decided goes to stderr.

Options (each also from the environment):
  --lmutil PATH     lmutil binary ($CRR_LMUTIL, default `lmutil` on PATH); a
                    relative path is taken from this script's directory
  --server PORT@HOST  license server ($CRR_LICENSE_SERVER, else $LM_LICENSE_FILE)
  --timeout S       seconds lmstat may take (default 20)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    from crr.producers.lmstat import parse_lmstat, seat_report
except ImportError:  # run from a source tree without crr installed
    sys.path.insert(0, str(HERE.parents[2]))
    from crr.producers.lmstat import parse_lmstat, seat_report


def find_lmutil(name: str) -> str | None:
    """`name` as given (absolute), from this script's directory, or on PATH."""
    path = Path(name)
    if path.is_absolute():
        return str(path)
    if "/" in name or (HERE / name).exists():
        return str(HERE / name)
    return shutil.which(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lmutil", default=os.environ.get("CRR_LMUTIL", "lmutil"))
    parser.add_argument("--server", default=os.environ.get("CRR_LICENSE_SERVER")
                        or os.environ.get("LM_LICENSE_FILE"))
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    if not args.server:
        print("no license server: pass --server PORT@HOST or set CRR_LICENSE_SERVER",
              file=sys.stderr)
        return 2
    lmutil = find_lmutil(args.lmutil)
    if lmutil is None:
        print(f"lmutil not found: {args.lmutil!r} (pass --lmutil or set CRR_LMUTIL)",
              file=sys.stderr)
        return 2
    try:
        # A script that lost its executable bit (pip does not keep it) runs anyway.
        argv = [lmutil] if os.access(lmutil, os.X_OK) else [sys.executable, lmutil]
        run = subprocess.run([*argv, "lmstat", "-a", "-c", args.server],
                             capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"lmstat -c {args.server} took more than {args.timeout:g}s", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot run {lmutil}: {exc.strerror}", file=sys.stderr)
        return 1
    status = parse_lmstat(run.stdout + "\n" + run.stderr)
    for note in status.notes:
        print(f"note: {note}", file=sys.stderr)
    # Every name we may report: a feature lmstat does not list is unknown (null).
    allowed = [n for n in os.environ.get("CRR_RESOURCES", "").split(",") if n]
    seats = seat_report(status, allowed)
    if seats.error is not None:
        print(f"license server {args.server}: {seats.error}", file=sys.stderr)
        return 1
    report: dict[str, object] = {"values": seats.values}
    if seats.problems:
        report["problems"] = seats.problems
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
