#!/usr/bin/env bash
# Boots the ZFS guest once to run SHARE/run.sh inside it, and exits with
# that script's exit status. The guest sees SHARE at /share and, with -r,
# the host directory REPO read-only at the same path. Each -d adds a fresh
# sparse virtio disk (/dev/vda, /dev/vdb, ...). With -D the guest also has
# the release's Docker Engine (dockerd, containerd, runc; no client).
#
# Usage: run.sh [-t SECONDS] [-d SIZE]... [-m MEM] [-r REPO] [-D] [-q] SHARE
#
# The console is written to SHARE/console.log (and to stdout unless -q).
# Every boot is bounded: the guest must show it booted within 60 s (under
# TCG it hangs at boot now and then, and its kernel once panicked there in
# sched_clock_cpu; a boot that fails either way is retried twice, its
# console kept as SHARE/console-noboot-N.log), and
# the whole run must end within -t seconds (default 600). A guest whose
# kernel reports a soft lockup of two minutes or more has wedged emulated
# CPUs (seen once under TCG, both CPUs spinning for 15 minutes while Nomad
# started): it is stopped and the run starts again from scratch, once, with
# the wedged console kept beside the new one. A guest whose ZFS kernel
# module oopses or panics (an oops with a `[zfs]` or `[spl]` frame, or an
# SPL `PANIC at`) is stopped at once and the run fails: ZFS on
# it never answers again, and the test would otherwise wait out -t. Guest
# runs on one machine take turns (a lock in the cache directory).
set -euo pipefail

timeout_s=600
mem=2G
repo=""
quiet=""
initrd=initrd.gz
image_args=()
disks=()
while getopts "t:d:m:r:Dq" opt; do
  case "$opt" in
    t) timeout_s=$OPTARG ;;
    d) disks+=("$OPTARG") ;;
    m) mem=$OPTARG ;;
    r) repo=$OPTARG ;;
    D) initrd=initrd-docker.gz image_args=(-D) ;;
    q) quiet=1 ;;
    *) echo "usage: run.sh [-t SECONDS] [-d SIZE]... [-m MEM] [-r REPO] [-D] [-q] SHARE" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
