"""Misbehaving reporter scripts: each ends in its documented Health state, never hurts the agent.

Every test runs a real agent on a real nats-server with a misbehaving
reporter beside the well-behaved `good` reporter (interval 0.25 s), and
checks both the misbehaving reporter's Health and that `good` kept
reporting on time throughout.  Scripts write their pids to files so the
test can check, through /proc and pidfds, that nothing was left running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crr.producers.publisher import ReporterPublisher
from crr.producers.runner import ReporterRunner, RunnerConfig
from crr.producers.spawn import CommandError, resolve_command
from crr.schemas.catalog import ReporterSpec
from tests.support.agent import (
    GOOD_MAX_GAP,
    AgentRig,
    MemorySink,
    fast,
    good_catalog,
    live_in_groups,
    read_pids,
    running_agent,
    wait_gone,
    write_script,
    zombie_children,
)
from tests.support.faults import eventually


async def _good_on_time(rig: AgentRig, more: int = 4) -> None:
    """Wait for `more` further reports of `good`; none may have come late."""
    await rig.recorder.wait_more_reports("good", more)
    gap = rig.recorder.max_gap("good")
    assert gap <= GOOD_MAX_GAP, f"good reporter was late: {gap:.2f}s between reports"
    assert "ok" in rig.recorder.states("good")
    assert set(rig.recorder.states("good")) <= {"ok", "stopped"}


def _catalog(tmp_path: Path, name: str, body: str, **spec: object) -> tuple[Path, ReporterSpec]:
    """Write script `name`; its spec runs it in `tmp_path` (where it keeps pid/run files)."""
    write_script(tmp_path, name, body)
    return tmp_path / name, fast([name], cwd=str(tmp_path), **spec)


async def test_non_json_output_is_bad_output(nats_url: str, tmp_path: Path) -> None:
    """A script printing prose gets `bad_output`; no report is published for it."""
    _, spec = _catalog(tmp_path, "bad.sh", "#!/bin/sh\necho 'disk is fine, thanks'\n")
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "bad_output")
        assert health.detail is not None
        assert "not valid JSON" in health.detail
        await _good_on_time(rig)
        assert rig.recorder.reports("bad") == []


async def test_truncated_json_is_bad_output(nats_url: str, tmp_path: Path) -> None:
    """A JSON document cut short is `bad_output`, not a partial report."""
    _, spec = _catalog(tmp_path, "bad.sh", "#!/bin/sh\nprintf '{\"values\": {\"bad_v\": 1'\n")
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        await rig.recorder.wait_state("bad", "bad_output")
        await _good_on_time(rig)
        assert rig.recorder.reports("bad") == []


async def test_empty_output_is_bad_output(nats_url: str, tmp_path: Path) -> None:
    """Exit 0 with nothing on stdout is `bad_output` ("no output")."""
    _, spec = _catalog(tmp_path, "bad.sh", "#!/bin/sh\nexit 0\n")
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "bad_output")
        assert health.detail == "no output"
        await _good_on_time(rig)


async def test_huge_single_line_is_cut_off(nats_url: str, tmp_path: Path) -> None:
    """One line far over `max_output_bytes` is cut off (not buffered) and the group killed."""
    body = ("#!/bin/sh\necho $$ >> pids\n"
            "head -c 5000000 /dev/zero | tr '\\0' x\necho\n")
    _, spec = _catalog(tmp_path, "bad.sh", body, max_output_bytes=4096)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "bad_output")
        assert health.detail is not None
        assert "exceeds max_output_bytes (4096 bytes)" in health.detail
        await _good_on_time(rig)
        assert live_in_groups(read_pids(tmp_path / "pids")) == []


async def test_endless_output_is_cut_off(nats_url: str, tmp_path: Path) -> None:
    """`yes` forever: cut off at the limit, its group killed, the agent unaffected."""
    body = "#!/bin/sh\necho $$ >> pids\nexec yes '{\"values\": {\"bad_v\": 1}}'\n"
    _, spec = _catalog(tmp_path, "bad.sh", body, max_output_bytes=8192)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "bad_output")
        assert health.detail is not None
        assert "exceeds" in health.detail
        await wait_gone(read_pids(tmp_path / "pids"))
        await _good_on_time(rig)
        assert rig.recorder.reports("bad") == []


async def test_hang_past_timeout_is_killed(nats_url: str, tmp_path: Path) -> None:
    """A run that outlives its timeout is `timeout`; its whole group (with children) dies."""
    body = "#!/bin/sh\necho $$ >> pids\nsleep 30 &\necho $! >> pids\nwait\necho '{}'\n"
    _, spec = _catalog(tmp_path, "bad.sh", body, timeout=0.4, interval=0.5)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "timeout")
        assert health.detail is not None
        assert "no result within 0.4s" in health.detail
        pids = read_pids(tmp_path / "pids")
        assert len(pids) >= 2
        await wait_gone(pids)
        await _good_on_time(rig)


async def test_sigterm_ignored_gets_sigkill(nats_url: str, tmp_path: Path) -> None:
    """A script (and child) ignoring SIGTERM is SIGKILLed after the grace: `timeout`, none left."""
    body = ("#!/bin/sh\ntrap '' TERM\necho $$ >> pids\n"
            "sleep 30 &\necho $! >> pids\nwait\nwait\n")
    _, spec = _catalog(tmp_path, "bad.sh", body, timeout=0.3, interval=0.5)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        await rig.recorder.wait_state("bad", "timeout")
        pids = read_pids(tmp_path / "pids")
        assert len(pids) >= 2
        await wait_gone(pids)
        await _good_on_time(rig)


async def test_non_zero_exit_is_failed_with_stderr(nats_url: str, tmp_path: Path) -> None:
    """Exit 3 is `failed` with `exit_code` 3 and the stderr tail in the detail; output dropped."""
    body = "#!/bin/sh\necho '{\"values\": {\"bad_v\": 1}}'\necho 'df: /scratch: gone' >&2\nexit 3\n"
    _, spec = _catalog(tmp_path, "bad.sh", body)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "failed")
        assert health.exit_code == 3
        assert health.detail == "exit 3: df: /scratch: gone"
        await _good_on_time(rig)
        assert rig.recorder.reports("bad") == []


async def test_killed_by_signal_is_crashed(nats_url: str, tmp_path: Path) -> None:
    """A script killed by a signal (here its own SIGSEGV) is `crashed`, naming the signal."""
    _, spec = _catalog(tmp_path, "bad.sh", "#!/bin/sh\nkill -SEGV $$\n")
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "crashed")
        assert health.detail == "killed by SIGSEGV"
        assert health.exit_code is None
        await _good_on_time(rig)


async def test_child_holding_stdout_does_not_hang_the_agent(
    nats_url: str, tmp_path: Path
) -> None:
    """Fork-and-exit: the output counts, the child left holding stdout is killed, runs go on."""
    body = ("#!/bin/sh\nsleep 30 &\necho $! >> pids\n"
            "echo '{\"values\": {\"bad_v\": 2}}'\nexit 0\n")
    _, spec = _catalog(tmp_path, "bad.sh", body, timeout=5.0, interval=0.3)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        await rig.recorder.wait_reports("bad", 3)
        await wait_gone(read_pids(tmp_path / "pids"))
        assert rig.recorder.states("bad") == ["ok"]
        # Each run ends ~exit_grace after the exit, far below the 5 s timeout.
        assert rig.recorder.max_gap("bad") < 2.0
        await _good_on_time(rig)
        # A leader is kept unreaped (WNOWAIT) from its exit until its run is closed, so
        # its process-group id cannot be reused while the group is signalled: with a run
        # every 0.3 s a zombie may exist for a moment (this assertion once caught one).
        # What must not happen is a zombie that stays: each one seen is reaped.
        seen = set(zombie_children())
        await eventually(lambda: not seen & set(zombie_children()), 5.0,
                         f"the zombie children {sorted(seen)} reaped")


async def test_slow_start_within_timeout_is_ok(nats_url: str, tmp_path: Path) -> None:
    """A script that takes a while (0.6 s, timeout 2 s) is fine: `ok` and its report."""
    body = "#!/bin/sh\nsleep 0.6\necho '{\"values\": {\"bad_v\": 3}}'\n"
    _, spec = _catalog(tmp_path, "slow.sh", body, timeout=2.0, interval=1.0)
    async with running_agent(nats_url, good_catalog(tmp_path, slow=spec), tmp_path) as rig:
        await rig.recorder.wait_reports("slow", 1)
        report = rig.recorder.reports("slow")[0].event
        assert report.values == {"bad_v": 3}  # type: ignore[union-attr]
        assert rig.recorder.states("slow") == ["ok"]
        await _good_on_time(rig)


async def test_stream_that_dies_is_restarted_with_backoff(nats_url: str, tmp_path: Path) -> None:
    """A stream dying at start is restarted after growing, jittered delays, then reports."""
    body = """#!/bin/sh
