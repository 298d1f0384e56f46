"""Two "nodes" on loopback, started the way launch/slurm/pretrain.sbatch starts them in node mode
(`python -m lenext_dist.cluster node`, node rank from SLURM_NODEID, one launcher per node): the loss
curve equals the single-launcher run's, bit for bit, with either launcher."""
import os
import signal
import sys

import pytest

from helpers import LAUNCHER, REPO, free_port, losses, pretrain_cmd, run, write_config
from launch_helpers import start_with_env

pytestmark = pytest.mark.distributed

TRAIN = {"steps": 6, "eval_interval": 0}


@pytest.fixture(scope="module")
def single_launcher(sample_shards, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_launcher")
    cfg = write_config(tmp, sample_shards, "one", train=TRAIN, checkpoint={"interval": 0})
    run(pretrain_cmd(cfg, LAUNCHER, 2, free_port()))
    return losses(tmp / "one")


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_node_launchers_match_one(launcher, single_launcher, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "two", train=TRAIN, checkpoint={"interval": 0})
    port = str(free_port())
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "lenext_dist.cluster", "node", "--launcher", launcher,
               "--nproc-per-node", "1", "--", str(REPO / "launch" / "pretrain.py"), "--config", str(cfg)]
        # What srun gives each node's task; MASTER_ADDR/PORT as the sbatch script exports them. Both
        # "nodes" are this machine under two loopback names (a loopback MASTER_ADDR over hosts that
        # are not is refused: rendezvous.master_addr).
        procs.append(start_with_env(cmd, tmp_path / f"node{node}.log", SLURM_JOB_NODELIST="localhost,127.0.0.1",
                                    SLURM_NODEID=str(node), SLURM_NNODES="2", SLURM_JOB_ID="4242",
                                    MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    logs = [(tmp_path / f"node{n}.log").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "node 1: " in logs[1] and "--node_rank" in logs[1]
    assert "world 2, ZeRO-2" in logs[0]
    assert losses(tmp_path / "two") == single_launcher  # float equality: bitwise identical curve
