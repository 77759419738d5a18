"""Benchmark of `select[]` over the columnar HostTable (a command, not a test).

    python -m tests.bench.select [--hosts 1000,10000] [--seed 1]

Evaluates five representative expressions over synthetic hosts (a few % of
values null, stale or never reported) and prints host-evaluations/s beside
two baselines measured in the same run: a hand-written Python lambda per
expression over a list of dicts, and HTCondor's ClassAd evaluator when the
`htcondor` package is importable (it is optional, never a dependency).
Checks that all three select the same number of hosts, reports the
end-to-end time to return the names, and the HostTable upsert rate.
Exit status 1 if the match counts disagree.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crr.projections.host_table import HostTable
from crr.projections.select import compile_select
from crr.projections.select.columnar import truth
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.snapshot import AsOf, ClusterSnapshot, HostSnapshot, ValueEntry
from crr.schemas.wire_time import format_time

NOW = 1_800_000_000.0
DATASETS = ["imagenet", "c4", "pile", "laion", "wiki", "books", "code", "math"]
OSES = ["rhel9", "rhel8", "ubuntu22"]


def _spec(kind: str, scope: str = "host", on_stale: str = "unknown") -> ResourceSpec:
    return ResourceSpec(kind=kind, reporter="r", scope=scope,  # type: ignore[arg-type]
                        on_stale=on_stale, interval=30.0)  # type: ignore[arg-type]


CATALOG = Catalog(
    resources={
        "scratch_free": _spec("numeric"), "scratch_total": _spec("numeric"),
        "load15": _spec("numeric"), "site_ok": _spec("boolean"), "draining": _spec("boolean"),
        "os": _spec("string"), "site_state": _spec("string"),
        "datasets": _spec("string_set", on_stale="exclude"),
        "matlab_free": _spec("numeric", scope="cluster"),
    },
    reporters={"r": ReporterSpec(type="external", interval=30.0)},
)


@dataclass(frozen=True)
class Case:
    """One benchmark expression in the three dialects."""

    label: str
    select: str
    classad: str
    python: Callable[[dict[str, Any]], bool]


def _numeric(d: dict[str, Any]) -> bool:
    f, t, load = d["scratch_free"], d["scratch_total"], d["load15"]
    return (f is not None and t is not None and t != 0 and f / t > 0.25
            and load is not None and load < 8)


def _string_set(d: dict[str, Any]) -> bool:
    s = d["datasets"]
    return ("datasets" not in d["_stale"] and s is not None
            and (("imagenet" in s and "c4" in s) or "pile" in s))


def _mixed(matlab: float | None) -> Callable[[dict[str, Any]], bool]:
    def check(d: dict[str, Any]) -> bool:
        s, f = d["datasets"], d["scratch_free"]
        return (d["site_ok"] is True and f is not None and f > 200
                and "datasets" not in d["_stale"] and s is not None and "imagenet" in s
                and d["os"] == "rhel9" and matlab is not None and matlab >= 1 and len(s) >= 2)
    return check


def cases(matlab: float | None) -> list[Case]:
    """The five expressions."""
    return [
        Case("numeric", "scratch_free / scratch_total > 0.25 && load15 < 8",
             "scratch_free / scratch_total > 0.25 && load15 < 8", _numeric),
        Case("boolean", "site_ok && !draining", "site_ok && !draining",
             lambda d: d["site_ok"] is True and d["draining"] is False),
        Case("string", "os == rhel9 && site_state != 'degraded'",
             'os == "rhel9" && site_state != "degraded"',
             lambda d: d["os"] == "rhel9" and d["site_state"] is not None
             and d["site_state"] != "degraded"),
        Case("string-set", 'datasets has_all ["imagenet", "c4"] || datasets has "pile"',
             'crr_stale_datasets =!= true && ((stringListMember("imagenet", datasets) && '
             'stringListMember("c4", datasets)) || stringListMember("pile", datasets))',
             _string_set),
        Case("mixed", 'site_ok && scratch_free > 200 && datasets has "imagenet" && '
                      "os == 'rhel9' && matlab_free >= 1 && count(datasets) >= 2",
             'site_ok && scratch_free > 200 && crr_stale_datasets =!= true && '
             'stringListMember("imagenet", datasets) && os == "rhel9" && matlab_free >= 1 '
             "&& stringListSize(datasets) >= 2",
             _mixed(matlab)),
    ]


def _entry(value: Any, rng: random.Random, kind: str) -> tuple[ValueEntry | None, str]:
    """A snapshot entry with ~1% null, ~1% stale, ~1% never reported; and its freshness."""
    roll = rng.random()
    recv = NOW - rng.uniform(0, 20)
    t = format_time
    if roll < 0.01:
        return None, "never"
    if roll < 0.02:
        return ValueEntry(value=None, state="unknown", reporter="r", observed_at=t(recv),
                          received_at=t(recv), expires_at=t(recv + 45)), "null"
    if roll < 0.03:
        return ValueEntry(value=None, state="stale", reporter="r", observed_at=t(recv - 60),
                          received_at=t(recv - 60), expires_at=t(recv - 15),
                          last_value=value, stale_since=t(recv - 15)), "stale"
    wire = sorted(value) if kind == "string_set" else value
    return ValueEntry(value=wire, state="fresh", reporter="r", observed_at=t(recv),
                      received_at=t(recv), expires_at=t(recv + 45)), "fresh"


def make_hosts(n: int, seed: int) -> tuple[list[HostSnapshot], list[dict[str, Any]]]:
    """`n` synthetic HostSnapshots and the same data as plain dicts (None: unknown)."""
    rng = random.Random(seed)
    snaps: list[HostSnapshot] = []
    dicts: list[dict[str, Any]] = []
    for i in range(n):
        raw: dict[str, Any] = {
            "scratch_free": round(rng.uniform(0, 2000), 1),
            "scratch_total": 2000.0,
            "load15": round(rng.uniform(0, 16), 2),
            "site_ok": rng.random() < 0.9,
            "draining": rng.random() < 0.1,
            "os": rng.choice(OSES),
            "site_state": "degraded" if rng.random() < 0.05 else "ready",
            "datasets": frozenset(d for d in DATASETS if rng.random() < 0.4),
        }
        values: dict[str, ValueEntry] = {}
        plain: dict[str, Any] = {"_stale": set()}
        for name, value in raw.items():
            entry, state = _entry(value, rng, CATALOG.resources[name].kind)
            if entry is not None:
                values[name] = entry
            plain[name] = value if state == "fresh" else None
            if state == "stale":
                plain["_stale"].add(name)
        host = f"node{i:05d}"
        plain["_host"] = host
        snaps.append(HostSnapshot(host=host, as_of=AsOf(seq=i, time=format_time(NOW)),
                                  values=values))
        dicts.append(plain)
    return snaps, dicts


def _best(fn: Callable[[], object], repeat: int, number: int = 1) -> float:
    """Best seconds per call over `repeat` rounds of `number` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def _classad() -> tuple[Any, str | None]:
    try:
        # htcondor2 first: importing it registers stringListMember & co. with classad2.
        importlib.import_module("htcondor2")
        classad2 = importlib.import_module("classad2")
    except ImportError as exc:
        return None, f"unavailable ({exc}); install it with `pip install htcondor`"
    return classad2, None


