"""Reliability of the shard step: dead workers, changed inputs, symlinks, the run lock,
names outside --out, a full disk, an --out that is a file, huge documents, units finer
than a file, and a tokenizing path that never imports torch or the megatron.core package."""

import glob
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import sentencepiece as spm

from prep_helpers import REPO, SLIMPAJAMA, TOKENIZER, file_bytes, load_docs, shard
from lenext_dist.prep import tokenizer as tokmod
from lenext_dist.prep.errors import PrepError
from lenext_dist.prep.lock import RunLock
from lenext_dist.atomic import temp_suffix
from lenext_dist.prep.manifest import check_name, parts_dir
from lenext_dist.prep.merge import merge
from lenext_dist.prep.readers import Doc, JsonlReader, discover_inputs, open_reader
from lenext_dist.prep import units

SHARD = os.path.join(REPO, "data_prep", "shard.py")


def _real_texts():
    """Real documents of the sample corpus (Austen, Shakespeare, CPython)."""
    return [r.text for p in SLIMPAJAMA for r in open_reader(p, "slimpajama") if isinstance(r, Doc)]


def _big_jsonl(path, mb: float) -> str:
    """A plain .jsonl of real documents, repeated to about `mb` MB (several byte-range units)."""
    texts = _real_texts()
    lines, size, i = [], 0, 0
    while size < mb * 1e6:
        line = json.dumps({"text": f"[copy {i // len(texts)}] " + texts[i % len(texts)]})
        lines.append(line)
        size += len(line) + 1
        i += 1
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    # 64 KB byte ranges instead of 1 MB: several units from a small file, so tests stay fast
    monkeypatch.setattr(units, "MIN_UNIT", 64 << 10)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return _big_jsonl(tmp_path_factory.mktemp("big") / "big.jsonl", 0.4)


def test_byte_range_units_tile_the_file_for_any_worker_count(tmp_path, big):
    sp = spm.SentencePieceProcessor(model_file=TOKENIZER)
    m = shard([big], tmp_path / "w1", fmt="jsonl")["manifest"]
    assert m["inputs"][0]["units"] == -(-os.path.getsize(big) // units.MIN_UNIT) >= 5
    texts = [json.loads(ln)["text"] for ln in open(big, encoding="utf-8")]
    docs = load_docs(tmp_path / "w1" / "t_train")
    assert [d.tolist() for d in docs] == [ids + [sp.eos_id()] for ids in sp.encode(texts)]
    shard([big], tmp_path / "w2", fmt="jsonl", workers=2)
    assert file_bytes(tmp_path / "w1", "t") == file_bytes(tmp_path / "w2", "t")


def test_bad_line_in_a_later_unit_names_its_line_in_the_file(tmp_path, big):
    lines = open(big, "rb").read().split(b"\n")[:-1]
    k = len(lines) - 3  # in the last unit
    lines[k] = b'{"text": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(PrepError, match=rf"deep.jsonl:line {k + 1}: .*\[too_deep\]"):
        shard([str(path)], tmp_path / "o1", fmt="jsonl")
    m = shard([str(path)], tmp_path / "o2", fmt="jsonl", skip_bad=True)["manifest"]
    assert m["documents"]["skipped"] == {"too_deep": 1}
    assert m["documents"]["read"] == len(lines)
    assert f"deep.jsonl:line {k + 1}" in m["inputs"][0]["problems"][0]


def _children(pid: int) -> list[int]:
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def test_a_killed_worker_is_an_error_naming_its_input_not_a_hang(tmp_path, big):
    killed = []

    parts = parts_dir(str(tmp_path / "o"), "t")

    def killer():
        for _ in range(3000):  # kill a worker once it is inside a unit (its partial exists)
            for pid in _children(os.getpid()):
                if glob.glob(os.path.join(parts, f"*{temp_suffix(pid)}.bin")):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.005)

    t = threading.Thread(target=killer)
    t.start()
    t0 = time.time()
    with pytest.raises(PrepError) as e:
        shard([big], tmp_path / "o", fmt="jsonl", workers=2)
    t.join()
    assert killed and time.time() - t0 < 60
    msg = str(e.value)
    assert f"worker process {killed[0]} killed by SIGKILL while tokenizing {big} (bytes" in msg
    assert "rerun the same command" in msg
    leftovers = [f for f in os.listdir(parts_dir(str(tmp_path / "o"), "t")) if "tmp-" in f]
    assert leftovers == []
    # and the rerun resumes to the same bytes as an undisturbed run
    shard([big], tmp_path / "o", fmt="jsonl", workers=2)
    shard([big], tmp_path / "ref", fmt="jsonl")
    assert file_bytes(tmp_path / "o", "t") == file_bytes(tmp_path / "ref", "t")


