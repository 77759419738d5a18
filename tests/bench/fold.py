"""Fold throughput and state memory: `python -m tests.bench.fold [--hosts N] [--reports N]`.

Throughput: 20-value reports (numbers, booleans, a string, a string set)
folded in-process through `crr.projections.fold.apply`, in stream order with
server times advancing so every host reports once per interval and expiry
runs as it would live.  The baseline, measured in the same run over the same
payloads, is the least any projector must do: a msgspec decode plus a dict
update per report.  Goal: the fold at >= 50% of the baseline's rate.

Memory: a state holding `--memory-hosts` hosts x 20 values (default 50k;
goal <= 400 MB), measured with tracemalloc (bytes the state keeps) and the
process's peak RSS (`resource.getrusage`).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from crr.projections.envelope import Envelope
from crr.projections.fold import apply, expire
from crr.projections.state import ProjectionState
from crr.schemas.catalog import Catalog, ReporterSpec, ResourceSpec
from crr.schemas.codec import encode
from crr.schemas.events import Report
from crr.schemas.subjects import CATALOG, event_subject

INTERVAL = 30.0
T0 = 1_800_000_000.0
N_NUMERIC, N_BOOLEAN, N_STRING, N_SET = 16, 2, 1, 1  # 20 values per report


def bench_catalog() -> Catalog:
    """One script reporter owning 20 host-scope resources of every kind."""
    resources: dict[str, ResourceSpec] = {}
    for i in range(N_NUMERIC):
        resources[f"num{i:02d}"] = ResourceSpec(kind="numeric", reporter="bench", min=0)
    for i in range(N_BOOLEAN):
        resources[f"flag{i}"] = ResourceSpec(kind="boolean", reporter="bench")
    for i in range(N_STRING):
        resources[f"text{i}"] = ResourceSpec(kind="string", reporter="bench")
    for i in range(N_SET):
        resources[f"set{i}"] = ResourceSpec(kind="string_set", reporter="bench")
    return Catalog(resources=resources, reporters={
        "bench": ReporterSpec(type="script", command=["bench.sh"], interval=INTERVAL)})


def payload(host: str, n: int) -> bytes:
    """The `n`-th report of `host`: 20 values that change from report to report."""
    values: dict[str, Any] = {f"num{i:02d}": (n * 7 + i) % 1000 + 0.5 for i in range(N_NUMERIC)}
    values.update({f"flag{i}": (n + i) % 2 == 0 for i in range(N_BOOLEAN)})
    values.update({f"text{i}": f"rhel{9 - (n % 2)}" for i in range(N_STRING)})
    values.update({f"set{i}": ["c4", "imagenet", f"ds{n % 5}"] for i in range(N_SET)})
    return json.dumps({"reporter": "bench", "host": host, "boot": "b", "seq": n,
                       "observed_at": "2027-01-15T08:00:00.000Z", "values": values}).encode()


def envelopes(hosts: int, reports: int, *, variants: int = 4) -> list[Envelope]:
    """`reports` report envelopes round-robin over `hosts`, each host once per interval."""
    names = [f"node{i:05d}" for i in range(hosts)]
    subjects = [event_subject("report", "bench", h) for h in names]
    bodies = [[payload(h, v) for v in range(variants)] for h in names]
    step = INTERVAL / hosts
    return [
        Envelope(seq=k + 2, subject=subjects[k % hosts], received_at=T0 + 1 + k * step,
                 data=bodies[k % hosts][(k // hosts) % variants])
        for k in range(reports)
    ]


def catalog_envelope() -> Envelope:
    """The catalog event that starts every run."""
    return Envelope(seq=1, subject=CATALOG, received_at=T0, data=encode(bench_catalog()))


def run_fold(envs: list[Envelope]) -> float:
    """Seconds to fold `envs` into a fresh state (after the catalog)."""
    state = ProjectionState()
    apply(state, catalog_envelope())
    t = time.perf_counter()
    for env in envs:
        apply(state, env)
    return time.perf_counter() - t


def run_raw_struct(envs: list[Envelope]) -> float:
    """Baseline: typed msgspec decode (the Report struct) plus a dict update per report."""
    dec = msgspec.json.Decoder(Report)
    store: dict[str, dict[str, Any]] = {}
    t = time.perf_counter()
    for env in envs:
        r = dec.decode(env.data)
        store.setdefault(env.subject, {}).update(r.values)
    return time.perf_counter() - t


def run_raw_dict(envs: list[Envelope]) -> float:
    """Baseline: untyped msgspec decode plus a dict update per report."""
    dec = msgspec.json.Decoder()
    store: dict[str, dict[str, Any]] = {}
    t = time.perf_counter()
    for env in envs:
        doc = dec.decode(env.data)
        store.setdefault(env.subject, {}).update(doc["values"])
    return time.perf_counter() - t


def best_of(runs: int, fn: Callable[[list[Envelope]], float], envs: list[Envelope]) -> float:
    """The fastest of `runs` timings (least disturbed by the machine)."""
    best = float("inf")
    for _ in range(runs):
        gc.collect()
        best = min(best, fn(envs))
    return best


def _one_per_host(hosts: int) -> Iterator[Envelope]:
    for i in range(hosts):
        h = f"node{i:06d}"
        yield Envelope(seq=i + 2, subject=event_subject("report", "bench", h),
                       received_at=T0 + 1 + i * 1e-4, data=payload(h, i))


def _build(hosts: int) -> ProjectionState:
    state = ProjectionState()
    apply(state, catalog_envelope())
    for env in _one_per_host(hosts):
        apply(state, env)
    expire(state, T0 + 1)  # nothing due: the state is all fresh values
    assert len(state.hosts) == hosts
    return state


def measure_memory(hosts: int) -> tuple[float, float, float]:
    """(peak RSS MB of the whole process, its growth MB, MB the state holds per tracemalloc).

    Run first, before anything else fills the heap, so the peak RSS is the
    state's plus the interpreter's.  tracemalloc runs in a second build (its
    own bookkeeping would inflate the RSS).
    """
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    state = _build(hosts)
    gc.collect()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del state
    gc.collect()
    tracemalloc.start()
    state = _build(hosts)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del state
    return peak / 1e3, (peak - before) / 1e3, held / 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the numbers; exit 1 if a goal is missed."""
    ap = argparse.ArgumentParser(prog="python -m tests.bench.fold",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--hosts", type=int, default=2000, help="hosts reporting (default 2000)")
    ap.add_argument("--reports", type=int, default=100_000, help="reports folded (default 100k)")
    ap.add_argument("--runs", type=int, default=3, help="timings per variant; best counts")
    ap.add_argument("--memory-hosts", type=int, default=50_000,
                    help="hosts in the memory measurement (0 skips it; default 50k)")
    ap.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_only:
        peak, grown, held = measure_memory(args.memory_hosts)
        print(f"  state of {args.memory_hosts} hosts x 20 values: peak RSS {peak:.0f} MB "
              f"(+{grown:.0f} MB for the state), {held:.0f} MB held per tracemalloc  "
              f"(goal <= 400 MB)")
        return 0 if peak <= 400 else 1

    envs = envelopes(args.hosts, args.reports)
    size = sum(len(e.data) for e in envs) / len(envs)
    print(f"{args.reports} reports of 20 values (~{size:.0f} B each) over {args.hosts} hosts, "
          f"best of {args.runs}")
    t_fold = best_of(args.runs, run_fold, envs)
    t_struct = best_of(args.runs, run_raw_struct, envs)
    t_dict = best_of(args.runs, run_raw_dict, envs)
    n = args.reports
    rate_fold, rate_struct, rate_dict = n / t_fold, n / t_struct, n / t_dict
    baseline = max(rate_struct, rate_dict)
    ratio = rate_fold / baseline
    print(f"  fold (apply):                  {rate_fold:>10,.0f} reports/s "
          f"({1e6 / rate_fold:.2f} us/report)")
    print(f"  raw: decode Report + update:   {rate_struct:>10,.0f} reports/s")
    print(f"  raw: decode dict + update:     {rate_dict:>10,.0f} reports/s")
    print(f"  fold / raw (faster baseline):  {ratio:.0%}  (goal >= 50%)")
    ok = ratio >= 0.5
    if args.memory_hosts:
        # A fresh process, so the peak RSS is the state's and the interpreter's only.
        child = subprocess.run(
            [sys.executable, "-m", "tests.bench.fold", "--memory-only",
             "--memory-hosts", str(args.memory_hosts)], check=False)
        ok = ok and child.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
