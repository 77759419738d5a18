"""`crr bench`'s ramp rules and publishers: the relay comparison is as fair as these."""

from __future__ import annotations

from typing import Any

from crr.bus.streams import provision
from crr.producers.simulator import Fleet, sim_catalog
from tests.bench.publishers import RESOURCES, run_publishers, shard_fleet
from tests.bench.suite import ramp_summary, ramp_verdict, step_verdict, sustained


def _step(offered: int, **kw: Any) -> dict[str, Any]:
    step = {"offered": offered, "duration": 10.0, "events": offered * 10, "lost": 0,
            "catch_up_s": 0.1, **kw}
    step["verdict"] = step_verdict(step)
    return step


def test_a_step_is_sustained_only_when_published_delivered_and_caught_up() -> None:
    """Each rule on its own fails a step, and says which; the figure is the highest
    sustained step."""
    assert _step(5_000)["verdict"] == "sustained"
    assert _step(5_000, events=40_000)["verdict"] == "publisher-limited"
    assert _step(5_000, lost=3)["verdict"] == "lost 3"
    assert _step(5_000, hosts_mismatched=2)["verdict"] == "2 hosts differ"
    assert _step(5_000, catch_up_s=2.5)["verdict"] == "fell behind"
    steps = [_step(5_000), _step(10_000), _step(15_000, catch_up_s=9.0)]
    assert sustained(steps) == 10_000
    assert sustained([_step(5_000, lost=1)]) == 0


def test_the_verdict_line_names_both_rates_the_ratio_and_a_publisher_limit() -> None:
    """One plain line: crr's rate, the relay's, the ratio against the goal, and a warning
    when the relay's ramp ended at the publishers (its figure is then a lower bound)."""
    crr = ramp_summary([_step(5_000), _step(10_000), _step(15_000, catch_up_s=5.0)])
    relay = ramp_summary([_step(5_000), _step(10_000), _step(15_000),
                          _step(20_000, events=100_000)])
    line = ramp_verdict({"ramp": crr, "relay": relay})
    assert line is not None
    assert line.startswith("crr max sustained 10,000/s, relay 15,000/s, ratio 67%, goal ≥ 50%: "
                           "met")
    assert "publishers could not reach the next step for relay" in line
    top = ramp_summary([_step(5_000)])
    assert top["ladder_top"]
    assert ramp_verdict({"ramp": crr}) is None


def test_shards_split_the_names_of_one_fleet() -> None:
    """The publisher processes together report exactly the hosts one fleet of that size
    has (the projector's state is the same size whatever the number of publishers)."""
    names = Fleet(sim_catalog(RESOURCES, 10.0), 1_001).names
    shards = [shard_fleet(1_001, k, 3, seed=5, catalog_interval=10.0).names for k in range(3)]
    assert sorted(n for s in shards for n in s) == sorted(names)
    assert len({n for s in shards for n in s}) == len(names)


async def test_publishers_report_what_they_sent(nats_url: str, nc: Any) -> None:
    """Two child publishers: every report acknowledged, the last sequence the stream's,
    and the last values sent for exactly the hosts that reported in the step (a step
    shorter than a round leaves the others as they were: nothing to check there)."""
    await provision(nc)
    pub = await run_publishers(nats_url, hosts=200, load=100, duration=1.0, processes=2,
                               catalog_interval=10.0, expected=True)
    info = await nc.jetstream().stream_info("CRR_EVENTS")
    assert pub.events == pub.acked > 0
    assert pub.last_seq == info.state.last_seq
    assert pub.finished > pub.started
    assert len(pub.expected) == pub.events < 200  # one report per host at most: 1 s of 2 s
    assert all(len(values) == RESOURCES for values in pub.expected.values())