echo start >> starts
n=$(wc -l < starts)
if [ "$n" -le 3 ]; then echo "not yet ($n)" >&2; exit 2; fi
while :; do echo '{"values": {"bad_v": 4}}'; sleep 0.1; done
"""
    _, spec = _catalog(tmp_path, "stream.sh", body, mode="stream", backoff_floor=0.1,
                       backoff_cap=1.0)
    async with running_agent(nats_url, good_catalog(tmp_path, stream=spec), tmp_path) as rig:
        await rig.recorder.wait_reports("stream", 3)
        health = rig.recorder.health("stream")
        assert [h.state for h in health] == [
            "crashed", "restarting", "crashed", "restarting", "crashed", "restarting", "ok"]
        assert health[0].exit_code == 2
        assert health[0].detail == "stream ended (exit 2): not yet (1)"
        for i, h in enumerate(health[1:6:2], start=1):
            assert h.detail is not None
            assert f"(failure {i} of at most 1000)" in h.detail
            delay = float(h.detail.split("restart in ")[1].split("s")[0])
            assert 0.1 <= delay <= min(1.0, 0.1 * 2 ** (i - 1))
        await _good_on_time(rig)


@pytest.mark.parametrize("mode", ["stream", "periodic"])
async def test_stderr_written_as_the_script_exits_is_in_the_detail(
        nats_url: str, tmp_path: Path, mode: str) -> None:
    """The cause of a once-flaky detail (`stream ended (exit 2)` without its stderr): the
    exit is seen before the last stderr bytes arrive.  Here they come 50 ms after the exit
    (a child still holds stderr); the detail quotes them all the same.  The agent's
    exit_grace is generous here so a loaded machine cannot make the child miss it: the
    wait ends at stderr's EOF, long before."""
    body = "#!/bin/sh\n(sleep 0.05; echo 'late reason' >&2) >/dev/null &\nexit 2\n"
    _, spec = _catalog(tmp_path, "late.sh", body, mode=mode, backoff_floor=5.0,
                       backoff_cap=5.0)
    async with running_agent(nats_url, good_catalog(tmp_path, late=spec), tmp_path,
                             exit_grace=10.0) as rig:
        health = await rig.recorder.wait_state("late", "crashed" if mode == "stream"
                                               else "failed")
        assert health.detail is not None
        assert health.detail.endswith("exit 2: late reason" if mode == "periodic"
                                      else "(exit 2): late reason"), health.detail


