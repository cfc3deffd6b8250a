#!/usr/bin/env bash
# failures.sh LOG...: what failed in go test output, in a few lines.
#
# A failing guest test prints its nodes' logs after its failure, and
# make test prints the host lane's log after the guest lane's: a reader
# who sees only the end of a run's output (CI keeps its tail) would not
# see why. This prints, for each log, its FAIL and panic lines and the
# last lines the tests themselves logged (file_test.go:N:, where
# t.Fatalf's message is among them), each with at most three of its
# continuation lines; dumps of logs (messages starting with ----) are
# left out.
set -uo pipefail
for log in "$@"; do
  [ -s "$log" ] || continue
  awk -v name="$(basename "$log")" '
    function keep(i) { kept[i] = 1 }
    { line[NR] = $0 }
    /^[[:space:]]*--- FAIL|^FAIL[[:space:]]|^panic:/ { keep(NR) }
    /^ +[A-Za-z0-9_]+_test\.go:[0-9]+: / && $0 !~ /_test\.go:[0-9]+: ----/ { said[++n] = NR }
    END {
      for (j = (n > 8 ? n - 7 : 1); j <= n; j++) {
        keep(said[j])
        for (k = said[j] + 1; k <= said[j] + 3 && k <= NR && line[k] ~ /^        /; k++) keep(k)
      }
      shown = 0
      for (i = 1; i <= NR; i++) {
        if (!(i in kept)) continue
        if (!shown++) print "---- what failed, from " name " ----"
        print substr(line[i], 1, 400)
      }
    }' "$log"
done
