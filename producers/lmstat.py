"""Parsing `lmutil lmstat -a -c PORT@HOST` (FlexLM / FlexNet Publisher) into free seats per feature.

Pure functions over the text, standard library only (the example poller
runs under any `python3`, without crr's dependencies).  Tested on recorded
outputs of several lmutil versions (tests/fixtures/lmstat/).

What is read:

* `License server status: 27000@licsrv` and `licsrv: license server UP
  (MASTER) v11.16.4` — the server and whether it answered;
* `Error getting status: …` / `Cannot connect to license server system`
  / `lmgrd is not running` — the server is down: no feature is known;
* vendor daemon lines `MLM: UP v11.16.4` or `MLM: The desired vendor daemon
  is down…`;
* `Users of MATLAB:  (Total of 100 licenses issued;  Total of 12 licenses in use)`
  (`license`/`licenses` both occur, 11.16+ writes the singular for 1);
* `Users of X:  (Uncounted, node locked)` — no seat limit: free is unknown;
* `Users of X:  (Error: 2 licenses, unsupported by licensed server)` — an
  error for that feature;
* `    3 RESERVATIONs for GROUP gpu_team (licsrv/27000)` under a feature —
  seats held for a group or user.  lmstat already counts them in "in use",
  so `free` (issued − in use) is what anyone outside the reservation can
  take; `reserved` says how many of the used ones are reservations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SERVER = re.compile(r"^License server status:\s*(\S+)", re.MULTILINE)
_SERVER_UP = re.compile(r"^\s*(\S+): license server UP(?: \(MASTER\))?\s*(v[\d.]+)?", re.MULTILINE)
_DOWN = re.compile(
    r"(Error getting status:.*|.*Cannot connect to license server system.*|"
    r"lmgrd is not running.*|.*Cannot find license file.*|.*License server machine is down.*)")
_VENDOR_SECTION = re.compile(r"^Vendor daemon status \(on [^)]*\):\s*$", re.MULTILINE)
_VENDOR_LINE = re.compile(r"^\s+([A-Za-z0-9_]+): (.+)$")
_USERS = re.compile(r"^Users of ([^:\s]+):\s*\((.*)\)\s*$")
_COUNTED = re.compile(
    r"Total of (\d+) licenses? issued;\s*Total of (\d+) licenses? in use", re.IGNORECASE)
_RESERVATION = re.compile(r"^\s+(\d+) RESERVATIONs? for (\w+) (\S+)")
_NAME_CHARS = re.compile(r"[^a-z0-9_]+")


@dataclass(frozen=True)
class FeatureUsage:
    """One feature's counts; `issued` is None for an uncounted or erroneous feature."""

    name: str
    issued: int | None
    in_use: int = 0
    reserved: int = 0
    uncounted: bool = False
    error: str | None = None

    @property
    def free(self) -> int | None:
        """Seats anyone may still check out (issued − in use, never negative); None if unknown."""
        if self.issued is None or self.error is not None:
            return None
        return max(0, self.issued - self.in_use)


@dataclass(frozen=True)
class LmstatStatus:
    """What one `lmstat -a` run said about one license server."""

    server: str | None
    server_up: bool
    version: str | None = None
    vendors: dict[str, str] = field(default_factory=dict)
    """Vendor daemon → its status text (`UP v11.16.4`, or the error)."""
    features: dict[str, FeatureUsage] = field(default_factory=dict)
    error: str | None = None
    """Why the server could not be read (when `server_up` is False)."""


def parse_lmstat(text: str) -> LmstatStatus:
    """Parse the whole output of `lmutil lmstat -a`; never raises for odd text."""
    server_m = _SERVER.search(text)
    server = server_m.group(1) if server_m else None
    up_m = _SERVER_UP.search(text)
    features: dict[str, FeatureUsage] = {}
    current: str | None = None
    for line in text.splitlines():
        users = _USERS.match(line)
        if users:
            current = users.group(1)
            features[current] = _feature(current, users.group(2))
            continue
        res = _RESERVATION.match(line)
        if res and current is not None:
            f = features[current]
            features[current] = FeatureUsage(
                name=f.name, issued=f.issued, in_use=f.in_use, uncounted=f.uncounted,
                error=f.error, reserved=f.reserved + int(res.group(1)))
    down = _DOWN.search(text)
    server_up = up_m is not None and not (down is not None and not features)
    error = None
    if not server_up:
        error = down.group(0).strip() if down else "no 'license server UP' line in lmstat output"
    return LmstatStatus(
        server=server, server_up=server_up, version=up_m.group(2) if up_m else None,
        vendors=_vendors(text), features=features, error=error)


def _feature(name: str, summary: str) -> FeatureUsage:
    counted = _COUNTED.search(summary)
    if counted:
        return FeatureUsage(name=name, issued=int(counted.group(1)),
                            in_use=int(counted.group(2)))
    if summary.strip().lower().startswith("uncounted"):
        return FeatureUsage(name=name, issued=None, uncounted=True)
    return FeatureUsage(name=name, issued=None, error=summary.strip())


def _vendors(text: str) -> dict[str, str]:
    section = _VENDOR_SECTION.search(text)
    if section is None:
        return {}
    out: dict[str, str] = {}
    for line in text[section.end():].splitlines():
        if line.startswith(("Feature usage info", "Users of ")):
            break
        m = _VENDOR_LINE.match(line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def resource_name(feature: str, suffix: str = "_free") -> str:
    """The crr resource a feature's free seats are reported as: `MATLAB` → `matlab_free`."""
    base = _NAME_CHARS.sub("_", feature.lower()).strip("_") or "feature"
    if base[0].isdigit():
        base = "f_" + base
    return base + suffix


def free_seats(status: LmstatStatus, suffix: str = "_free") -> dict[str, int | None]:
    """`{<feature>_free: seats}` for every feature; None where lmstat cannot tell."""
    return {resource_name(f.name, suffix): f.free for f in status.features.values()}
