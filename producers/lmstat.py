"""Parsing `lmutil lmstat -a -c PORT@HOST` (FlexLM / FlexNet Publisher) into free seats per feature.

Pure functions over the text, standard library only (the example poller
runs under any `python3`, without crr's dependencies).  Tested on recorded
outputs of several lmutil versions (tests/fixtures/lmstat/).  Every line
may be indented (vendors' docs and wrappers paste it so) and end in CRLF.

What is read:

* `License server status: 27000@licsrv` — starts one server's section
  (`lmstat -c 27000@a:27000@b` prints one per server, separated by a line
  of dashes; a three-server
  redundant triad is one section `27000@a,27000@b,27000@c` with three
  `… license server UP` lines, one of them `(MASTER)`);
* `licsrv: license server UP (MASTER) v11.16.4` — that server answered;
* `Error getting status: …` / `Error reading license file: …` / `Cannot
  connect to license server system` / `lmgrd is not running` — the server
  is down: no feature is known;
* vendor daemon lines `MLM: UP v11.16.4` or `MLM: The desired vendor daemon
  is down…`;
* `Users of MATLAB:  (Total of 100 licenses issued;  Total of 12 licenses in use)`
  (`license`/`licenses` both occur, lmstat writes the singular for 1, and
  `borrowable licenses` for borrowable features);
* `Users of X:  (Uncounted, node-locked)` — no seat limit: free is unknown;
* `Users of X:  (Error: 2 licenses, unsupported by licensed server)`,
  `Users of X: Cannot get users of X: <reason>` (e.g. its vendor daemon is
  down) and `Users of X: None` — an error for that feature;
* `  "MATLAB" v51, vendor: MLM, expiry: …` under a feature — its vendor daemon;
* `    3 RESERVATIONs for GROUP gpu_team (licsrv/27000)` under a feature —
  seats held for a group or user.  lmstat already counts them in "in use",
  so `free` (issued − in use) is what anyone outside the reservation can
  take; `reserved` says how many of the used ones are reservations.

A feature listed more than once (the same server twice on the license
path, two servers, two vendor daemons) is never replaced silently:

* the same block again — same server section, same vendor daemon (or none
  named), same counts — is counted once;
* blocks from different servers or different vendor daemons are pools of
  their own: they are summed (issued, in use, reserved); a block in error
  adds nothing (its seats cannot be checked out) and an uncounted one makes
  the sum unknown;
* the same server and vendor with different counts cannot be told apart:
  the feature is ambiguous — an error, so its free seats are unknown.

Each decision is written in `LmstatStatus.notes`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

_SERVER = re.compile(r"^\s*License server status:\s*(\S+)")
_SERVER_UP = re.compile(r"^\s*(\S+): license server UP( \(MASTER\))?\s*(v[\d.]+)?")
_DOWN = re.compile(
    r"(Error getting status:.*|.*Cannot connect to license server system.*|"
    r"lmgrd is not running.*|Error reading license file.*|.*Cannot find license file.*|"
    r".*License server machine is down.*)")
_VENDOR_SECTION = re.compile(r"^\s*Vendor daemon status \(on [^)]*\):\s*$")
_VENDOR_LINE = re.compile(r"^\s*([A-Za-z0-9_]+): (.+)$")
_USERS = re.compile(r"^\s*Users of ([^:\s]+):\s*(.*?)\s*$")
_COUNTED = re.compile(
    r"Total of (\d+) (?:borrowable )?licenses? issued;\s*Total of (\d+) licenses? in use",
    re.IGNORECASE)
_VENDOR_OF = re.compile(r'^\s*"[^"]+"\s+v\S*,\s*vendor:\s*([^,\s]+)')
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
    vendor: str | None = None
    """The vendor daemon serving it, when lmstat says (the line under `Users of`)."""
    server: str | None = None
    """The `License server status:` section it was listed in."""
    blocks: int = 1
    """How many distinct `Users of` blocks were summed into this."""

    @property
    def free(self) -> int | None:
        """Seats anyone may still check out (issued − in use, never negative); None if unknown."""
        if self.issued is None or self.error is not None:
            return None
        return max(0, self.issued - self.in_use)

    def counts(self) -> tuple[int | None, int, int, bool, str | None]:
        """What two listings of the same block must agree on."""
        return (self.issued, self.in_use, self.reserved, self.uncounted, self.error)


@dataclass(frozen=True)
class LmstatStatus:
    """What one `lmstat -a` run said about one license server (or several)."""

    server: str | None
    server_up: bool
    version: str | None = None
    vendors: dict[str, str] = field(default_factory=dict)
    """Vendor daemon → its status text (`UP v11.16.4`, or the error)."""
    features: dict[str, FeatureUsage] = field(default_factory=dict)
    error: str | None = None
    """Why the server could not be read (when `server_up` is False)."""
    servers: list[str] = field(default_factory=list)
    """Every `License server status:` section, in order."""
    notes: list[str] = field(default_factory=list)
    """How features listed more than once were counted (see module doc)."""
    unreadable: dict[str, str] = field(default_factory=dict)
    """Server sections that could not be read → why (their features are not counted)."""


@dataclass
class _Section:
    server: str | None
    lines: list[str] = field(default_factory=list)


def _sections(text: str) -> list[_Section]:
    """The text cut at each `License server status:` line (a preamble has server None)."""
    sections = [_Section(None)]
    for line in text.splitlines():
        m = _SERVER.match(line)
        if m:
            sections.append(_Section(m.group(1)))
        sections[-1].lines.append(line)
    return sections


def parse_lmstat(text: str) -> LmstatStatus:
    """Parse the whole output of `lmutil lmstat -a`; never raises for odd text."""
    sections = _sections(text)
    blocks: list[FeatureUsage] = []
    vendors: dict[str, str] = {}
    up_any = False
    version: str | None = None
    master_version: str | None = None
    errors: list[str] = []
    unreadable: dict[str, str] = {}
    for section in sections:
        found = _features(section)
        blocks.extend(found)
        vendors.update(_vendors(section.lines))
        up_lines = [m for m in map(_SERVER_UP.match, section.lines) if m]
        down = next((m for m in map(_DOWN.search, section.lines) if m), None)
        up = bool(up_lines) and not (down is not None and not found)
        up_any = up_any or up
        for m in up_lines:
            version = version or m.group(3)
            if m.group(2) and master_version is None:
                master_version = m.group(3)
        if not up and (section.server is not None or down is not None):
            reason = (down.group(0).strip() if down else
                      "no 'license server UP' line in lmstat output")
            errors.append(reason)
            if section.server is not None:
                unreadable[section.server] = reason
    if not errors and not up_any:
        errors.append("no 'license server UP' line in lmstat output")
    features, notes = _merge(blocks)
    servers = [s.server for s in sections if s.server is not None]
    return LmstatStatus(
        server=servers[0] if servers else None, server_up=up_any,
        version=master_version or version, vendors=vendors, features=features,
        error=None if up_any else errors[0], servers=servers, notes=notes,
        unreadable=unreadable)


def _features(section: _Section) -> list[FeatureUsage]:
    """The `Users of` blocks of one server section, with their vendor and reservations."""
    out: list[FeatureUsage] = []
    for line in section.lines:
        users = _USERS.match(line)
        if users:
            out.append(_feature(users.group(1), users.group(2), section.server))
            continue
        if not out:
            continue
        f = out[-1]
        vendor = _VENDOR_OF.match(line)
        if vendor and f.vendor is None:
            out[-1] = replace(f, vendor=vendor.group(1))
            continue
        res = _RESERVATION.match(line)
        if res:
            out[-1] = replace(f, reserved=f.reserved + int(res.group(1)))
    return out


def _feature(name: str, summary: str, server: str | None) -> FeatureUsage:
    counted = _COUNTED.search(summary)
    if counted:
        return FeatureUsage(name=name, issued=int(counted.group(1)),
                            in_use=int(counted.group(2)), server=server)
    inner = summary.strip()
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1].strip()
    if inner.lower().startswith("uncounted"):
        return FeatureUsage(name=name, issued=None, uncounted=True, server=server)
    if inner.lower() == "none":
        inner = "lmstat lists no usage for it (None)"
    return FeatureUsage(name=name, issued=None, error=inner or "no counts", server=server)


def _merge(blocks: list[FeatureUsage]) -> tuple[dict[str, FeatureUsage], list[str]]:
    """One FeatureUsage per name, by the rules of the module doc, and what was decided."""
    by_name: dict[str, list[FeatureUsage]] = {}
    for b in blocks:
        by_name.setdefault(b.name, []).append(b)
    features: dict[str, FeatureUsage] = {}
    notes: list[str] = []
    for name, listed in by_name.items():
        if len(listed) == 1:
            features[name] = listed[0]
            continue
        distinct: dict[tuple[str | None, str | None], FeatureUsage] = {}
        clash: list[str] = []
        for b in listed:
            key = (b.server, b.vendor)
            seen = distinct.get(key)
            if seen is None:
                distinct[key] = b
            elif seen.counts() != b.counts():
                clash.append(f"{_where(b)}: {_describe(seen)} and {_describe(b)}")
        if clash:
            error = ("listed more than once with different counts for the same server and "
                     "vendor, cannot tell which is right: " + "; ".join(clash))
            features[name] = replace(listed[0], issued=None, error=error)
            notes.append(f"{name}: ambiguous, free seats unknown ({'; '.join(clash)})")
            continue
        if len(distinct) == 1:
            features[name] = listed[0]
            notes.append(f"{name}: listed {len(listed)} times identically on "
                         f"{_where(listed[0])}; counted once")
            continue
        features[name] = _summed(name, list(distinct.values()))
        notes.append(f"{name}: {len(distinct)} pools summed ("
                     + ", ".join(f"{_where(b)}: {_describe(b)}" for b in distinct.values())
                     + ")")
    return features, notes


def _summed(name: str, pools: list[FeatureUsage]) -> FeatureUsage:
    counted = [p for p in pools if p.error is None and not p.uncounted]
    vendors = {p.vendor for p in pools}
    vendor = pools[0].vendor if len(vendors) == 1 else None
    if any(p.uncounted for p in pools):
        return FeatureUsage(name=name, issued=None, uncounted=True, vendor=vendor,
                            blocks=len(pools))
    if not counted:
        return FeatureUsage(name=name, issued=None, vendor=vendor, blocks=len(pools),
                            error="; ".join(f"{_where(p)}: {p.error}" for p in pools))
    return FeatureUsage(name=name, issued=sum(p.issued or 0 for p in counted),
                        in_use=sum(p.in_use for p in counted),
                        reserved=sum(p.reserved for p in counted), vendor=vendor,
                        blocks=len(pools))


def _where(f: FeatureUsage) -> str:
    return f"{f.server or '?'}" + (f" ({f.vendor})" if f.vendor else "")


def _describe(f: FeatureUsage) -> str:
    if f.error is not None:
        return f"error {f.error!r}"
    if f.uncounted:
        return "uncounted"
    return f"{f.issued} issued, {f.in_use} in use"


def _vendors(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    inside = False
    for line in lines:
        if _VENDOR_SECTION.match(line):
            inside = True
            continue
        if not inside:
            continue
        if line.strip().startswith(("Feature usage info", "Users of ")):
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


@dataclass(frozen=True)
class SeatReport:
    """What a poller publishes: `values`, the `problems` with them, or an `error` instead."""

    values: dict[str, int | None]
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    """Set when nothing should be published: the reporter fails with this reason."""


def seat_report(
    status: LmstatStatus, allowed: Sequence[str] = (), suffix: str = "_free"
) -> SeatReport:
    """Free seats for the names a poller may report (`allowed`; every feature if empty).

    Fails (`error`) when the server is down, and when it is up but none of
    the allowed names is a feature it lists, or every one it lists is in
    error — so a changed output format or a wrong server cannot look like a
    healthy reporter publishing nulls.  A declared name lmstat does not
    list, or lists in error (or ambiguously), is reported as null and named
    in `problems`, and so is a server of several that could not be read.
    """
    where = status.server or "license server"
    if not status.server_up:
        return SeatReport(values={}, error=f"{where}: {status.error}")
    by_name = {resource_name(f.name, suffix): f for f in status.features.values()}
    names = list(allowed) or sorted(by_name)
    listed = sorted(f.name for f in status.features.values())
    if not names:
        return SeatReport(values={}, error=f"{where} is up but lmstat lists no feature "
                          "('Users of …' lines)")
    found = [n for n in names if n in by_name]
    if not found:
        return SeatReport(values={}, error=(
            f"{where} is up but none of the declared features is in its lmstat output "
            f"(declared: {', '.join(names)}; lmstat lists: {', '.join(listed) or 'nothing'})"))
    usable = [n for n in found if by_name[n].error is None]
    if not usable:
        return SeatReport(values={}, error=f"{where}: every declared feature is in error: "
                          + "; ".join(f"{by_name[n].name}: {by_name[n].error}" for n in found))
    values: dict[str, int | None] = {}
    problems = [f"{server}: {why} (its features are not counted)"
                for server, why in status.unreadable.items()]
    for name in names:
        feature = by_name.get(name)
        values[name] = feature.free if feature is not None else None
        if feature is None:
            problems.append(f"{name}: no such feature in lmstat output")
        elif feature.error is not None:
            problems.append(f"{name} ({feature.name}): {feature.error}")
    return SeatReport(values=values, problems=problems)
