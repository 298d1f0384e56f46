"""Helpers for the launch tests: system packages, and a real one-node Slurm cluster in a temp dir.

The cluster: munged + slurmctld + slurmd (Debian slurm-wlm), all with files under one fresh
directory (a new ClusterName each time: slurmctld refuses a state dir written under another
one), ports picked free, proctrack/linuxproc + task/none + select/cons_tres. It starts in about a
second. Only the daemons started here are stopped at teardown (by their pids), after every job of
this cluster is cancelled.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Optional

from helpers import REPO, env, free_port

INSTALL = REPO / "scripts" / "install_system_deps.sh"


def ensure_system_packages(*groups: str, binaries: tuple[str, ...]) -> Optional[str]:
    """Install the groups (scripts/install_system_deps.sh) if a binary is missing; return None when
    every binary is there afterwards, else the reason to skip."""
    if all(shutil.which(b) for b in binaries):
        return None
    p = subprocess.run(["bash", str(INSTALL), *groups], capture_output=True, text=True, timeout=900)
    missing = [b for b in binaries if not shutil.which(b)]
    if missing:
        return (f"{', '.join(missing)} not installed and scripts/install_system_deps.sh could not install "
                f"them (root + apt needed): {(p.stdout + p.stderr).strip()[-500:]}")
    return None


def ensure_pip(module: str, spec: str) -> Optional[str]:
    """Import `module`, pip-installing `spec` into this venv once if needed; a skip reason or None."""
    import importlib
    import sys

    try:
        importlib.import_module(module)
        return None
    except ImportError:
        pass
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], capture_output=True, text=True,
                       timeout=900)
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
        return None
    except ImportError:
        return f"{spec} is not installed and pip could not install it: {p.stderr.strip()[-500:]}"


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class LocalSlurm:
    DAEMONS = ("munged", "slurmctld", "slurmd")

    def __init__(self, root: Path, cpus: int = 2):
        self.root = Path(root)
        self.cpus = cpus
        self.procs: dict[str, subprocess.Popen] = {}
        self.host = _short_hostname()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> "LocalSlurm":
        r = self.root
        os.chmod(r, 0o755)  # munged wants the socket's directories traversable
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700 if d == "munge" else 0o755, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self.socket = r / "munge" / "munge.sock"
        self.conf = r / "slurm.conf"
        self.conf.write_text(self._slurm_conf())
        self.procs["munged"] = self._spawn(
            ["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
             f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
             f"--seed-file={r / 'munge' / 'munged.seed'}"], "munged")
        self._wait(lambda: self.socket.exists(), timeout, "munged")
        self.procs["slurmctld"] = self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self.procs["slurmd"] = self._spawn(["slurmd", "-D", "-f", str(self.conf)], "slurmd")
        self._wait(self.node_idle, timeout, "slurmd to register as idle")
        return self

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--signal=KILL", "--partition=debug"], env=self.env(),
                           capture_output=True, timeout=30)
            subprocess.run(["scancel", "--partition=debug"], env=self.env(), capture_output=True, timeout=30)
            end = time.time() + 30
            while time.time() < end and self.squeue():
                time.sleep(0.5)
        for name in reversed(self.DAEMONS):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- use ---------------------------------------------------------------------------------
    def env(self, **extra: str) -> dict:
        e = env()
        e["SLURM_CONF"] = str(self.conf)
        e.update(extra)
        return e

    def cmd(self, args: list[str], timeout: float = 60, check: bool = True, **extra: str) -> str:
        p = subprocess.run(args, env=self.env(**extra), capture_output=True, text=True, timeout=timeout,
                           cwd=REPO)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {p.returncode}: {p.stdout}{p.stderr}\n"
                                 f"{self.logs()}")
        return p.stdout.strip()

    def sbatch(self, script: Path, *args: str, options: tuple[str, ...] = (), **extra: str) -> int:
        out = self.cmd(["sbatch", "--parsable", *options, str(script), *args], **extra)
        return int(out.split(";")[0])

    def squeue(self) -> list[str]:
        return self.cmd(["squeue", "-h", "-o", "%i %T"], check=False).splitlines()

    def job(self, jid: int) -> dict[str, str]:
        """`scontrol show job` as a dict (empty once the job is gone)."""
        out = self.cmd(["scontrol", "-o", "show", "job", str(jid)], check=False)
        fields = {}
        for tok in out.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields[k] = v
        return fields

    def wait_job(self, jid: int, pred, timeout: float = 300, every: float = 0.5) -> dict:
        end = time.time() + timeout
        while time.time() < end:
            info = self.job(jid)
            if pred(info):
                return info
            time.sleep(every)
        raise AssertionError(f"job {jid} did not reach the expected state in {timeout}s: {self.job(jid)}\n"
                             f"{self.logs()}")

    def wait_done(self, jid: int, timeout: float = 300) -> dict:
        return self.wait_job(jid, lambda i: i.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED",
                                                                   "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
                             timeout)

    def logs(self, n: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*.log")):
            lines = f.read_text(errors="replace").splitlines()[-n:]
            out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # -- internals ---------------------------------------------------------------------------
    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.stdout", "w")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")})

    def _wait(self, pred, timeout: float, what: str) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if pred():
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"local Slurm: waiting for {what} failed\n{self.logs()}")

    def node_idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], env={**os.environ, "SLURM_CONF": str(self.conf)},
                           capture_output=True, text=True, timeout=30)
        return p.returncode == 0 and p.stdout.strip() == "idle"

    def _slurm_conf(self) -> str:
        r = self.root
        return f"""\
ClusterName=lt{uuid.uuid4().hex[:8]}
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
InactiveLimit=0
MinJobAge=600
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def start_with_env(cmd: list[str], log: Path, **extra: str) -> subprocess.Popen:
    """helpers.start with extra environment variables (own process group, output to `log`)."""
    return subprocess.Popen(cmd, cwd=REPO, env={**env(), **extra}, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
