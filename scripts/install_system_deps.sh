#!/usr/bin/env bash
# System (Debian/Ubuntu) packages the launch paths and their tests need:
#   mpi    openmpi-bin + libopenmpi-dev (mpirun; mpi4py builds against it)
#   slurm  slurm-wlm + munge + libpmix2 (a real one-node cluster for the tests; srun --mpi=pmix)
#   tools  g++ (DeepSpeed JIT-builds its CPU comm op), numactl (--bind_cores_to_rank)
#   lint   shellcheck (tests/unit/test_launch_scripts.py lints the job scripts)
#
#   scripts/install_system_deps.sh            # everything
#   scripts/install_system_deps.sh mpi slurm  # only these groups
#   scripts/install_system_deps.sh --check    # print what is missing, install nothing (exit 1 if any)
#
# Idempotent and fast when everything is present (no apt call at all). Never fails hard when it
# cannot install (not root, no apt, no network): it prints what is missing and exits 0, so
# `make test` goes on and the tests that need a missing piece skip with a reason.
set -uo pipefail

declare -A GROUP=(
    [mpi]="openmpi-bin libopenmpi-dev"
    [slurm]="slurm-wlm munge libpmix2"
    [tools]="g++ numactl"
    [lint]="shellcheck"
)
check_only=0
groups=()
for a in "$@"; do
    case "$a" in
        --check) check_only=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        mpi|slurm|tools|lint) groups+=("$a") ;;
        *) echo "install_system_deps: unknown argument '$a' (groups: mpi slurm tools lint; --check)" >&2; exit 2 ;;
    esac
done
[ "${#groups[@]}" -gt 0 ] || groups=(mpi slurm tools lint)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for g in "${groups[@]}"; do
    for p in ${GROUP[$g]}; do
        installed "$p" || missing+=("$p")
    done
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi
echo "install_system_deps: missing: ${missing[*]}"
if [ "$check_only" -eq 1 ]; then
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: no apt-get here; install the equivalent of: ${missing[*]}" >&2
    exit 0
fi
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    # a user's `make test` installs nothing system-wide (slurm, munge and their daemons) unasked
    if [ "${SYSTEM_DEPS_SUDO:-0}" = 1 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        echo "install_system_deps: not root; the tests that need these skip. To install them, as root run:" >&2
        echo "    apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
        echo "  (or SYSTEM_DEPS_SUDO=1 make test, with passwordless sudo)" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when they are missing or older than a day.
lists=/var/lib/apt/lists
if [ -z "$(find "$lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n 1)" ]; then
    "${SUDO[@]}" apt-get update -q >/dev/null 2>&1 || echo "install_system_deps: apt-get update failed" >&2
fi
# Daemons must not start at install time (there is no init here; the tests start their own).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then  # under sudo too: a systemd host would start munged and slurmd
    # shellcheck disable=SC2016
    "${SUDO[@]}" sh -c 'printf "#!/bin/sh\nexit 101\n" > "$1" && chmod +x "$1"' sh "$policy" && made_policy=1
fi
log=$(mktemp "${TMPDIR:-/tmp}/install_system_deps.XXXXXX")
"${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1
rc=$?
[ "$made_policy" -eq 1 ] && "${SUDO[@]}" rm -f "$policy"
if [ "$rc" -ne 0 ]; then
    echo "install_system_deps: apt-get install failed (see $log):" >&2
    tail -n 5 "$log" >&2
    exit 0
fi
echo "install_system_deps: installed ${missing[*]}"
