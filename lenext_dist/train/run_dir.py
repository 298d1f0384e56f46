"""One training per run_dir at a time, and an earlier run's outputs are never overwritten.

Two trainings writing one run_dir mix their metrics.jsonl lines and checkpoints, and a run started
with checkpoint.resume=false in a folder that holds an earlier run would truncate its
metrics.jsonl, overwrite its step folders and move `latest` back. So before anything is written,
rank 0 (alone: every rank of one training, on any node, shares the folder under rank 0's lock):

- locks `<run_dir>/lock` and `<checkpoint.dir>/lock` (the checkpoint folder too when it lies
  inside run_dir: a checkpoint.dir pointed into another live run's folder is then refused) with
  flock (`lenext_dist.prep.lock.try_lock`, as shard.py locks its --out; the kernel drops it
  when the process dies, so a kill -9 leaves no stale lock): a second training is refused while
  the first runs. The lock file names its holder (pid, host, start time) for that message;
- refuses a symbolic link anywhere inside them (a copied or shared run folder whose `lock`,
  `deepspeed.json`, `zero_to_fp32.py`, step folder or cache file links elsewhere would have
  training truncate, overwrite or fill the link's target); the folders themselves may be links;
- with checkpoint.resume=false, refuses a folder holding an earlier run's outputs (the files
  training writes: metrics.jsonl, config.yaml, ..., `latest`, step_* folders) unless
  checkpoint.start_over=true;
- with checkpoint.start_over=true, moves such a folder aside to `<folder>.old-N` (N = 1, 2, ...;
  nothing is deleted) and starts from step 0 in a fresh one. Megatron's sample-index cache
  (<run_dir>/data_cache) comes back: it is a cache, keyed by its own hash. A checkpoint.init_from
  inside a moved folder is followed to its new place.

Every rank gets rank 0's outcome (an error, or the moved init_from) through one broadcast, so all
ranks raise the same error, or all go on.
"""
from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path
from typing import Optional

from lenext_dist.errors import CheckpointError

LOCK = "lock"
HEAD_SCALES = "head_scales.json"
"""A HeadScale search's result, written after its last checkpoint (train/loop.py _finish)."""
RUN_FILES = ("metrics.jsonl", "config.yaml", "deepspeed.json", "tensorboard", HEAD_SCALES,
             "head_scales.png")
"""What training writes into run_dir (train/loop.py, train/metrics.py)."""
CACHE = "data_cache"


def last_step(cfg) -> int:
    """The step this launch trains to: train.exit_at when set (a segment), else train.steps."""
    return cfg.train.exit_at or cfg.train.steps


def finished(cfg, step: Optional[int]) -> bool:
    """Nothing left for a launch of `cfg` whose latest complete checkpoint is `step` (None: none):
    at or past its last step, and a HeadScale search's scales written (a stop between the last
    save and that write leaves them to a relaunch, which builds the engine to write them). The
    training loop's early exit and the job scripts' `status` (cluster/run_state.py) both ask."""
    if step is None or step < last_step(cfg):
        return False
    hs = cfg.attention.head_scale
    return not (hs.enabled and hs.trainable) or os.path.exists(os.path.join(cfg.run_dir, HEAD_SCALES))


class RunDirLock:
    """The flock descriptors rank 0 holds for the whole training (none on the other ranks)."""

    def __init__(self):
        self.fds: dict[Path, int] = {}

    def take(self, folder: Path) -> None:
        from lenext_dist.prep.lock import try_lock

        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK
        try:
            fd = try_lock(str(path))
            for _ in range(5):  # another launch's refuse_if_busy probe holds it for microseconds
                if fd is not None:
                    break
                time.sleep(0.05)
                fd = try_lock(str(path))
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW: a link planted after _refuse_links looked
                raise CheckpointError(_link_message(path, folder)) from None
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # a filesystem without flock (a Lustre mount without -o flock): go on, unlocked
            print(f"[lenext] warning: cannot lock {path} ({e.strerror or e}); a second training on "
                  f"{folder} would not be refused", flush=True)
            return
        if fd is None:
            self.release()
            raise CheckpointError(_busy_message(folder))
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        old = self.fds.pop(folder, None)  # the same path again: the folder was moved aside
        if old is not None:
            os.close(old)
        self.fds[folder] = fd

    def release(self) -> None:
        for fd in self.fds.values():
            os.close(fd)  # closing the descriptor drops the flock
        self.fds = {}


def _busy_message(folder: Path) -> str:
    path = folder / LOCK
    holder = path.read_text(errors="replace").strip() if path.is_file() else ""
    return (f"{folder} is in use by another training ({holder or f'{path} is locked'}); wait "
            "for it to finish (or stop it), or give this run another run_dir")


def refuse_if_busy(cfg) -> None:
    """Before the process group, on every rank: a run folder whose lock another training holds is
    refused at once, with no rendezvous and no port bound (a second launch on a busy folder
    failed on its master port, taken meanwhile, instead of with this message). Only a probe: the
    lock rank 0 takes after the group is up (claim) stays the authority."""
    import fcntl

    for folder in _locked(cfg):
        try:  # read-only, never created: a fresh folder has no lock file
            fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue  # none, or a link (claim refuses it with its own message)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: probes of one launch agree
        except BlockingIOError:
            raise CheckpointError(_busy_message(folder)) from None
        except OSError:
            pass  # no flock on this filesystem: claim warns
        finally:
            os.close(fd)