async def test_stream_restart_after_success_resets_backoff(nats_url: str, tmp_path: Path) -> None:
    """A stream that reports and then dies restarts at the floor delay each time (reset)."""
    body = "#!/bin/sh\necho '{\"values\": {\"bad_v\": 5}}'\nexit 1\n"
    _, spec = _catalog(tmp_path, "stream.sh", body, mode="stream", backoff_floor=0.1,
                       backoff_cap=5.0, quarantine_after=2)
    async with running_agent(nats_url, good_catalog(tmp_path, stream=spec), tmp_path) as rig:
        await rig.recorder.wait_reports("stream", 4)
        restarting = [h for h in rig.recorder.health("stream") if h.state == "restarting"]
        assert all("restart in 0.10s (failure 1 " in (h.detail or "") for h in restarting)
        assert "quarantined" not in rig.recorder.states("stream")
        await _good_on_time(rig)


async def test_repeated_failures_quarantine(nats_url: str, tmp_path: Path) -> None:
    """After `quarantine_after` consecutive failures the script is not run again."""
    _, spec = _catalog(tmp_path, "bad.sh", "#!/bin/sh\necho run >> runs\nexit 1\n",
                       quarantine_after=3, interval=0.1)
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "quarantined")
        assert health.detail is not None
        assert health.detail.startswith("3 consecutive failures")
        await _good_on_time(rig, more=6)
        assert (tmp_path / "runs").read_text().count("run") == 3
        assert rig.recorder.states("bad") == ["failed", "quarantined"]


