#!/usr/bin/env bash
# make test after make prepare: two lanes side by side.
#
# The guest lane, in the foreground: the packages whose tests boot a ZFS
# guest (their tests call guesttest.Main or guesttest.MainPhases), one
# guest at a time, then the shim build's libzfs tests and the Debian 13
# conformance. A guest under TCG keeps QEMU at about one to one and a half
# of the two cores: most of a guest test's time is waiting (leases,
# retries, throttled streams), not CPU.
#
# The host lane, beside it at the idle CPU priority (SCHED_IDLE): make
# check, make race and make unit (the host packages, the fault simulation
# among them). It runs on the CPU the guest leaves idle and yields the
# moment QEMU wants it. Measured on 2 cores (docs/testing.md, "Two
# lanes"): three guest tests took 146 s alone and 157 s beside the
# simulation, which meanwhile did three quarters of what it does alone.
# Two guests side by side, by contrast, slow each other to half speed.
#
# The host lane's output is kept and printed once the guest lane ends.
# Either lane failing fails the whole.
#
# Usage: hack/test.sh (make test sets ZFS_NOMAD_NOMAD, ZFS_NOMAD_IMAGES,
# GO_TEST_TIMEOUT and OUTSIDE_MAKE_TEST).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."

host_log=$(mktemp "${TMPDIR:-/tmp}/zfs-nomad-host-lane.XXXXXX")
trap 'rm -f "$host_log"' EXIT

idle=(chrt -i 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
began=$SECONDS
(
  "${idle[@]}" make --no-print-directory check race unit
  status=$?
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

guest_status=0
go test -p 1 -count=1 -timeout "${GO_TEST_TIMEOUT:-45m}" -skip "${OUTSIDE_MAKE_TEST:-^$}" "${guest_packages[@]}" || guest_status=1
go test -count=1 -tags openzfs_2_2 ./internal/node/zfs/libzfs || guest_status=1
make --no-print-directory test-trixie-conformance || guest_status=1
echo "guest lane: exit $guest_status after $((SECONDS - began)) s"

host_status=0
wait "$host" || host_status=1
echo "---- the host lane (make check race unit) ----"
cat "$host_log"
[ "$guest_status" -eq 0 ] && [ "$host_status" -eq 0 ]