def _link_message(path: Path, folder: Path) -> str:
    try:
        to = f" (to {os.readlink(path)})"
    except OSError:
        to = ""
    return (f"{path} is a symbolic link{to}: training writes into {folder} and would write through "
            "it, into the link's target; remove the link or replace it by a copy of what it names "
            "(a run folder must hold no links; for a shared sample-index cache set data.cache_dir)")


def _refuse_links(folders: list[Path]) -> None:
    """No symbolic link inside the run's folders (not followed: os.walk does not enter them)."""
    for folder in folders:
        for top, dirs, files in os.walk(folder):
            for name in sorted(dirs + files):
                path = Path(top) / name
                if path.is_symlink():
                    raise CheckpointError(_link_message(path, folder))


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _folders(cfg) -> list[Path]:
    """run_dir, and checkpoint.dir when it is not inside run_dir."""
    run, ckpt = Path(cfg.run_dir).absolute(), Path(cfg.checkpoint.dir).absolute()
    return [run] if _inside(ckpt, run) else [run, ckpt]


def _locked(cfg) -> list[Path]:
    """What is locked: run_dir and checkpoint.dir, each (the checkpoints are written too)."""
    run, ckpt = Path(cfg.run_dir).absolute(), Path(cfg.checkpoint.dir).absolute()
    return [run] if ckpt == run else [run, ckpt]


def earlier_run(cfg) -> list[tuple[Path, str]]:
    """What an earlier training left in run_dir / checkpoint.dir: (path, what) pairs, [] if none."""
    run, ckpt = Path(cfg.run_dir).absolute(), Path(cfg.checkpoint.dir).absolute()
    found = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        found.append((metrics, f"{metrics} ({len(metrics.read_bytes().splitlines())} lines)"))
    found += [(run / f, str(run / f)) for f in RUN_FILES[1:] if (run / f).exists()]
    steps = sorted(ckpt.glob("step_*")) if ckpt.is_dir() else []
    if steps:
        found.append((steps[-1], f"{len(steps)} step folders in {ckpt} up to {steps[-1].name}"))
    if (ckpt / "latest").exists():
        found.append((ckpt / "latest", str(ckpt / "latest")))
    return found


def _aside(folder: Path) -> Path:
    """Rename `folder` to the first free `<folder>.old-N`."""
    n = 1
    while (dest := folder.with_name(f"{folder.name}.old-{n}")).exists():
        n += 1
    try:
        os.rename(folder, dest)
    except OSError as e:
        raise CheckpointError(f"checkpoint.start_over: cannot move {folder} aside to {dest} "
                              f"({e.strerror or e}); move or remove it yourself") from None
    return dest


def _claim0(cfg, lock: RunDirLock) -> tuple[Optional[str], list[str]]:
    """Rank 0's part: lock, then refuse or move aside. -> (init_from, notes)."""
    folders, locked = _folders(cfg), _locked(cfg)
    _refuse_links(folders)
    for f in locked:
        lock.take(f)
    found = earlier_run(cfg)
    used = [f for f in folders if any(_inside(p, f) for p, _ in found)]
    init_from, notes = cfg.checkpoint.init_from, []
    if used and cfg.checkpoint.start_over:
        for f in used:
            dest = _aside(f)
            for g in locked:  # the new, empty folders: a training that raced us for one is refused
                if _inside(g, f):
                    lock.take(g)
            if f == folders[0] and cfg.data.cache_dir is None and (dest / CACHE).is_dir():
                os.rename(dest / CACHE, f / CACHE)
            if init_from and _inside(Path(init_from).absolute(), f):
                init_from = str(dest / Path(init_from).absolute().relative_to(f))
            notes.append(f"checkpoint.start_over: the earlier run in {f} moved to {dest}")
        if init_from != cfg.checkpoint.init_from:
            notes.append(f"checkpoint.init_from {cfg.checkpoint.init_from} is now {init_from}")
    elif used and not cfg.checkpoint.resume:
        dests = " and ".join(str(f.with_name(f.name + ".old-N")) for f in used)
        raise CheckpointError(
            f"{' and '.join(map(str, used))} hold{'s' if len(used) == 1 else ''} an earlier run ("
            f"{'; '.join(what for _, what in found[:4])}) that checkpoint.resume="
            f"false would overwrite; resume it (checkpoint.resume=true), set "
            f"checkpoint.start_over=true to move it aside to {dests} and start again, or choose "
            "another run_dir")
    return init_from, notes


def claim(cfg, rank: int) -> RunDirLock:
    """Call on every rank, before anything is written: rank 0 locks the run's folders (held by
    the returned object until its release()), refuses or moves aside an earlier run; every rank
    then raises the same CheckpointError, or goes on with cfg.checkpoint.init_from updated."""
    import torch.distributed as dist

    lock = RunDirLock()
    outcome: list = [None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()  # every rank's refuse_if_busy probe is over before rank 0 takes the lock
    if rank == 0:
        try:
            init_from, notes = _claim0(cfg, lock)
            outcome = [{"init_from": init_from, "notes": notes}]
        except CheckpointError as e:
            lock.release()
            outcome = [{"error": str(e)}]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    result = outcome[0]
    if "error" in result:
        raise CheckpointError(result["error"])
    cfg.checkpoint.init_from = result["init_from"]
    if rank == 0:
        for note in result["notes"]:
            print(f"[lenext] {note}", flush=True)
    return lock
