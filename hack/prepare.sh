#!/usr/bin/env bash
# Builds, side by side, what make test needs beyond the Go toolchain and
# finds each in the cache when its recipe is unchanged: the Debian 12 guest
# image with its Docker Engine (test/nomad's clients run containers), the
# Debian 13 guest image without (make test runs none there; guest/run.sh
# -D builds it when first asked), Nomad (hack/nomad.sh), the Prometheus
# server test/nomad runs (hack/prometheus-server.sh) and the plugin
# images (hack/images.sh, when ARCHIVE_DIR is set). On a fresh
# machine these are most of the cold part of make test, and much of their
# time is spent waiting on the network (debootstrap and apt for each
# chroot, 2 GB of Go modules for Nomad, a Debian base for the images) or
# on one core (dkms's link steps, the Go linker): run one after the other
# they took about 31 minutes on two cores, run together the network waits
# overlap the compiles. Each build keeps its own lock and cache key, so a
# warm run is a few cache lookups. A build that fails fails the whole,
# with its log's tail; each build's time is printed when it built.
#
# Usage: hack/prepare.sh [BUILD...], BUILD one of guest-bookworm,
# guest-trixie, nomad, prometheus, images (all five when none is named).
# make test builds the guest images here and Nomad, Prometheus and the
# plugin images beside its guest tests (hack/test.sh says why).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/zfs-nomad-prepare.XXXXXX")
trap 'rm -rf "$logs"' EXIT

declare -A pids=()
start() { # start NAME COMMAND...
  local name=$1
  shift
  (
    began=$SECONDS
    "$@" >"$logs/$name.out" 2>"$logs/$name.log"
    echo $((SECONDS - began)) >"$logs/$name.took"
  ) &
  pids[$name]=$!
}

builds=("$@")
[ ${#builds[@]} -gt 0 ] || builds=(guest-bookworm guest-trixie nomad prometheus images)
for build in "${builds[@]}"; do
  case "$build" in
    guest-bookworm) start guest-bookworm env ZFS_NOMAD_GUEST=bookworm "$repo/guest/image.sh" -D ;;
    guest-trixie) start guest-trixie env ZFS_NOMAD_GUEST=trixie "$repo/guest/image.sh" ;;
    nomad) start nomad "$here/nomad.sh" ;;
    prometheus) start prometheus "$here/prometheus-server.sh" ;;
    images) [ -z "${ARCHIVE_DIR:-}" ] || start images "$here/images.sh" ;;
    *) echo "prepare: no build named $build (guest-bookworm, guest-trixie, nomad, prometheus, images)" >&2; exit 2 ;;
  esac
done

# Each build is reported as it ends.
failed=0
while [ ${#pids[@]} -gt 0 ]; do
  rc=0
  wait -n -p ended "${pids[@]}" || rc=$?
  for name in "${!pids[@]}"; do
    [ "${pids[$name]}" = "$ended" ] || continue
    unset "pids[$name]"
    if [ "$rc" -eq 0 ]; then
      took=$(cat "$logs/$name.took")
      # A cache hit takes no time worth a line; a build says how long it
      # took, and a guest image's build where (its stamped steps).
      if [ "$took" -ge 5 ]; then
        echo "prepare: $name built in ${took}s" >&2
        grep -E '^\[ *[0-9]+ s\]' "$logs/$name.log" | sed "s/^/prepare: $name /" >&2 || true
      fi
    else
      failed=1
      echo "prepare: $name failed; the end of its log:" >&2
      tail -30 "$logs/$name.log" >&2
    fi
  done
done
exit "$failed"
