"""Mutation pass: plant each bug of tests/mutation/mutations.py in turn, run the unit tests that
should catch it, restore the file, and report caught / survived.

    python tests/mutation/run.py                 # every mutation, each against its own test files
    python tests/mutation/run.py --only NAME ... # some of them (names or areas)
    python tests/mutation/run.py --full          # each against the whole unit tier (slow)
    python tests/mutation/run.py --list          # the list, nothing run

A mutation is "caught" when pytest exits non-zero with it planted (a timeout counts as caught, and
is shown as such). Before planting anything, the same test files run on the unchanged code: if
they fail there, nothing can be concluded and the pass stops (--skip-baseline skips that check).
The planted file is restored byte for byte after every run, on Ctrl-C and on SIGTERM too; a copy
of the original waits in tests/mutation/.backup/ while a mutation is planted, and a later run
restores any copy it finds there (after a kill -9) before starting. Exit status: 0 when every
mutation was caught, 1 when any survived, 2 on a bad list entry or a failing baseline.

Not collected by pytest (no test_*.py names here) and not part of `make test`: `make mutation`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKUP = Path(__file__).resolve().parent / ".backup"
PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not distributed and not e2e"]
UNIT = "tests/unit"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import MUTATIONS, M  # noqa: E402


def _term(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def restore_leftovers() -> None:
    """Put back originals a killed run left in BACKUP (named by their path, '/' -> '__')."""
    for f in sorted(BACKUP.glob("*")) if BACKUP.is_dir() else []:
        target = REPO / f.name.replace("__", "/")
        shutil.copyfile(f, target)
        f.unlink()
        print(f"[mutation] restored {target.relative_to(REPO)} from a previous run's backup")


def check(muts: list[M]) -> list[str]:
    """Problems with list entries: unknown file, text absent or not unique, duplicate names."""
    bad, names = [], set()
    for m in muts:
        if m.name in names:
            bad.append(f"{m.name}: duplicate name")
        names.add(m.name)
        f = REPO / m.file
        if not f.is_file():
            bad.append(f"{m.name}: {m.file} does not exist")
            continue
        n = f.read_text().count(m.original)
        if n != 1:
            bad.append(f"{m.name}: original text occurs {n} times in {m.file} (must be exactly once)")
        if m.original == m.replacement:
            bad.append(f"{m.name}: replacement equals the original")
        for t in m.tests:
            if not (REPO / t.split("::")[0]).exists():
                bad.append(f"{m.name}: test {t} does not exist")
    return bad


def pytest(targets: list[str], timeout: float) -> tuple[int | str, float, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, *PYTEST, *targets], cwd=REPO, env=env, timeout=timeout,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return "timeout", time.time() - t0, ""
    lines = p.stdout.strip().splitlines()
    fails = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return p.returncode, time.time() - t0, fails[0] if fails else (lines[-1] if lines else "")


def backup_of(m: M) -> Path:
    return BACKUP / m.file.replace("/", "__")


def plant(m: M, original: bytes) -> None:
    """Write the mutated file (the original first goes to BACKUP, for a kill -9)."""
    BACKUP.mkdir(exist_ok=True)
    backup_of(m).write_bytes(original)
    (REPO / m.file).write_text(original.decode().replace(m.original, m.replacement, 1))


def unplant(m: M, original: bytes) -> None:
    (REPO / m.file).write_bytes(original)
    backup_of(m).unlink(missing_ok=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="mutation names or areas to run")
    ap.add_argument("--full", action="store_true", help="run the whole unit tier for each mutation")
    ap.add_argument("--list", action="store_true", help="print the list and exit")
    ap.add_argument("--skip-baseline", action="store_true", help="do not run the tests unmutated first")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per pytest run (default 600)")
    a = ap.parse_args(argv)

    muts = [m for m in MUTATIONS if not a.only or m.name in a.only or m.area in a.only]
    if a.only and not muts:
        print(f"[mutation] no mutation or area named {a.only}; see --list", file=sys.stderr)
        return 2
    if a.list:
        for m in muts:
            print(f"{m.name:40s} {m.area:20s} {m.file}  <- {', '.join(m.tests)}")
        return 0
    signal.signal(signal.SIGTERM, _term)
    restore_leftovers()
    bad = check(muts)
    if bad:
        print("[mutation] bad list entries:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 2

    t_start = time.time()
    if not a.skip_baseline:
        targets = [UNIT] if a.full else sorted({t for m in muts for t in m.tests})
        rc, secs, tail = pytest(targets, a.timeout)
        print(f"[mutation] baseline (unmutated) {' '.join(targets)}: exit {rc} in {secs:.0f} s")
        if rc != 0:
            print(f"[mutation] the tests fail without any mutation ({tail}); fix that first",
                  file=sys.stderr)
            return 2

    rows = []
    try:
        for i, m in enumerate(muts, 1):
            original = (REPO / m.file).read_bytes()
            try:
                plant(m, original)
                rc, secs, tail = pytest([UNIT] if a.full else list(m.tests), a.timeout)
            finally:
                unplant(m, original)
            status = "caught" if rc != 0 else "SURVIVED"
            if rc == "timeout":
                status = "caught (timeout)"
            rows.append((m, status, secs, tail))
            print(f"[mutation] {i}/{len(muts)} {m.name}: {status} in {secs:.0f} s"
                  + (f"  ({tail})" if rc != 0 and tail else ""), flush=True)
    except KeyboardInterrupt:
        print("\n[mutation] interrupted: the planted file was restored", file=sys.stderr)
        return 130

    survived = [m for m, s, _, _ in rows if s == "SURVIVED"]
    print("\n| mutation | area | file | result | seconds |\n|---|---|---|---|---|")
    for m, s, secs, _ in rows:
        print(f"| {m.name} | {m.area} | {m.file} | {s} | {secs:.0f} |")
    areas: dict[str, list[int]] = {}
    for m, s, _, _ in rows:
        areas.setdefault(m.area, [0, 0])[s == "SURVIVED"] += 1
    print("\n| area | caught | survived |\n|---|---|---|")
    for area, (c, sv) in areas.items():
        print(f"| {area} | {c} | {sv} |")
    print(f"\n[mutation] {len(rows) - len(survived)}/{len(rows)} caught "
          f"({100 * (len(rows) - len(survived)) / max(1, len(rows)):.0f}%) in {time.time() - t_start:.0f} s"
          + (f"; survived: {', '.join(m.name for m in survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
