#!/usr/bin/env bash
# make test after the guest images are built: two lanes side by side.
#
# The guest lane, in the foreground: the packages whose tests boot a ZFS
# guest (their tests call guesttest.Main or guesttest.MainPhases), one
# guest at a time, then the Debian 13 conformance (the shim build of
# libzfs, the one that release ships), and last test/nomad, the one package that needs Nomad and
# the plugin images. A guest under TCG keeps QEMU at about one to one and
# a half of the two cores: most of a guest test's time is waiting (leases,
# retries, throttled streams), not CPU.
#
# The host lane, beside it at the idle CPU priority (SCHED_IDLE): first
# Nomad, the Prometheus server and the plugin images (hack/prepare.sh
# nomad prometheus images: on a fresh machine two long Go builds and a
# debootstrap, found in the cache on a warm one), then make check, make race (every host package's unit tests under
# the race detector), make simulation (the fault simulation's full
# seed counts, without the race detector) and make alerts (the alert
# rules' promtool tests). It runs on the CPU the guest leaves idle
# and yields the moment QEMU wants it. Measured on 2 cores
# (docs/testing.md, "Two lanes"): three guest tests took 146 s alone and
# 157 s beside the simulation, which meanwhile did three quarters of what
# it does alone. Two guests side by side, by contrast, slow each other to
# half speed, and a guest image's kernel module build beside a guest
# costs the guest as much as it gains: those stay before the lanes.
#
# test/nomad waits for the host lane's Nomad and images. The host lane's
# output is kept and printed once the guest lane ends, and what failed in
# either lane is summed up last (hack/failures.sh). Either lane failing
# fails the whole.
#
# Usage: hack/test.sh (make test sets VERSION, ARCHIVE_DIR,
# ZFS_NOMAD_IMAGES, GO_TEST_TIMEOUT and OUTSIDE_MAKE_TEST).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."

lanes=$(mktemp -d "${TMPDIR:-/tmp}/zfs-nomad-lanes.XXXXXX")
trap 'rm -rf "$lanes"' EXIT
host_log=$lanes/host.log
guest_log=$lanes/guest.log # the guest lane's go test output, for the failures' summary
tools_status=$lanes/tools.status # written once Nomad, Prometheus and the images are built

idle=(chrt -i 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
command -v ionice >/dev/null && idle+=(ionice -c 3)
began=$SECONDS
(
  "${idle[@]}" ./hack/prepare.sh nomad prometheus images
  echo $? >"$tools_status"
  "${idle[@]}" make --no-print-directory check race simulation alerts
  status=$?
  [ "$(cat "$tools_status")" = 0 ] || status=1
  echo "host lane: exit $status after $((SECONDS - began)) s"
  exit "$status"
) >"$host_log" 2>&1 &
host=$!

# The guest packages: those whose tests boot a guest, but test/bench (only
# benchmarks: go test would boot a guest to run nothing).
mapfile -t guest_packages < <(
  go list -f '{{.ImportPath}} {{join .TestImports " "}} {{join .XTestImports " "}}' ./... |
    awk '$0 ~ /internal\/testbed\/guesttest( |$)/ && $1 !~ /\/internal\/testbed\/guesttest$/ && $1 !~ /\/test\/bench$/ {print $1}'
)
[ "${#guest_packages[@]}" -gt 0 ] || { echo "hack/test.sh: no guest packages found" >&2; exit 1; }

nomad_package=$(go list ./test/nomad)
mapfile -t guest_packages < <(printf '%s\n' "${guest_packages[@]}" | grep -vxF "$nomad_package")
# One package at a time, so one guest at a time, each compiled with every
# core: go test -p 1 over the list would compile on one core, which on a
# fresh machine (Go's build cache empty) held each package's guest back.
go_test() { go test -count=1 -timeout "${GO_TEST_TIMEOUT:-45m}" -skip "${OUTSIDE_MAKE_TEST:-^$}" "$1" 2>&1 | tee -a "$guest_log"; }

guest_status=0
for package in "${guest_packages[@]}"; do
  go_test "$package" || guest_status=1
done
make --no-print-directory test-trixie-conformance 2>&1 | tee -a "$guest_log" || guest_status=1

waited=$SECONDS
until [ -s "$tools_status" ] || ! kill -0 "$host" 2>/dev/null; do sleep 5; done
[ $((SECONDS - waited)) -lt 5 ] || echo "guest lane: waited $((SECONDS - waited)) s for Nomad, Prometheus and the plugin images"
if [ "$(cat "$tools_status" 2>/dev/null)" = 0 ]; then
  nomad=$(./hack/nomad.sh) && prometheus=$(./hack/prometheus-server.sh) &&
    ZFS_NOMAD_NOMAD=$nomad ZFS_NOMAD_PROMETHEUS=$prometheus go_test "$nomad_package" || guest_status=1
else
  echo "guest lane: Nomad or the plugin images failed to build (the host lane's log below): test/nomad not run" >&2
  guest_status=1
fi
echo "guest lane: exit $guest_status after $((SECONDS - began)) s"

host_status=0
wait "$host" || host_status=1
echo "---- the host lane (Nomad and the plugin images, make check race simulation alerts) ----"
cat "$host_log"
# Last, so that the end of the output says what failed.
[ "$guest_status" -eq 0 ] || ./hack/failures.sh "$guest_log"
[ "$host_status" -eq 0 ] || ./hack/failures.sh "$host_log"
[ "$guest_status" -eq 0 ] && [ "$host_status" -eq 0 ]
