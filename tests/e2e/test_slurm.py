"""launch/slurm/pretrain.sbatch on a real one-node Slurm cluster (2 tasks on this machine).

1. one task per rank (`srun` + SLURM_PROCID mapping): the job trains to the end;
2. one launcher per node (torchrun) with SIGUSR1 to the batch script, as `--signal=B:USR1@T` sends
   it before the time limit: the ranks checkpoint and exit 0, the script requeues the job, the next
   run resumes from `latest`, and the loss curve equals the uninterrupted run's bit for bit.
"""
import os
import re
import sys
import time

import pytest

from helpers import REPO, losses, wait_for, write_config
from launch_helpers import LocalSlurm, ensure_pip, ensure_system_packages

pytestmark = pytest.mark.e2e

SCRIPT = REPO / "launch" / "slurm" / "pretrain.sbatch"
STEPS = 150  # long enough (a few seconds of steps) to signal the job mid-run
TRAIN = {"steps": STEPS, "eval_interval": 0}
# 2 tasks on this 2-CPU node; no GPUs here, so drop the script's --gpus-per-node.
OPTIONS = ("--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster (slurmd, munged) needs root")
    reason = ensure_system_packages("slurm", "mpi", binaries=("slurmctld", "slurmd", "munged", "sbatch"))
    if reason:
        pytest.skip(reason)
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reference(slurm, sample_shards, tmp_path_factory):
    """An uninterrupted sbatch run in the default mode (one srun task per rank)."""
    tmp = tmp_path_factory.mktemp("slurm_ref")
    cfg = write_config(tmp, sample_shards, "ref", train=TRAIN, checkpoint={"interval": 0})
    out = tmp / "job.out"
    jid = slurm.sbatch(SCRIPT, options=OPTIONS + (f"--output={out}",), CONFIG=str(cfg))
    info = slurm.wait_done(jid, timeout=300)
    log = out.read_text()
    return {"info": info, "log": log, "losses": losses(tmp / "ref"), "dir": tmp / "ref"}


def test_sbatch_trains_with_two_tasks(reference):
    log = reference["log"]
    assert reference["info"]["JobState"] == "COMPLETED", log[-4000:]
    assert "tasks mode, 1 node(s) x 2 rank(s)" in log
    assert "world 2, ZeRO-2" in log
    assert f"finished: step {STEPS} of {STEPS}" in log
    assert sorted(reference["losses"]) == list(range(1, STEPS + 1))
    assert (reference["dir"] / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS:07d}"


def test_usr1_checkpoints_requeues_and_resumes_bitwise(slurm, reference, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "pre", train=TRAIN, checkpoint={"interval": 0})
    out = tmp_path / "job.out"
    jid = slurm.sbatch(SCRIPT, options=OPTIONS + (f"--output={out}",), CONFIG=str(cfg),
                       LAUNCH_MODE="node", LAUNCHER="torchrun")
    metrics = tmp_path / "pre" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3,
                    timeout=240, every=0.05), (out.read_text() if out.exists() else "") + slurm.logs()
    # What `#SBATCH --signal=B:USR1@600` does ahead of the time limit, now.
    slurm.cmd(["scancel", "--batch", "--signal=USR1", str(jid)])
    info = slurm.wait_job(jid, lambda i: i.get("Restarts") == "1" and i.get("JobState") == "PENDING",
                          timeout=180)
    log = out.read_text()
    assert "SIGUSR1 received: saving a checkpoint" in log, log[-4000:]
    stopped = int(log.split("stopped at step ")[1].split(" ")[0].rstrip(";"))
    assert 3 <= stopped < STEPS
    assert f"requeueing job {jid}" in log
    assert (tmp_path / "pre" / "checkpoints" / "latest").read_text().strip() == f"step_{stopped:07d}"
    # A requeued job waits out a begin-time delay (about 2 minutes), which also lets slurmd forget
    # the credential it revoked at the requeue (to the second). Shorten it: wait until the node is
    # idle again and a new second has begun, then start the job now.
    assert info.get("Reason") in ("BeginTime", "None", "Priority"), info
    assert wait_for(slurm.node_idle, timeout=60, every=0.2), slurm.logs()
    time.sleep(2)
    slurm.cmd(["scontrol", "update", f"JobId={jid}", "StartTime=now"])
    info = slurm.wait_done(jid, timeout=300)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-4000:]
    assert f"(restart 1) on {slurm.host}: stopped at step {stopped} of {STEPS}" in log
    assert f"resumed from {tmp_path / 'pre' / 'checkpoints'}/step_{stopped:07d}" in log
    assert f"finished: step {STEPS} of {STEPS}" in log
    assert losses(tmp_path / "pre") == reference["losses"]  # float equality: bitwise identical curve


