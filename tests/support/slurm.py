"""A real Slurm cluster for the bridge tests: munged, slurmctld and one slurmd on loopback.

Debian's `slurm-wlm`/`slurmctld`/`slurmd`/`munge` packages (installed by `.ci/run`); when
they are missing the tests skip with the reason.  Everything lives in a private
directory: a generated munge key and munged socket, a generated `slurm.conf` (a unique
`ClusterName`, free ports, `StateSaveLocation` in the directory, `SlurmUser=root`), the
logs.  All nodes share `NodeAddr=127.0.0.1`, so the one `slurmd` (run as `-N node001`)
answers slurmctld's pings for every node: they come up IDLE and jobs can be tested
(`sbatch --test-only`) against them.  Nothing is left running after `stop()`.

What was found by trying, on Slurm 22.05.8:
- `scontrol update NodeName=… AvailableFeatures=…` sets the active list too (no
  node_features plugin); `ActiveFeatures` alone beyond the available ones is refused.
- `scontrol reconfigure` and a slurmctld restart put the `slurm.conf` features back;
  drain state (and its reason) survives both.
- `State=RESUME` of a node that is not responding exits 1 ("Invalid node state
  specified") yet clears the drain; with the slurmd running it exits 0.
- `scontrol show hostnames` needs a `slurm.conf` (any) but no daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cluster import free_ports

PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch")


def missing_programs() -> list[str]:
    """The Slurm/munge programs this machine lacks (searched in PATH and /usr/sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def _which(program: str) -> str:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which(program, path=path)
    assert found is not None, program
    return found


def require_slurm() -> None:
    """Skip the calling test, with the reason, when Slurm or munge is not installed."""
    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm/munge not installed ({', '.join(missing)} missing; "
                    "`apt-get install slurm-wlm slurmctld slurmd munge`, as .ci/run does)")
    if os.geteuid() != 0:
        pytest.skip("the Slurm fixture runs slurmctld/slurmd with SlurmUser=root")


def wait_for(what: str, check: object, timeout: float = 30.0, poll: float = 0.1) -> None:
    """Retry `check()` (a callable returning truthy when done) until it holds or `timeout`
    passes (a bounded retry, not a synchronising sleep)."""
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def slurm_conf(root: Path, *, nodes: str, cluster: str, ctld_port: int, slurmd_port: int,
               munge_socket: Path, features: str = "admin_static") -> str:
    """A `slurm.conf` for a loopback cluster of `nodes` (a hostlist) in `root`."""
    return "\n".join([
        f"ClusterName={cluster}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none", "MpiDefault=none", "MailProg=/bin/true",
        "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=300",
        f"NodeName={nodes} NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 Features={features} "
        "State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ""])


@dataclass
class SlurmCluster:
    """A running munged + slurmctld (+ one slurmd) with its own `slurm.conf`."""

    root: Path
    nodes: str
    with_slurmd: bool = True
    cluster: str = field(default_factory=lambda: f"crr{uuid.uuid4().hex[:8]}")
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        """The generated `slurm.conf`."""
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs to reach this cluster (`SLURM_CONF`)."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        """Key, munged, `slurm.conf`, slurmctld, slurmd; ready on return."""
        for sub in ("state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        key = self.root / "munge" / "munge.key"
        subprocess.run([_which("mungekey"), "-c", "-k", str(key), "-b", "1024"], check=True,
                       capture_output=True)
        key.chmod(0o600)
        sock = self.root / "munge" / "munge.sock"
        self._spawn("munged", [_which("munged"), "-F", "-f", f"--socket={sock}",
                               f"--key-file={key}", f"--pid-file={self.root / 'munged.pid'}",
                               f"--seed-file={self.root / 'munge' / 'seed'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}"])
        wait_for("munged's socket", sock.exists, timeout=10)
        ctld_port, slurmd_port = free_ports(2)
        self.conf.write_text(slurm_conf(
            self.root, nodes=self.nodes, cluster=self.cluster, ctld_port=ctld_port,
            slurmd_port=slurmd_port, munge_socket=sock))
        self.start_slurmctld()
        if self.with_slurmd:
            self._spawn("slurmd", [_which("slurmd"), "-D", "-N", self.first_node])
            # One slurmd answers the pings of every node (they share 127.0.0.1).
            try:
                wait_for("every node to be idle", self._nodes_up, timeout=60)
            except AssertionError as e:
                raise AssertionError(f"{e}; sinfo: {self.sinfo('-h', '-N', '-o', '%N=%T')!r}; "
                                     f"{self._log_tail('slurmd')}; "
                                     f"{self._log_tail('slurmctld')}") from None

    @property
    def first_node(self) -> str:
        """The node the one slurmd runs as."""
        return self.scontrol("show", "hostnames", self.nodes).split()[0]

    def start_slurmctld(self) -> None:
        """Start slurmctld (recovering its state files, if any); ready on return."""
        self._spawn("slurmctld", [_which("slurmctld"), "-D"])
        wait_for("slurmctld to answer", self._ctld_up, timeout=30)

    def stop_slurmctld(self) -> None:
        """Stop slurmctld (SIGTERM: it saves its state, as `systemctl stop` would)."""
        self._stop("slurmctld")

    def restart_slurmctld(self) -> None:
        """Stop and start slurmctld, as an admin's `systemctl restart slurmctld`."""
        self.stop_slurmctld()
        self.start_slurmctld()

    def _nodes_up(self) -> bool:
        for name in ("slurmd", "slurmctld"):
            proc = self._procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited {proc.returncode}: {self._log_tail(name)}")
        return set(self.sinfo("-h", "-N", "-o", "%T").split()) <= {"idle", "drained"}

    def _log_tail(self, name: str, size: int = 2000) -> str:
        """The end of `name`'s log file and of its captured output."""
        parts = []
        for path in (self.root / "log" / f"{name}.log", self.root / "log" / f"{name}.out"):
            if path.exists():
                parts.append(f"{path.name}: {path.read_text(errors='replace')[-size:]}")
        return " | ".join(parts) or f"{name}: no log"

    def _ctld_up(self) -> bool:
        proc = self._procs["slurmctld"]
        if proc.poll() is not None:
            raise AssertionError(f"slurmctld exited {proc.returncode}: "
                                 f"{self._log_tail('slurmctld')}")
        ran = self._run(_which("scontrol"), "ping")
        return ran.returncode == 0 and "is UP" in ran.stdout

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                              env={**os.environ, **self.env}, check=False)

    def scontrol(self, *args: str) -> str:
        """stdout of `scontrol args…` (asserting it succeeds)."""
        ran = self._run(_which("scontrol"), *args)
        assert ran.returncode == 0, (args, ran.stderr)
        return ran.stdout

    def sinfo(self, *args: str) -> str:
        """stdout of `sinfo args…` (asserting it succeeds)."""
        ran = self._run(_which("sinfo"), *args)
        assert ran.returncode == 0, (args, ran.stderr)
        return ran.stdout

    def sbatch_test_only(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`sbatch --test-only args… --wrap=true`: where the job would start, or why not."""
        return self._run(_which("sbatch"), "--test-only", *args, "--wrap=true")

    def features(self) -> dict[str, tuple[set[str], str, str]]:
        """node → (active features, state, reason) as `sinfo --format` shows them (state
        without the not-responding `*`)."""
        out: dict[str, tuple[set[str], str, str]] = {}
        for line in self.sinfo("-h", "-N", "-o", "%N|%b|%T|%E").splitlines():
            name, feats, state, reason = line.split("|", 3)
            feats_set = set() if feats in ("(null)", "") else set(feats.split(","))
            # A trailing `*` (not responding) comes and goes with slurmctld's pings.
            out[name] = (feats_set, state.rstrip("*"), "" if reason == "none" else reason)
        return out

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self._procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             env={**os.environ, **self.env})
        log.close()

    def _stop(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop slurmd, slurmctld and munged (in that order)."""
        for name in ("slurmd", "slurmctld", "munged"):
            self._stop(name)


@contextmanager
def slurm_cluster(nodes: str = "node[001-020]", *, with_slurmd: bool = True,
                  ) -> Iterator[SlurmCluster]:
    """A started `SlurmCluster` of `nodes` in a private directory, stopped on exit.

    The directory is a short one under /tmp, not pytest's tmp_path: munged's socket path
    must fit a Unix socket address (108 bytes).
    """
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="crr-slurm-"))
    cluster = SlurmCluster(root, nodes, with_slurmd=with_slurmd)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
