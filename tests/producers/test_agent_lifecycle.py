"""The agent as a whole: environment isolation, elim scripts, inventory, live catalog, clean stop.

Real agent, real nats-server, real scripts; events observed on the broker.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import msgspec
import nats

from crr.bus.streams import provision
from crr.producers.agent import Agent
from crr.schemas.catalog import Catalog, ResourceSpec
from crr.schemas.catalog_loader import load_catalog
from crr.schemas.codec import encode
from crr.schemas.subjects import SNAPSHOT_CATALOG
from tests.support.agent import (
    HOST,
    SAFE_ENV,
    Recorder,
    fast,
    good_catalog,
    live_in_groups,
    read_pids,
    running_agent,
    wait_gone,
    write_script,
    zombie_children,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "ops" / "examples"

# The interpreter by absolute path: a `/usr/bin/env python3` shim (pyenv) adds variables.
ENV_DUMP = f"#!{sys.executable}\n" + """import json, os
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps({"values": {"env_v": json.dumps(dict(os.environ), sort_keys=True),
                             "fds_v": fds}}))
"""


async def test_script_sees_only_the_allowed_environment(nats_url: str, tmp_path: Path) -> None:
    """PATH, LANG, the CRR_* names and allowlisted names reach a script; credentials do not.

    Nor do the agent's file descriptors (its NATS socket): only stdin, stdout, stderr.
    """
    write_script(tmp_path, "env.py", ENV_DUMP)
    spec = fast(["env.py"], env=["CRR_SCRATCH_DIR", "NOT_SET_ANYWHERE"], cwd=str(tmp_path))
    catalog = good_catalog(tmp_path, env=spec)
    environ = {**SAFE_ENV, "CRR_SCRATCH_DIR": "/scratch", "NATS_URL": nats_url,
               "NATS_CREDS": "/etc/crr/agent.creds", "AWS_SECRET_ACCESS_KEY": "hunter2",
               "HOME": "/root"}
    async with running_agent(nats_url, catalog, tmp_path, environ=environ) as rig:
        await rig.recorder.wait_reports("env", 1)
    report = rig.recorder.reports("env")[0].event
    fds = report.values["fds_v"]  # type: ignore[union-attr]
    assert fds[:3] == [0, 1, 2]
    assert len(fds) == 4  # the last one is the listing's own directory handle
    seen = json.loads(report.values["env_v"])  # type: ignore[union-attr]
    seen.pop("PWD", None)  # set by the /bin/sh that changes into `cwd`
    assert seen == {
        "PATH": SAFE_ENV["PATH"], "LANG": "C.UTF-8", "CRR_HOST": HOST, "CRR_REPORTER": "env",
        "CRR_INTERVAL": "0.3", "CRR_RESOURCES": "env_v", "CRR_SCRATCH_DIR": "/scratch",
        "LSF_RESOURCES": "env_v", "ELIM_ABORT_VALUE": "97", "LSF_MASTER": "N",
        "PYTHONUNBUFFERED": "1",
    }


ELIM_FINITE = """#!/bin/sh
echo "4 load15 0.75 up yes tags a,b,c site ok"
echo "2 load15"
echo "garbage"
echo "2 mem_free abc up maybe"
"""

ELIM_LOOPING = """#!/bin/sh
echo $$ >> pids
while :; do
    echo "1 load15 1.5"
    sleep 5