STOPPABLE_PREP = """
import runpy, sys
from lenext_dist.prep import units
units.MIN_UNIT = 64 << 10  # as the small_units fixture: many units from a small file
sys.argv = {argv!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def _gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_a_stopped_prep_leaves_no_worker_running_and_no_lock_held(tmp_path, sig):
    """`kill PID` of a `lenext prep` with workers: the parent died at once, its workers went on
    tokenizing as orphans, held the run's lock (the rerun was refused) and blocked for good once
    the results pipe was full. SIGTERM now unwinds (workers stopped, partials removed, exit 143);
    SIGKILL takes the workers with it (parent-death signal). Either way the rerun resumes."""
    src = _big_jsonl(tmp_path / "in" / "big.jsonl", 1.5)
    argv = [SHARD, "--input", src, "--format", "jsonl", "--tokenizer", TOKENIZER, "--out",
            str(tmp_path / "o"), "--name", "t", "--workers", "2", "--no-progress"]
    p = subprocess.Popen([sys.executable, "-c", STOPPABLE_PREP.format(argv=argv, script=SHARD)],
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    parts = parts_dir(str(tmp_path / "o"), "t")
    workers = []
    for _ in range(6000):  # until a worker is inside a unit (its partial exists)
        kids = _children(p.pid)
        if any(glob.glob(os.path.join(parts, f"*{temp_suffix(k)}.bin")) for k in kids):
            workers = kids
            break
        time.sleep(0.005)
    assert len(workers) == 2, p.communicate(timeout=60)[1][-2000:]
    if sig == signal.SIGKILL:  # held where they are: an orphan could not finish its units meanwhile
        for w in workers:
            os.kill(w, signal.SIGSTOP)
    os.kill(p.pid, sig)
    p.wait(timeout=60)  # the parent alone: an orphan would hold stderr open until it finished
    try:
        deadline = time.time() + 10
        while not all(_gone(w) for w in workers) and time.time() < deadline:
            time.sleep(0.02)
        assert all(_gone(w) for w in workers), [w for w in workers if not _gone(w)]
    finally:
        for w in workers:
            if not _gone(w):
                os.kill(w, signal.SIGKILL)
    err = p.stderr.read()
    if sig == signal.SIGTERM:
        assert p.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err[-2000:]
        assert not [f for f in os.listdir(parts) if "tmp-" in f]
    else:
        assert p.returncode == -signal.SIGKILL
    shard([src], tmp_path / "o", fmt="jsonl", workers=2)  # not refused: no lock held
    shard([src], tmp_path / "ref", fmt="jsonl")
    assert file_bytes(tmp_path / "o", "t") == file_bytes(tmp_path / "ref", "t")


@pytest.mark.parametrize("change", ["size", "mtime"])
def test_an_input_changed_after_its_units_finished_is_refused(tmp_path, change):
    src = tmp_path / "in" / "a.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _real_texts()[:20]))
    shard([str(src)], tmp_path / "o", fmt="jsonl", task_index=0, num_tasks=2)
    if change == "size":
        with open(src, "a") as f:
            f.write(json.dumps({"text": "one more"}) + "\n")
    else:  # same bytes count, edited content
        data = src.read_bytes()
        src.write_bytes(data.replace(b"the", b"THE", 1))
        st = os.stat(src)
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    for task in (0, 1):
        with pytest.raises(PrepError, match=r"a.jsonl' changed after the run .* delete"):
            shard([str(src)], tmp_path / "o", fmt="jsonl", task_index=task, num_tasks=2)
    with pytest.raises(PrepError, match="changed after the run"):
        merge(str(tmp_path / "o"), "t", "merge")


def test_symlinks_are_followed_once_and_each_real_file_read_once(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    for p in ("a.jsonl", "sub/b.jsonl"):
        (real / p).write_text(json.dumps({"text": p}) + "\n")
    top = tmp_path / "top"
    top.mkdir()
    os.symlink(real, top / "linked_dir")  # a symlinked folder: followed
    os.symlink(real / "a.jsonl", top / "z_again.jsonl")  # the same file twice: read once
    os.symlink(top, real / "sub" / "cycle")  # a cycle: ends
    got = discover_inputs([str(top)], "jsonl")
    assert sorted(os.path.realpath(p) for p in got) == \
        sorted(os.path.realpath(real / p) for p in ("a.jsonl", "sub/b.jsonl"))
    assert len(got) == 2


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path):
    shard(SLIMPAJAMA[:1], tmp_path, "l")
    with RunLock(parts_dir(str(tmp_path), "l"), "test"):
        with pytest.raises(PrepError, match="another `lenext prep` run is using"):
            shard(SLIMPAJAMA[:1], tmp_path, "l")
        with pytest.raises(PrepError, match="another `lenext prep` run is using"):
            merge(str(tmp_path), "l", "merge")
    # Slurm tasks share the run; the same task twice is refused
    os.makedirs(parts_dir(str(tmp_path), "a"))
    with RunLock(parts_dir(str(tmp_path), "a"), "t0", (0, 2)):
        shard(SLIMPAJAMA[:2], tmp_path, "a", task_index=1, num_tasks=2)
        with pytest.raises(PrepError, match="task 0 of 2"):
            shard(SLIMPAJAMA[:2], tmp_path, "a", task_index=0, num_tasks=2)


def test_a_task_of_another_task_count_refuses_a_unit_another_task_is_tokenizing(tmp_path):
    """Resubmitted with NUM_TASKS 2 while task 1 of 4 still runs: units[1::2] and units[1::4]
    share unit 1, whose start-up cleanup would delete the live temporaries of task 1 of 4
    (which then fails with ENOENT). The unit's lock refuses it instead, naming the cause."""
    shard(SLIMPAJAMA[:4], tmp_path, "c", task_index=0, num_tasks=4)
    parts = parts_dir(str(tmp_path), "c")
    key = json.load(open(os.path.join(parts, "plan.json")))["units"][1]["key"]
    live = os.path.join(parts, f"{key}.train.tmp-otherhost-1.bin")  # task 1 of 4, mid-unit
    open(live, "wb").close()
    from lenext_dist.prep.lock import try_lock

    with RunLock(parts, "shard", (1, 4)):
        fd = try_lock(os.path.join(parts, f"lock.unit-{key}"))
        try:
            with pytest.raises(PrepError, match=r"is tokenizing .* another task count \(--num-tasks"):
                shard(SLIMPAJAMA[:4], tmp_path, "c", task_index=1, num_tasks=2)
            assert os.path.exists(live)
        finally:
            os.close(fd)
    shard(SLIMPAJAMA[:4], tmp_path, "c", task_index=1, num_tasks=2)  # once it has finished


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", ""])
def test_names_that_leave_out_are_refused(tmp_path, name):
    with pytest.raises(PrepError, match="outputs must stay inside --out"):
        shard(SLIMPAJAMA[:1], tmp_path / "o", name)
    with pytest.raises(PrepError, match="outputs must stay inside --out"):
        merge(str(tmp_path / "o"), name, "merge")
    assert not os.path.exists(tmp_path / "o")


