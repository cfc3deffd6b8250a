#!/usr/bin/env bash
# Runs the guest test packages and the demo N times, to flush out tests
# that fail at random, and keeps every run's log (make soak N=5).
#
#   hack/soak.sh N [PACKAGE ...]
#
# Without packages: every package whose tests run in the guest (those
# calling guesttest.Main), except the benchmarks; test/nomad only when
# ZFS_NOMAD_NOMAD names a Nomad binary (make soak sets it). Logs go to
# $SOAK_DIR (default ~/.cache/zfs-nomad/soak/<date>), one file per run and
# package, with the guest's share directory (console log) kept for a
# failed run. It ends with a table of passes per package and the plain
# line "P passed, F failed", and fails if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

n=${1:-5}
shift || true
case $n in '' | *[!0-9]*) echo "soak: N must be a number, not '$n'" >&2; exit 2 ;; esac

pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
  while read -r dir; do
    case $dir in
      ./test/bench) continue ;;
      ./test/nomad) [ -n "${ZFS_NOMAD_NOMAD:-}" ] || { echo "soak: ZFS_NOMAD_NOMAD unset: leaving out ./test/nomad" >&2; continue; } ;;
    esac
    pkgs+=("$dir")
  done < <(grep -rl --include='*_test.go' 'guesttest.Main' . | xargs -n1 dirname | sort -u)
fi

dir=${SOAK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zfs-nomad/soak/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
echo "soak: $n runs of ${pkgs[*]}; logs in $dir" >&2

declare -A passes
passed=0 failed=0
for i in $(seq 1 "$n"); do
  for pkg in "${pkgs[@]}"; do
    name=$(echo "${pkg#./}" | tr / -)
    log="$dir/run$i-$name.log"
    began=$(date +%s)
    if ZFS_NOMAD_GUEST_LOGS="$dir" go test -p 1 -count=1 -timeout 45m "$pkg" >"$log" 2>&1; then
      result=ok passed=$((passed + 1)) passes[$pkg]=$((${passes[$pkg]:-0} + 1))
    else
      result=FAIL failed=$((failed + 1))
    fi
    printf 'soak: run %d/%d %-26s %-4s %4ds  %s\n' "$i" "$n" "$pkg" "$result" $(($(date +%s) - began)) "$log" >&2
  done
done

echo
printf '%-26s %s\n' package passes
for pkg in "${pkgs[@]}"; do
  printf '%-26s %d/%d\n' "$pkg" "${passes[$pkg]:-0}" "$n"
done
echo "logs: $dir"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