done
"""


def _elim_catalog(tmp_path: Path, mode: str, command: str) -> Catalog:
    base = good_catalog(tmp_path)
    resources = {
        **base.resources,
        "load15": ResourceSpec(kind="numeric", reporter="elim"),
        "up": ResourceSpec(kind="boolean", reporter="elim"),
        "tags": ResourceSpec(kind="string_set", reporter="elim"),
        "site": ResourceSpec(kind="string", reporter="elim"),
        "mem_free": ResourceSpec(kind="numeric", reporter="elim"),
    }
    spec = fast([command], format="elim", mode=mode, cwd=str(tmp_path), interval=0.4)
    return msgspec.structs.replace(base, resources=resources,
                                   reporters={**base.reporters, "elim": spec})


async def test_elim_lines_convert_by_kind_and_bad_lines_are_named(
    nats_url: str, tmp_path: Path
) -> None:
    """An exiting elim: good pairs are converted by kind, malformed lines give `bad_output`."""
    write_script(tmp_path, "elim.finite", ELIM_FINITE)
    catalog = _elim_catalog(tmp_path, "periodic", "elim.finite")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        health = await rig.recorder.wait_state("elim", "bad_output")
        await rig.recorder.wait_reports("elim", 1)
        await rig.recorder.wait_more_reports("good", 2)
    values = rig.recorder.reports("elim")[0].event.values  # type: ignore[union-attr]
    assert values == {"load15": 0.75, "up": True, "tags": ["a", "b", "c"], "site": "ok"}
    assert health.detail is not None
    assert "announces 2 pair(s) but has 1 token(s)" in health.detail
    assert "does not start with a count" in health.detail
    assert "mem_free: could not convert string to float: 'abc'" in health.detail
    assert "up: 'maybe' is not a boolean" in health.detail


async def test_looping_elim_runs_unchanged_as_periodic(nats_url: str, tmp_path: Path) -> None:
    """A classic elim that never exits: each run takes its line and stops it; `ok`, none left."""
    write_script(tmp_path, "elim.load", ELIM_LOOPING)
    catalog = _elim_catalog(tmp_path, "periodic", "elim.load")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 3)
        pids = read_pids(tmp_path / "pids")
        assert len(pids) >= 3  # one process per run
        older = pids - set(list(pids)[-1:])
        assert rig.recorder.states("elim") == ["ok"]
        assert all(r.event.values == {"load15": 1.5}  # type: ignore[union-attr]
                   for r in rig.recorder.reports("elim"))
        await wait_gone(older)
    await wait_gone(read_pids(tmp_path / "pids"))


async def test_looping_elim_as_stream_reports_each_line(nats_url: str, tmp_path: Path) -> None:
    """`mode: stream` + `format: elim`: every elim line is a report from one process."""
    write_script(tmp_path, "elim.fast", "#!/bin/sh\necho $$ >> pids\n"
                 "while :; do echo '1 load15 2.5'; sleep 0.1; done\n")
    catalog = _elim_catalog(tmp_path, "stream", "elim.fast")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("elim", 4)
        assert len(read_pids(tmp_path / "pids")) == 1
        assert rig.recorder.states("elim") == ["ok"]
    assert rig.recorder.states("elim") == ["ok", "stopped"]


INVENTORY = """#!/bin/sh
cat <<'JSON'
{"values": {"inv_v": 2}, "inventory": {"devices": [
  {"name": "gpu0", "attributes": {"model": {"string": "H100"}, "memory_gib": {"int": 80}},
   "capacity": {"memory": {"value": "80Gi"}}}]}}
