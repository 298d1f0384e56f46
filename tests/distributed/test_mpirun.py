"""`mpirun -np 2 python launch/pretrain.py`: ranks found through MPI (DeepSpeed's mpi4py discovery),
ZeRO-2 on gloo, the run trains to the end."""
import math
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO, free_port, losses, run, write_config
from launch_helpers import ensure_pip, ensure_system_packages

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def mpirun():
    reason = ensure_system_packages("mpi", binaries=("mpirun",)) or ensure_pip("mpi4py", "mpi4py")
    if reason:
        pytest.skip(reason)
    return shutil.which("mpirun")


def test_mpirun_two_ranks_zero2(mpirun, sample_shards, tmp_path):
    cfg = write_config(tmp_path, sample_shards, "mpi", train={"steps": 6, "eval_interval": 0},
                       parallel={"zero_stage": 2}, checkpoint={"interval": 3})
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "none"]
    for var in ("DS_ACCELERATOR", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "MASTER_ADDR", "PATH"):
        cmd += ["-x", var]
    cmd += ["-x", f"MASTER_PORT={free_port()}", sys.executable, str(REPO / "launch" / "pretrain.py"),
            "--config", str(cfg)]
    p = run(cmd, timeout=300)
    assert "world 2, ZeRO-2" in p.stdout, p.stdout[-3000:]
    assert "done at step 6" in p.stdout
    got = losses(tmp_path / "mpi")
    assert sorted(got) == list(range(1, 7)) and all(math.isfinite(v) for v in got.values())
    assert got[6] < got[1]
    ckpt = Path(tmp_path / "mpi" / "checkpoints")
    assert (ckpt / "latest").read_text().strip() == "step_0000006"
    # both ranks wrote their ZeRO-2 optimizer partition
    assert len(list((ckpt / "step_0000006").glob("*optim_states.pt"))) == 2