share=$(cd "${1:?usage: run.sh [options] SHARE}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
image=$("$here/image.sh" "${image_args[@]}")

# One guest at a time: the machines we run on have two cores, and two
# emulated guests side by side starve each other into boot timeouts.
lock="${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad/guest.lock"
mkdir -p "$(dirname "$lock")"
exec 9>"$lock"
if ! flock -n 9; then
  echo "guest: waiting for another guest run to finish ($lock)" >&2
  flock 9
fi

args=(
  -M pc -accel tcg,thread=multi -cpu "${ZFS_GUEST_CPU:-qemu64}" -smp 2 -m "$mem"
  -no-reboot -nodefaults -nographic -serial stdio
  -bios /usr/share/qemu/qboot.rom
  -kernel "$image/vmlinuz" -initrd "$image/$initrd"
  -virtfs "local,path=$share,mount_tag=share,security_model=none"
)
# tsc=reliable: the kernel would find the emulated TSCs unsynchronised
# and read the clock from the emulated HPET instead, a trap to QEMU on
# every read and no vDSO (a Go time.Now 5.2 us where the TSC takes 0.37;
# the guest's Go processes read the clock all the time). Under TCG every
# vCPU's TSC is QEMU's one monotonic clock, so it is reliable.
cmdline="console=ttyS0 quiet panic=-1 tsc=reliable clocksource=tsc"
# ZFS_GUEST_APPEND adds to the kernel's command line, for experiments.
cmdline+=${ZFS_GUEST_APPEND:+ $ZFS_GUEST_APPEND}
if [ -n "$repo" ]; then
  repo=$(cd "$repo" && pwd)
  args+=(-virtfs "local,path=$repo,mount_tag=repo,security_model=none,readonly=on")
  cmdline+=" zfsguest.repo=$repo"
fi
args+=(-append "$cmdline")

disk_dir=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-guest-disks.XXXXXX")
trap 'rm -rf "$disk_dir"' EXIT

boot() {
  local i=0 size
  for size in "${disks[@]}"; do
    rm -f "$disk_dir/disk$i.raw"
    truncate -s "$size" "$disk_dir/disk$i.raw"
    args_disks+=(-drive "file=$disk_dir/disk$i.raw,if=virtio,format=raw,cache=unsafe")
    i=$((i + 1))
  done
  rm -f "$share/exit-status" "$share/booted"
  : >"$share/console.log"
  if [ -n "$quiet" ]; then
    timeout -k 5 "$timeout_s" qemu-system-x86_64 "${args[@]}" "${args_disks[@]}" </dev/null >>"$share/console.log" 2>&1 &
  else
    timeout -k 5 "$timeout_s" qemu-system-x86_64 "${args[@]}" "${args_disks[@]}" </dev/null 2>&1 | tee -a "$share/console.log" &
  fi
  local pid=$!
  # Boot watchdog: the guest's init touches /share/booted once ZFS is loaded.
  for _ in $(seq 1 120); do
    [ -e "$share/booted" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  # A guest that has not booted has run nothing of the test, so any end
  # before boot (a hang, or a kernel that panicked under TCG) is retried.
  if [ ! -e "$share/booted" ]; then
    cp "$share/console.log" "$share/console-noboot-$((++noboots)).log"
    stop_guest "$pid"
    return 75
  fi
  while kill -0 "$pid" 2>/dev/null; do
    if locked_up "$share/console.log"; then
      stop_guest "$pid"
      return 76
    fi
    if zfs_oopsed "$share/console.log"; then
      stop_guest "$pid"
      return 77
    fi
    sleep 2
  done
  wait "$pid" || true
}

stop_guest() {
  pkill -P "$1" 2>/dev/null || true
  pkill -f "path=$share,mount_tag=share" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# locked_up reports a soft lockup of 120 s or more in a console log.
locked_up() {
  grep -qE 'soft lockup - CPU#[0-9]+ stuck for ([0-9]{4,}|[2-9][0-9]{2}|1[2-9][0-9])s' "$1"
}

# zfs_oopsed reports a kernel oops or an SPL panic in the ZFS or SPL
# module in a console log: the thread that met it holds ZFS's locks for
# good, so every later ZFS call on that guest hangs.
# A soft lockup's "BUG: soft lockup" is not one: locked_up judges those.
zfs_oopsed() {
  grep -qE 'PANIC at [a-z0-9_]+\.c:' "$1" && return 0
  grep -qE 'BUG: (kernel NULL pointer|unable to handle)|Oops: [0-9a-f]+ \[#' "$1" &&
    grep -qE '\[(zfs|spl)\][[:space:]]*$' "$1"
}

noboots=0
for run in 1 2; do
  for attempt in 1 2 3; do
    args_disks=()
    status=0
    boot || status=$?
    [ "$status" -eq 75 ] || break
    echo "guest: no boot (a hang of 60 s, or an early end) at attempt $attempt (console kept at $share/console-noboot-$noboots.log); retrying" >&2
    [ "$attempt" -lt 3 ] || { echo "guest: gave up booting; console: $share/console.log" >&2; exit 125; }
  done
  if [ "$status" -eq 77 ]; then
    cp "$share/console.log" "$share/console-oops.log"
    echo "guest: the guest's ZFS kernel module oopsed or panicked, and ZFS there answers no more: the run is stopped (console kept at $share/console-oops.log; its trace names the defect: see docs/security.md, \"A kernel defect of OpenZFS 2.1\", for one known)" >&2
    exit 123
  fi
  [ "$status" -eq 76 ] || break
  cp "$share/console.log" "$share/console-lockup-$run.log"
  [ "$run" -lt 2 ] || { echo "guest: the guest kernel locked up twice; consoles: $share/console-lockup-*.log" >&2; exit 124; }
  echo "guest: the guest kernel locked up (a soft lockup of 2 minutes or more: its emulated CPUs are wedged; console kept at $share/console-lockup-$run.log); running again from the start" >&2
done

if [ ! -s "$share/exit-status" ]; then
  echo "guest: ended without an exit status (timeout after ${timeout_s}s or crash); console: $share/console.log" >&2
  exit 124
fi
exit "$(cat "$share/exit-status")"
