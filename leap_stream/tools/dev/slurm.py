"""A real single-host Slurm (Debian's slurmctld, slurmd and munge) in one folder, for the tests.

Everything lives under the folder: the munge key and socket, slurm.conf with one partition per
hardware type (all on one node), the state and spool folders, the logs, and the leap-stream
plugins copied from deploy/slurm beside slurm.conf, where slurmctld and the clients load them.
Ports are free ones, so it runs beside any other Slurm. Clients find it through ``SLURM_CONF``
(`LocalSlurm.env`). The daemons run as the current user (root in CI: munged needs --force).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from leap_stream.tools.dev.kafka import tail_file
from leap_stream.tools.dev.state import free_port, read_pid, stop_pid

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
PACKAGES = "slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins"
PLUGINS = ("leap_stream.lua", "job_submit.lua", "cli_filter.lua")
NODE = "leapnode"


class SlurmUnavailable(RuntimeError):
    """A binary is missing: the message says which packages to install."""


def find_binary(name: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None
    )
    if found is None:
        raise SlurmUnavailable(
            f"{name} is not installed: `sudo apt-get install -y {PACKAGES}` (or .ci/run)"
        )
    return found


def slurm_conf(folder: Path, partitions: Sequence[str], ctld_port: int, slurmd_port: int) -> str:
    user = os.environ.get("USER") or "root"
    lines = [
        "ClusterName=leaptest",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'munge' / 'munge.socket'}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobSubmitPlugins=lua",
        "CliFilterPlugins=cli_filter/lua",
        f"NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000"
        " State=UNKNOWN",
    ]
    for i, p in enumerate(partitions):
        default = " Default=YES" if i == 0 else ""
        lines.append(f"PartitionName={p} Nodes={NODE}{default} MaxTime=10 State=UP")
    return "\n".join(lines) + "\n"


class LocalSlurm:
    """munged + slurmctld + slurmd under ``folder``, with the plugins of ``plugins_dir``."""

    def __init__(self, folder: Path, plugins_dir: Path, partitions: Sequence[str]) -> None:
        self.folder = folder
        self.plugins_dir = plugins_dir
        self.partitions = list(partitions)
        self.conf = folder / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def etc(self) -> Path:
        return self.conf.parent

    def start(self, timeout: float = 60.0) -> None:
        for name in BINARIES:
            find_binary(name)
        for sub in ("etc", "munge", "state", "spool", "log"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        munge = self.folder / "munge"
        munge.chmod(0o700)
        key = munge / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        self.conf.write_text(slurm_conf(self.folder, self.partitions, free_port(), free_port()))
        for name in PLUGINS:
            shutil.copy(self.plugins_dir / name, self.etc / name)
        self._run(
            find_binary("munged"),
            "--force",
            f"--socket={munge / 'munge.socket'}",
            f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munge.seed'}",
        )
        self._run(find_binary("slurmctld"), "-i")
        self._run(find_binary("slurmd"), "-N", NODE)
        self.wait_idle(timeout)

    def _run(self, *cmd: str) -> None:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {proc.stderr.strip()}")

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.scontrol("show", "node", NODE, check=False)
            if re.search(r"State=IDLE", out):
                return
            time.sleep(0.5)
        raise RuntimeError(f"slurm did not come up in {timeout:.0f} s:\n{self.log_tail()}")

    def scontrol(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [find_binary("scontrol"), *args], env=self.env, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, *args: str, wrap: str = "true") -> tuple[int, str]:
        """Submit ``--wrap`` of a command (default ``true``) with ``args``; the job id and what
        sbatch printed on stderr."""
        proc = subprocess.run(
            [find_binary("sbatch"), "--parsable", "--wrap", wrap,
             f"--output={self.folder / 'spool' / 'job-%j.out'}", *args],
            env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)}: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0]), proc.stderr

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (values up to the next space)."""
        out = self.scontrol("show", "job", "-o", str(job_id))
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def log_tail(self, n: int = 30) -> str:
        return tail_file(self.folder / "log" / "slurmctld.log", n)

    def stop(self) -> None:
        """slurmd, slurmctld, then munged, each by its pid file (the daemons detach)."""
        for pid_file, name in (
            ("slurmd.pid", "slurmd"),
            ("slurmctld.pid", "slurmctld"),
            ("munge/munged.pid", "munged"),
        ):
            pid = read_pid(self.folder / pid_file)
            if pid is not None:
                stop_pid(pid, marker=name)


__all__ = ["LocalSlurm", "SlurmUnavailable", "find_binary", "slurm_conf"]
