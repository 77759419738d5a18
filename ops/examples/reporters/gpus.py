#!/usr/bin/env python3
"""crr periodic reporter: this node's GPUs as an inventory (shaped like a DRA ResourceSlice).

Uses `nvidia-smi --query-gpu=... --format=csv`; on a host without it exits
97, which the agent shows as `not_applicable` and does not run again there.
"""

import json
import shutil
import subprocess
import sys

NOT_APPLICABLE = 97
FIELDS = ["index", "name", "memory.total", "driver_version", "uuid"]


def main() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("nvidia-smi not found: no NVIDIA GPUs here", file=sys.stderr)
        return NOT_APPLICABLE
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=8, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"nvidia-smi failed: {exc}", file=sys.stderr)
        return 1
    devices = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        index, model, mem_mib, driver, uuid = parts
        mem_gib = int(float(mem_mib) / 1024 + 0.5)
        devices.append({
            "name": f"gpu{index}",
            "attributes": {"model": {"string": model}, "memory_gib": {"int": mem_gib},
                           "uuid": {"string": uuid}, "driver": {"version": driver}},
            "capacity": {"memory": {"value": f"{mem_gib}Gi"}},
        })
    json.dump({"inventory": {"devices": devices}}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