JSON
"""


async def test_inventory_is_published_with_a_pool(nats_url: str, tmp_path: Path) -> None:
    """An `inventory` member becomes an Inventory event; the pool defaults to host/reporter."""
    write_script(tmp_path, "inv.sh", INVENTORY)
    catalog = good_catalog(tmp_path, inv=fast(["inv.sh"]))
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait("two inventories",
                                lambda: len(rig.recorder.inventories("inv")) >= 2)
    first, second = rig.recorder.inventories("inv")[:2]
    assert first.pool.name == f"{HOST}/inv"
    assert first.pool.generation == second.pool.generation == 1  # unchanged devices
    assert first.devices[0].attributes["memory_gib"].int == 80
    assert first.devices[0].capacity["memory"].value == "80Gi"
    assert first.seq != second.seq


async def test_catalog_changes_apply_live(nats_url: str, tmp_path: Path) -> None:
    """Add, change and remove a reporter by publishing catalogs; the agent follows each."""
    catalog = good_catalog(tmp_path)
    write_script(tmp_path, "one.sh", "#!/bin/sh\necho '{\"values\": {\"new_v\": 1}}'\n")
    write_script(tmp_path, "two.sh", "#!/bin/sh\necho '{\"values\": {\"new_v\": 2}}'\n")
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("good", 1)
        assert rig.recorder.reports("new") == []

        added = good_catalog(tmp_path, new=fast(["one.sh"]))
        await rig.set_catalog(added)
        await rig.recorder.wait("a report of 1", lambda: any(
            r.event.values == {"new_v": 1} for r in rig.recorder.reports("new")))  # type: ignore[union-attr]

        changed = good_catalog(tmp_path, new=fast(["two.sh"]))
        await rig.set_catalog(changed)
        await rig.recorder.wait("a report of 2", lambda: any(
            r.event.values == {"new_v": 2} for r in rig.recorder.reports("new")))  # type: ignore[union-attr]
        assert "stopped" not in rig.recorder.states("new")

        elsewhere = good_catalog(tmp_path, new=fast(["two.sh"], hosts=["gpu*"]))
        await rig.set_catalog(elsewhere)
        await rig.recorder.wait_state("new", "stopped")
        assert set(rig.agent.runners) == {"good"}
        await rig.recorder.wait_more_reports("good", 2)
    # One publisher per reporter and boot: message ids never repeat across the restarts.
    seqs = [r.event.seq for r in rig.recorder.events if r.event.reporter == "new"]
    assert len(seqs) == len(set(seqs))


async def test_agent_stop_leaves_no_process(nats_url: str, tmp_path: Path) -> None:
    """Stopping the agent kills every group (streams, hung runs, their children): none left."""
    write_script(tmp_path, "stream.sh",
                 "#!/bin/sh\necho $$ >> pids\nsleep 60 &\necho $! >> pids\n"
                 "while :; do echo '{\"values\": {\"s_v\": 1}}'; sleep 0.1; done\n")
    write_script(tmp_path, "hang.sh", "#!/bin/sh\ntrap '' TERM\necho $$ >> pids\n"
                 "sleep 60 &\necho $! >> pids\nwait\n")
    catalog = good_catalog(
        tmp_path,
        s=fast(["stream.sh"], mode="stream", cwd=str(tmp_path)),
        h=fast(["hang.sh"], timeout=30.0, interval=60.0, cwd=str(tmp_path)),
    )
    async with running_agent(nats_url, catalog, tmp_path) as rig:
        await rig.recorder.wait_reports("s", 2)
        await rig.recorder.wait("both scripts started",
                                lambda: len(read_pids(tmp_path / "pids")) >= 4)
        pids = read_pids(tmp_path / "pids")
        assert len(live_in_groups(pids)) >= 4
        await rig.agent.stop()
        # After stop() returns, the leaders are reaped and their groups SIGKILLed.
        await wait_gone(pids, within=2.0)
        assert live_in_groups(pids) == []
        assert zombie_children() == []
        for name in ("good", "s", "h"):
            await rig.recorder.wait_state(name, "stopped")


async def test_example_reporters_run_under_the_agent(nats_url: str, tmp_path: Path) -> None:
    """The shipped examples (scratch, datasets, site_health, elim.load, gpus) work as declared."""
    example = load_catalog(EXAMPLES / "resources.yaml")
    quick = {
        name: msgspec.structs.replace(spec, interval=min(spec.interval, 1.0))
        for name, spec in example.reporters.items()
    }
    catalog = msgspec.structs.replace(example, reporters=quick)
    flag = tmp_path / "site.flag"
    flag.write_text("drain\n")
    environ = {**SAFE_ENV, "CRR_SITE_FLAG": str(flag), "CRR_SCRATCH_DIR": str(tmp_path)}
    # On a GPU host gpus.py would report; hide nvidia-smi so the outcome is the same everywhere.
    environ["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    async with running_agent(nats_url, catalog, EXAMPLES, environ=environ) as rig:
        for reporter in ("scratch", "datasets", "site_health", "elim_load"):
            await rig.recorder.wait_reports(reporter, 1)
        await rig.recorder.wait_state("gpus", "not_applicable")

    def values(reporter: str) -> dict[str, object]:
        return rig.recorder.reports(reporter)[0].event.values  # type: ignore[union-attr]

    assert set(values("scratch")) == {"scratch_free", "scratch_total"}
    assert values("datasets") == {"datasets": ["imagenet", "c4", "wikitext"]}
    assert values("site_health") == {"site_ok": False, "site_state": "drain"}
    assert isinstance(values("elim_load")["load15"], float)
    for reporter in ("scratch", "datasets", "site_health", "elim_load"):
        assert rig.recorder.states(reporter)[0] == "ok"


def test_example_catalog_declares_every_example_script() -> None:
    """Every script reporter in the example catalog has an executable under ops/examples."""
    example = load_catalog(EXAMPLES / "resources.yaml")
    for name, spec in example.reporters.items():
        if spec.type == "script":
            assert spec.command is not None, name
            path = EXAMPLES / spec.command[0]
            assert os.access(path, os.X_OK), path


async def test_agent_started_before_the_streams_waits_for_them(
    nats_url: str, tmp_path: Path
) -> None:
    """An agent started on a bare server retries until the catalog exists, then runs it."""
    nc = await nats.connect(nats_url)
    try:
        recorder = Recorder()
        await nc.subscribe("crr.v1.>", cb=recorder.on_msg)
        agent = Agent(nc, HOST, tmp_path, environ=SAFE_ENV, kill_grace=0.3, exit_grace=0.2)
        await agent.start()
        try:
            await provision(nc)
            await nc.jetstream().publish(SNAPSHOT_CATALOG, encode(good_catalog(tmp_path)))
            await agent.wait_applied(1, within=15.0)
            await recorder.wait_reports("good", 2)
        finally:
            await agent.stop()
        assert recorder.states("good") == ["ok", "stopped"]
    finally:
        await nc.drain()