def _ad_dict(d: dict[str, Any], matlab: float | None) -> dict[str, Any]:
    ad: dict[str, Any] = {}
    for key, value in d.items():
        if key.startswith("_") or value is None:
            continue
        if isinstance(value, frozenset):
            ad[key] = ",".join(sorted(value))
        elif isinstance(value, float | int) and not isinstance(value, bool):
            ad[key] = float(value)
        else:
            ad[key] = value
    if "datasets" in d["_stale"]:
        ad["crr_stale_datasets"] = True
    if matlab is not None:
        ad["matlab_free"] = float(matlab)
    return ad


def _filter(fn: Callable[[dict[str, Any]], bool], rows: list[tuple[str, dict[str, Any]]],
            ) -> list[str]:
    """The lambda baseline: names of the rows `fn` accepts."""
    return [h for h, d in rows if fn(d)]


def _classad_filter(tree: Any, ads: list[tuple[str, Any]]) -> list[str]:
    """The ClassAd baseline: names of the ads where `tree` evaluates to exactly True."""
    return [h for h, ad in ads if tree.eval(ad) is True]


def run(n: int, seed: int, out: Callable[[str], None]) -> bool:
    """Benchmark `n` hosts; False if the three evaluators disagree on a match count."""
    snaps, dicts = make_hosts(n, seed)
    matlab = 3.0
    cluster = ClusterSnapshot(as_of=AsOf(seq=0, time=format_time(NOW)), values={
        "matlab_free": ValueEntry(value=matlab, state="fresh", reporter="r",
                                  observed_at=format_time(NOW), received_at=format_time(NOW),
                                  expires_at=format_time(NOW + 45))})

    table = HostTable(CATALOG)
    start = time.perf_counter()
    for snap in snaps:
        table.upsert(snap)
    insert_s = time.perf_counter() - start
    start = time.perf_counter()
    for snap in snaps:
        table.upsert(snap)
    update_s = time.perf_counter() - start
    table.set_cluster(cluster)

    classad, why = _classad()
    ads: list[tuple[str, Any]] = []
    if classad is not None:
        ads = [(d["_host"], classad.ClassAd(_ad_dict(d, matlab))) for d in dicts]
    rows = [(d["_host"], d) for d in dicts]

    out(f"\n== {n} hosts ==")
    out(f"HostTable upsert: {n / insert_s:,.0f} snapshots/s (insert), "
        f"{n / update_s:,.0f} snapshots/s (update)")
    if why is not None:
        out(f"ClassAd baseline {why}")
    out(f"{'case':<11} {'matches':>8} {'select[] e2e':>13} {'mask only':>11} {'lambda':>11} "
        f"{'classad':>11}  {'x lambda':>9} {'mask x lambda':>13} {'x classad':>9}  agree")
    ok = True
    repeat = 7 if n <= 20000 else 3
    for case in cases(matlab):
        compiled = compile_select(case.select, CATALOG)
        got = compiled.select(table, NOW)
        e2e = _best(functools.partial(compiled.select, table, NOW), repeat, 5)
        mask = _best(functools.partial(truth, compiled.tree, table, NOW), repeat, 5)
        want = _filter(case.python, rows)
        lam = _best(functools.partial(_filter, case.python, rows), repeat)
        counts = [len(got), len(want)]
        ca_text = "n/a"
        ca_ratio = "n/a"
        if classad is not None:
            tree = classad.ExprTree(case.classad)
            ca_hosts = _classad_filter(tree, ads)
            counts.append(len(ca_hosts))
            ca = _best(functools.partial(_classad_filter, tree, ads), 1)
            ca_text = f"{n / ca / 1e6:7.2f} M/s"
            ca_ratio = f"{ca / e2e:8.0f}x"
        agree = len(set(counts)) == 1 and got == want
        ok = ok and agree
        out(f"{case.label:<11} {len(got):>8} {n / e2e / 1e6:8.2f} M/s {n / mask / 1e6:6.2f} M/s "
            f"{n / lam / 1e6:6.2f} M/s {ca_text:>11}  {lam / e2e:8.1f}x {lam / mask:12.1f}x "
            f"{ca_ratio:>9}  "
            f"{'yes' if agree else 'NO'} {'/'.join(map(str, counts))}")
        if case.label == "mixed":
            out(f"end-to-end: {e2e * 1e3:.3f} ms to return the {len(got)} matching host names "
                f"of {n} (mixed); lambda {lam * 1e3:.3f} ms")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m tests.bench.select`."""
    parser = argparse.ArgumentParser(prog="python -m tests.bench.select", description=__doc__)
    parser.add_argument("--hosts", default="1000,10000",
                        help="comma-separated host counts (default 1000,10000)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.hosts.split(",") if s.strip()]
    print("select[] benchmark: host-evaluations/s, best of several runs; "
          "e2e = sorted host names returned")
    ok = all([run(n, args.seed, print) for n in sizes])
    if not ok:
        print("MISMATCH: the evaluators disagree on match counts", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