async def test_not_applicable_exit_is_not_rerun(nats_url: str, tmp_path: Path) -> None:
    """Exit 97 is `not_applicable` (exit_code 97) and the script never runs again here."""
    _, spec = _catalog(tmp_path, "gpu.sh", "#!/bin/sh\necho run >> runs\nexit 97\n",
                       interval=0.1)
    async with running_agent(nats_url, good_catalog(tmp_path, gpu=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("gpu", "not_applicable")
        assert health.exit_code == 97
        await _good_on_time(rig, more=6)
        assert (tmp_path / "runs").read_text().count("run") == 1
        assert rig.recorder.states("gpu") == ["not_applicable"]


async def test_missing_command_is_failed(nats_url: str, tmp_path: Path) -> None:
    """A command that does not exist is `failed` with a detail naming the path."""
    spec = fast(["no-such-reporter.sh"])
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "failed")
        assert health.detail is not None
        assert "not found" in health.detail
        assert "no-such-reporter.sh" in health.detail
        await _good_on_time(rig)


async def test_non_executable_command_is_failed(nats_url: str, tmp_path: Path) -> None:
    """A file without the execute bit and without a `#!` line is `failed` ("not
    executable"), with a hint."""
    write_script(tmp_path, "noexec.sh", "echo '{}'\n", executable=False)
    spec = fast(["noexec.sh"])
    async with running_agent(nats_url, good_catalog(tmp_path, bad=spec), tmp_path) as rig:
        health = await rig.recorder.wait_state("bad", "failed")
        assert health.detail is not None
        assert f"command is not executable: {tmp_path / 'noexec.sh'}" in health.detail
        await _good_on_time(rig)


def test_script_without_execute_bit_runs_through_its_shebang(tmp_path: Path) -> None:
    """pip drops the execute bit of packaged scripts: a `#!` line is enough to run one,
    through the interpreter it names (with its one argument), as the kernel would."""
    write_script(tmp_path, "a.py", "#!/usr/bin/env python3\nprint('{}')\n", executable=False)
    write_script(tmp_path, "b.sh", "#!/bin/sh\necho '{}'\n", executable=False)
    write_script(tmp_path, "c.sh", "#!/no/such/shell\necho '{}'\n", executable=False)
    assert resolve_command(["a.py", "-x"], tmp_path, "/usr/bin:/bin") == [
        "/usr/bin/env", "python3", str(tmp_path / "a.py"), "-x"]
    assert resolve_command(["b.sh"], tmp_path, "/usr/bin:/bin") == ["/bin/sh",
                                                                     str(tmp_path / "b.sh")]
    with pytest.raises(CommandError, match="not executable"):
        resolve_command(["c.sh"], tmp_path, "/usr/bin:/bin")


def test_backoff_delays_stay_within_floor_and_cap() -> None:
    """The backoff stays within [floor, min(cap, floor·2ⁿ⁻¹)] for every failure count."""
    spec = ReporterSpec(command=["x"], backoff_floor=0.5, backoff_cap=4.0)
    publisher = ReporterPublisher(MemorySink(), reporter="x", host="h", boot="b")
    runner = ReporterRunner(RunnerConfig(name="x", spec=spec, kinds=()), host="h",
                            publisher=publisher, reporters_dir=Path(), agent_env={})
    for n in range(1, 10):
        delays = [runner.backoff(n) for _ in range(20)]
        assert all(0.5 <= d <= min(4.0, 0.5 * 2 ** (n - 1)) for d in delays)
    assert max(runner.backoff(9) for _ in range(50)) > 2.0  # it does grow
