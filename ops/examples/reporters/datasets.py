#!/usr/bin/env python3
"""crr stream reporter: the datasets present in this node's local cache.

Every few seconds (a fifth of $CRR_INTERVAL, at least 1 s) lists the
directories in $CRR_DATASET_DIR and prints one line
{"values": {"datasets": [...]}}, flushed.  Without $CRR_DATASET_DIR a demo
list is reported, so `crr demo` shows something everywhere.
"""

import json
import os
import sys
import time

DEMO = ["imagenet", "c4", "wikitext"]


def datasets(root: str | None) -> list[str]:
    if not root:
        return DEMO
    try:
        with os.scandir(root) as it:
            return sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        print(f"cannot list {root}: {exc.strerror}", file=sys.stderr, flush=True)
        return []


def main() -> int:
    root = os.environ.get("CRR_DATASET_DIR")
    period = max(1.0, float(os.environ.get("CRR_INTERVAL") or "10") / 5)
    while True:
        print(json.dumps({"values": {"datasets": datasets(root)}}), flush=True)
        time.sleep(period)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)