def test_a_name_too_long_for_a_file_name_is_refused_naming_the_flag(tmp_path):
    """--name prefixes file names under --out (<name>_valid_answers.tmp-<host>-<pid>.idx, ...): past
    the file system's 255 bytes it is --name, not --out, that is at fault."""
    with pytest.raises(PrepError, match=r"--name n+\.\.\. \(300 characters\): too long"):
        shard(SLIMPAJAMA[:1], tmp_path / "o", "n" * 300)
    with pytest.raises(PrepError, match="too long"):
        merge(str(tmp_path / "o"), "n" * 300, "merge")
    assert not os.path.exists(tmp_path / "o")
    check_name("n" * 200)  # the longest allowed


def _cli(args, **kw):
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, SHARD, *args], capture_output=True, text=True,
                          env=env, **kw)


def _args(out):
    return ["--input", *SLIMPAJAMA[:2], "--format", "slimpajama", "--tokenizer", TOKENIZER,
            "--out", str(out), "--name", "s", "--no-progress"]


def test_out_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        r = _cli(_args(out))
        assert r.returncode == 2 and "is (or is under) a file" in r.stderr
        assert "Traceback" not in r.stderr


def _fsize_limit():  # in the child: files may not grow past 64 KB (EFBIG, not SIGXFSZ)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