@pytest.mark.parametrize("cancel", [("--batch", "--signal=TERM"), ()], ids=["term-to-script", "scancel"])
def test_sigterm_checkpoints_and_does_not_requeue(slurm, sample_shards, tmp_path, cancel):
    """A stop for good with a checkpoint. TERM to the script alone (`scancel --batch
    --signal=TERM`): it passed TERM on to srun, which answers SIGTERM by SIGKILL to every task
    ("srun: forcing job termination"): exit 137, no checkpoint; it now passes USR1 on. A plain
    scancel (TERM to every process of the job): the ranks save before slurmstepd's KillWait."""
    cfg = write_config(tmp_path, sample_shards, "term", train={"steps": 400, "eval_interval": 0},
                       checkpoint={"interval": 0})
    out = tmp_path / "job.out"
    jid = slurm.sbatch(SCRIPT, options=OPTIONS + (f"--output={out}",), CONFIG=str(cfg))
    metrics = tmp_path / "term" / "metrics.jsonl"
    assert wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3,
                    timeout=240, every=0.05), (out.read_text() if out.exists() else "") + slurm.logs()
    slurm.cmd(["scancel", *cancel, str(jid)])
    info = slurm.wait_done(jid, timeout=180)
    log = out.read_text()
    assert info["JobState"] == ("COMPLETED" if cancel else "CANCELLED"), log[-4000:]
    assert info.get("Restarts") == "0" and "requeueing job" not in log
    saved = re.search(r"SIG(TERM|USR1) received: saving a checkpoint at step (\d+)", log)
    assert saved, log[-4000:]
    stopped = int(saved.group(2))
    assert 3 <= stopped < 400
    assert (tmp_path / "term" / "checkpoints" / "latest").read_text().strip() == f"step_{stopped:07d}"
    if cancel:
        assert f"stopped by SIGTERM at step {stopped} of 400 (cancel or preemption): not requeueing" in log


def test_srun_pmix_with_mpi_discovery(slurm, sample_shards, tmp_path):
    """SRUN_MPI=pmix: srun --mpi=pmix starts the ranks and DeepSpeed finds them through mpi4py."""
    reason = ensure_pip("mpi4py", "mpi4py")
    if reason:
        pytest.skip(reason)
    cfg = write_config(tmp_path, sample_shards, "pmix", train={"steps": 4, "eval_interval": 0},
                       checkpoint={"interval": 0})
    out = tmp_path / "job.out"
    jid = slurm.sbatch(SCRIPT, options=OPTIONS + (f"--output={out}",), CONFIG=str(cfg), SRUN_MPI="pmix")
    info = slurm.wait_done(jid, timeout=300)
    log = out.read_text()
    assert info["JobState"] == "COMPLETED", log[-4000:]
    assert "--mpi=pmix" in log and "world 2, ZeRO-2" in log and "finished: step 4 of 4" in log


def test_prep_array_task_resubmitted_alone_takes_its_own_slice(slurm, tmp_path):
    """launch/slurm/prep.sbatch: each task of an array of 2 resubmitted alone with NUM_TASKS=2
    (as the script says to resubmit a failed task) shards its own slice, task 2/2 and 1/2 (alone
    it ran as task 1 of 1 and took every unit); then MODE=merge writes the shards and manifest.
    The log has progress lines, not a bar (prep.sbatch passed --no-progress: silent for hours)."""
    prep = REPO / "launch" / "slurm" / "prep.sbatch"
    env = dict(INPUT_GLOB=str(REPO / "data/sample/slimpajama/chunk*/*.jsonl.zst"), FORMAT="slimpajama",
               TOKENIZER=str(REPO / "data/sample/tokenizer.model"), OUT=str(tmp_path / "shards"), NAME="s",
               PYTHON=sys.executable, REPO=str(REPO), NUM_TASKS="2")
    opts = ("--cpus-per-task=1", "--mem=1")  # the local node announces no memory (RealMemory 1 MB)
    for index in (1, 0):
        out = tmp_path / f"task{index}.log"
        jid = slurm.sbatch(prep, options=opts + (f"--array={index}", f"--output={out}"), **env)
        info = slurm.wait_done(jid, timeout=300)
        log = out.read_text()
        assert info["JobState"] == "COMPLETED", log[-3000:]
        assert f"[shard s] task {index + 1}/2:" in log and "\r" not in log, log[-3000:]
    assert not (tmp_path / "shards" / "s_train.bin").exists()  # two tasks: the merge job merges
    out = tmp_path / "merge.log"
    jid = slurm.sbatch(prep, options=opts + (f"--output={out}",), **{**env, "MODE": "merge"})
    assert slurm.wait_done(jid, timeout=300)["JobState"] == "COMPLETED", out.read_text()[-3000:]
    assert (tmp_path / "shards" / "s_train.bin").stat().st_size > 0
    assert (tmp_path / "shards" / "s.manifest.json").is_file()
