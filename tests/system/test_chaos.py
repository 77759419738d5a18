"""The seeded chaos run (issue 27): nothing a reporter published is lost, whatever the faults.

- default suite: one fixed seed on one nats-server, a short random tail, every
  fault but repartitioning and server kills — a late first start, snapshot
  deletion and `kill -9` of the projector included;
- `pytest -m slow tests/system/test_chaos.py`: several seeds on a 3-node R3 cluster
  with every fault.  `CRR_CHAOS_SEEDS=1,2,3,4,5` and `CRR_CHAOS_DURATION=60`
  (seconds of random faults per seed) choose them; `CRR_CHAOS_HOSTS` the hosts.

Each run prints its seed, the faults injected and the counts (`-rP` or `-s`
shows them for a passing run); a failure says the seed and the first host whose
values differ (expected vs got).  `python -m tests.support.chaos --seed S` reruns one.
See docs/chaos.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos_oracle import Oracle
from tests.support.chaos_run import FAULTS, ChaosConfig, ChaosResult, ChaosRun, first_difference

SHORT_SEED = 27
SHORT_FAULTS = tuple(f for f in FAULTS if f not in ("repartition", "server_kill"))
"""The default suite's run: < 40 s on a loaded 2-core machine.  The slow run adds
repartitioning (two projector starts) and server kills (each a reconnect and a
re-sent pipeline; `crr.bus.pipeline_publish.PONG_WAIT`)."""


def _env_seeds() -> list[int]:
    raw = os.environ.get("CRR_CHAOS_SEEDS", "1,2,3,4,5")
    return [int(s) for s in raw.replace(" ", "").split(",") if s]


SLOW_DURATION = float(os.environ.get("CRR_CHAOS_DURATION", "30"))
HOSTS = int(os.environ.get("CRR_CHAOS_HOSTS", "24"))


async def _run(config: ChaosConfig, tmp_path: Path) -> ChaosResult:
    result = await ChaosRun(config, tmp_path).run()
    print(result.summary())
    return result


def _assert_passed(result: ChaosResult) -> None:
    """Both checks passed; else the seed, the first differing host and what failed."""
    seed = result.config.seed
    assert not result.stuck, f"seed {seed}: not recovered: {result.stuck[0]}"
    assert not result.differing, (
        f"seed {seed}: {len(result.differing)} host(s) differ from the oracle; first: "
        f"{result.first_difference}")
    assert result.verify_ok, f"seed {seed}: crr replay --verify failed:\n{result.verify_output}"


@pytest.mark.slow  # ≥ 2 s: the default suite stays under 5 min; `.ci/run` runs -m slow
@pytest.mark.timeout(90)
async def test_chaos_short_fixed_seed(tmp_path: Path) -> None:
    """Seed 27 on one server: after a late first start, projector kills, CRR_SNAPSHOT
    deletions, a server kill, agent restarts, a forget, catalog changes and garbage, the
    snapshot equals `crr replay --verify` and every host equals the oracle."""
    result = await _run(ChaosConfig(seed=SHORT_SEED, duration=3.0, hosts=16,
                                    faults=SHORT_FAULTS), tmp_path)
    assert {"projector_kill", "snapshot_delete", "late_start"} <= set(result.injected)
    assert result.counts["reports partial"] > 0
    assert result.counts["malformed events"] > 0
    _assert_passed(result)


@pytest.mark.slow
@pytest.mark.timeout(SLOW_DURATION + 360)
@pytest.mark.parametrize("seed", _env_seeds())
async def test_chaos_cluster(seed: int, tmp_path: Path) -> None:
    """One seed on a 3-node R3 cluster, every fault (repartitioning 1 <-> 2 and node kills
    included): both checks pass."""
    result = await _run(ChaosConfig(seed=seed, duration=SLOW_DURATION, hosts=HOSTS,
                                    cluster=True), tmp_path)
    assert set(FAULTS) <= set(result.injected), result.schedule
    _assert_passed(result)


def test_oracle_keeps_omitted_values_and_follows_forget_and_catalogs() -> None:
    """The oracle's own rules: a partial report keeps what it omits, an invalid value
    changes nothing, forget removes the host, a catalog drops what it no longer accepts
    (and a later catalog does not bring it back)."""
    o = Oracle()
    o.report("h", "sys", {"r_free": 900.0, "r_os": "rhel9", "r_sets": ["b", "a", "a"]})
    o.report("h", "sys", {"r_free": -5.0, "r_ok": True})  # -5 is below min 0
    o.report("h", "ds", {"r_os": "stolen"})  # r_os is sys's: rejected
    assert o.values() == {"h": {"r_free": 900.0, "r_os": "rhel9", "r_sets": ["a", "b"],
                                "r_ok": True}}
    o.apply_catalog("tight")  # r_free max 500
    o.apply_catalog("no_sets")
    o.apply_catalog("base")
    assert o.values() == {"h": {"r_os": "rhel9", "r_ok": True}}
    o.report("g", "ds", {"d_cache": []})
    o.forget("h")
    assert o.values() == {"g": {"d_cache": []}}


def test_failure_names_the_seed_and_the_first_differing_host() -> None:
    """A failed run's summary says the seed and the first differing host, expected vs got."""
    want: dict[str, dict[str, Any]] = {"h1": {"r_os": "rhel9"},
                                       "h2": {"r_free": 1.0, "r_os": "rhel8"}}
    got: dict[str, dict[str, Any]] = {"h1": {"r_os": "rhel9"}, "h2": {"r_free": 1.0}, "h3": {}}
    result = ChaosResult(ChaosConfig(seed=99), verify_ok=True)
    result.differing, result.first_difference = first_difference(want, got)
    result.counts["hosts at end"] = 2
    text = result.summary()
    assert result.differing == ["h2", "h3"]
    assert 'first differing host: h2: r_os: expected "rhel8", got absent' in text
    assert "crr chaos: seed 99 FAILED" in text
    assert not result.ok