def _tmpfs_ok() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("how", ["tmpfs", "rlimit_fsize"])
def test_disk_full_is_a_clean_error_with_no_leftovers(tmp_path, how):
    out = tmp_path / "mnt" / "out"
    out.parent.mkdir()
    if how == "tmpfs":  # a real ENOSPC: a 200 KB tmpfs in a private mount namespace
        if not _tmpfs_ok():
            pytest.skip("no unprivileged mount namespace here (unshare -rm)")
        script = (f"mount -t tmpfs -o size=200k none {out.parent} && "
                  f"{sys.executable} {SHARD} {' '.join(_args(out))}; rc=$?; "
                  f"find {out.parent} -name '*tmp-*'; exit $rc")
        r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=REPO))
        assert "No space left on device" in r.stderr, r.stderr
        assert r.stdout.strip() == ""  # no temporary file left on the full disk
    else:  # EFBIG from RLIMIT_FSIZE, the same error path
        r = _cli(_args(out), preexec_fn=_fsize_limit)
        assert "File too large" in r.stderr, r.stderr
        assert not [p for p in glob.glob(f"{out}/**", recursive=True) if "tmp-" in p]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Free disk space" in r.stderr


def test_chunked_encoding_of_huge_documents_equals_one_encode_call(monkeypatch):
    tok = tokmod.SpmTokenizer(TOKENIZER)
    text = "\n\n".join(_real_texts())[:300_000] + "  double  spaces   and\ttabs \u2581 marks "
    monkeypatch.setattr(tokmod, "CHUNK_CHARS", 3000)
    cuts = tokmod._safe_cuts(text, tok._chunking())
    assert len(cuts) > 50 and all(text[c] == " " and text[c - 1] != " " for c in cuts)
    got = tok.encode_batch([text, "short one"])
    assert got[0].tolist() == tok.sp.encode(text) + [tok.eos_id]
    assert got[1].tolist() == tok.sp.encode("short one") + [tok.eos_id]


