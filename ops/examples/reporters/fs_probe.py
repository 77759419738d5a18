#!/usr/bin/env python3
"""crr reporter (format: prometheus): is each mount point answering at all?

For every mount point given as an argument, a child process lists it and reads its
statvfs; the mount is responsive (1) when that finishes within PROBE_SECONDS, else 0.
A child stuck on a hung NFS/Lustre mount may not even die (D state): it is sent
SIGKILL and left behind, never waited for, and the reporter's own `timeout` kills
the whole process group if this script itself is caught.  Prints, e.g.:

    # TYPE crr_fs_responsive gauge
    crr_fs_responsive{mountpoint="/scratch"} 1
    # TYPE crr_fs_probe_seconds gauge
    crr_fs_probe_seconds{mountpoint="/scratch"} 0.0021
"""

import os
import subprocess
import sys
import time

PROBE_SECONDS = float(os.environ.get("CRR_FS_PROBE_SECONDS") or 3.0)
PROBE = "import os, sys; os.listdir(sys.argv[1]); os.statvfs(sys.argv[1])"


def main(mounts: list[str]) -> int:
    started = {}
    for mount in mounts:  # all at once: one hung mount does not delay the others
        started[mount] = (time.monotonic(), subprocess.Popen(
            [sys.executable, "-c", PROBE, mount], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True))
    deadline = time.monotonic() + PROBE_SECONDS
    results = {}
    for mount, (t0, proc) in started.items():
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
            results[mount] = (1 if code == 0 else 0, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            proc.kill()  # not waited for: a D-state child would block us too
            results[mount] = (0, PROBE_SECONDS)
    print("# TYPE crr_fs_responsive gauge")
    for mount, (ok, _) in results.items():
        print(f'crr_fs_responsive{{mountpoint="{mount}"}} {ok}')
    print("# TYPE crr_fs_probe_seconds gauge")
    for mount, (_, seconds) in results.items():
        print(f'crr_fs_probe_seconds{{mountpoint="{mount}"}} {seconds:.4f}')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
