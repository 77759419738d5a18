#!/usr/bin/env python3
"""crr periodic reporter: free and total space of the scratch file system, in GiB.

Measures $CRR_SCRATCH_DIR (default /tmp) with statvfs and prints one JSON
report: {"values": {"scratch_free": ..., "scratch_total": ...}}.
"""

import json
import os
import sys

GIB = 1024**3


def main() -> int:
    path = os.environ.get("CRR_SCRATCH_DIR") or "/tmp"  # noqa: S108 - a demo default
    try:
        st = os.statvfs(path)
    except OSError as exc:
        print(f"statvfs {path}: {exc.strerror}", file=sys.stderr)
        return 2
    free = st.f_bavail * st.f_frsize / GIB
    total = st.f_blocks * st.f_frsize / GIB
    json.dump({"values": {"scratch_free": round(free, 3), "scratch_total": round(total, 3)}},
              sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