@pytest.mark.e2e
def test_huge_one_line_document_keeps_memory_bounded(tmp_path):
    """5 MB in one line through the CLI's code, with 256K-character pieces: the whole
    process peaks far below one unchunked sp.encode of the text (272 MB measured here for
    this model: ~36 bytes per character on top of ~90 MB)."""
    text = " ".join(_real_texts())
    reps = -(-5_000_000 // len(text))
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"text": " ".join([text] * reps)}) + "\n")
    args = ["--input", str(path), "--format", "jsonl", "--tokenizer", TOKENIZER, "--out",
            str(tmp_path / "o"), "--name", "h", "--no-progress"]
    run = ("import sys; import lenext_dist.prep.tokenizer as t; t.CHUNK_CHARS = 1 << 18; "
           "from lenext_dist.prep.cli import shard_main; sys.exit(shard_main(sys.argv[1:]))")
    # A fresh parent whose child runs the CLI: a process forked from pytest would inherit
    # pytest's peak RSS (ru_maxrss survives fork + exec on Linux).
    wrap = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    r = subprocess.run([sys.executable, "-c", wrap, sys.executable, "-c", run, *args],
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    peak_mb = int(r.stdout.split()[-1]) / 1024
    assert peak_mb < 180, peak_mb
    assert len(load_docs(tmp_path / "o" / "h_train")) == 1


def test_the_cli_never_imports_torch_or_the_megatron_package(tmp_path):
    code = ("import sys; from lenext_dist.prep.cli import shard_main; "
            f"rc = shard_main({_args(tmp_path / 'o')!r}); "
            "assert rc == 0; bad = [m for m in sys.modules if m == 'torch' or "
            "m.startswith('megatron')]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr
    # and what it wrote is what megatron's own (fully imported) reader reads
    assert len(load_docs(tmp_path / "o" / "s_train")) > 0


def test_light_writer_writes_the_bytes_of_megatrons_module(tmp_path):
    import megatron.core.datasets.indexed_dataset as full

    from lenext_dist.prep.mcore_io import _light

    light = _light()
    assert light.__file__ == full.__file__
    docs = [np.arange(n, dtype=np.int64) * 7 for n in (5, 1, 300)]
    for mod, tag in ((full, "full"), (light, "light")):
        b = mod.IndexedDatasetBuilder(str(tmp_path / f"{tag}.bin"), dtype=np.uint16)
        for d in docs:
            b.add_document(d, [len(d)])
        b.finalize(str(tmp_path / f"{tag}.idx"))
        m = mod.IndexedDatasetBuilder(str(tmp_path / f"{tag}2.bin"), dtype=np.uint16)
        m.add_index(str(tmp_path / tag))
        m.add_index(str(tmp_path / tag))
        m.finalize(str(tmp_path / f"{tag}2.idx"))
    for ext in (".bin", ".idx", "2.bin", "2.idx"):
        assert (tmp_path / f"full{ext}").read_bytes() == (tmp_path / f"light{ext}").read_bytes()


def test_byte_ranges_own_every_line_exactly_once_at_every_cut(tmp_path):
    """The units of a .jsonl for EVERY unit size (1 byte up to the file), and every single cut
    point: each line is read by exactly the unit its first byte lies in (a cut at a line's first
    byte, at its newline, inside a multi-byte character), so the units read the file's lines once."""
    texts = ["a", "héllo wörld", "", "x" * 40, "日本語", "z", "end of file"]
    path = tmp_path / "small.jsonl"
    raw = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode()
    path.write_bytes(raw)
    size = len(raw)

    def read(**args):
        return [r.text for r in JsonlReader(str(path), start=args.get("start", 0), end=args.get("end"))]

    assert read() == texts
    for step in range(1, size + 1):
        parts = units.split_file(str(path), "jsonl", size, step)
        assert sum(p.get("bytes", 0) for p in parts) == size
        got = [t for p in parts for t in read(**p)] if step < size else read()
        assert got == texts, step
    for cut in range(1, size):
        assert read(start=0, end=cut) + read(start=cut, end=size) == texts, cut


def test_temporaries_name_their_host_as_well_as_their_process():
    """Slurm tasks of one run share --out from other nodes, where the same PIDs run (containers
    with a PID namespace of their own make it likely): a task removing its workers' leftovers by
    PID removed another node's live partials. The suffix names the host too."""
    import hashlib
    import socket

    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]  # a fixed length
    assert temp_suffix(1234) == f".tmp-{host}-1234" and temp_suffix() == temp_suffix(os.getpid())


def test_a_log_gets_a_progress_line_a_minute_not_a_bar(tmp_path, monkeypatch, capsys):
    """stderr not a terminal (a Slurm task's log): plain lines with the share done, documents,
    tokens and the time left (a tqdm bar's carriage returns made one endless line, and
    prep.sbatch turned it off: hours of silence); --no-progress: nothing."""
    from lenext_dist.prep import runner

    monkeypatch.setattr(runner, "LOG_EVERY", 0.0)
    shard(SLIMPAJAMA[:2], tmp_path / "o", workers=1, progress=True)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if " GiB " in x]
    assert lines and "\r" not in err
    assert all(re.fullmatch(r"\[shard t\] [\d.,]+ of [\d.,]+ GiB \([\d.]+%\), [\d,]+ documents, "
                            r"[\d,]+ tokens \([\d,]+/s\), about [\d,]+ min left", x) for x in lines), lines
    shard(SLIMPAJAMA[:2], tmp_path / "q", workers=1, progress=False)
    assert "GiB" not in capsys.readouterr().err
